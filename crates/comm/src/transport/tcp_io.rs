//! The TCP progress engine: frames, and a poll loop that drives any number of
//! sends and receives on non-blocking sockets at once.
//!
//! A frame is a 16-byte header (kind, reserved, length) and the payload. A
//! `DATA` frame carries a message; an `ABORT` frame carries the one-line reason
//! a peer gave up, so the ranks behind it learn which rank actually failed.
//! Sends go out with one `sendmsg` (header and payload as two iovecs) and
//! receives come in with one `readv`, so a small message costs one system call
//! on each side. The loop spins for a short while before parking in `poll`,
//! which keeps small-message latency low without burning a core when idle.
//!
//! Each connection counts the bytes it wrote and read, and keeps the tail of
//! what it wrote that the peer's kernel may not have acknowledged. When a
//! connection fails the way a lost cable makes it fail (time-outs, no route),
//! the pump asks its [`Resumer`] for a new connection to the same peer over
//! another cable and carries on: see [`super::tcp_resume`].

use super::tcp_resume::{keep_unacknowledged, resume, resume_idle};
use crate::error::{CommError, PeerId, Result};
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub(crate) const HEADER_LEN: usize = 16;
const KIND_DATA: u32 = 0x4441_5441;
const KIND_ABORT: u32 = 0x4142_5254;
const MAX_ABORT_REASON: usize = 4096;
/// Longest single park in `poll`, so cancellation is noticed promptly.
const POLL_SLICE_MS: i32 = 50;

/// One TCP connection to a peer (non-blocking after the handshake).
pub(crate) struct Conn {
    /// The socket in use.
    fd: AtomicI32,
    /// Every socket this connection used; the last is in use. Replaced ones
    /// stay open until drop, so their numbers are not reused under a racing abort.
    streams: Mutex<Vec<TcpStream>>,
    /// Rank of the peer, and index of this connection among those to it.
    pub peer: usize,
    pub index: usize,
    /// `local -> remote` of the socket in use, for messages.
    pub ends: Mutex<String>,
    /// A frame has been partly written: an abort frame now would corrupt it.
    pub send_mid_frame: AtomicBool,
    /// A frame has been partly read: the next bytes are not a frame header.
    pub recv_mid_frame: AtomicBool,
    /// We already told the peer why we give up.
    abort_sent: AtomicBool,
    /// Failed in a way that is not a lost cable while idle: stop watching it.
    pub watch_off: AtomicBool,
    /// Bytes of frames written to / taken from this connection's stream.
    pub tx: AtomicU64,
    pub rx: AtomicU64,
    /// What a resumed connection must do first: replay what the peer lost,
    /// and hand out what was read from the replaced socket but not yet taken.
    pub pending: Mutex<Pending>,
    pub replaying: AtomicBool,
    pub stashed: AtomicBool,
    /// The tail of our stream the peer may not have: `(offset of its first byte, bytes)`,
    /// ending at `tx` as of the end of the last exchange that wrote here.
    pub kept: Mutex<(u64, Vec<u8>)>,
}

fn ends(s: &TcpStream) -> String {
    match (s.local_addr(), s.peer_addr()) {
        (Ok(l), Ok(r)) => format!("{l} -> {r}"),
        _ => "?".into(),
    }
}

/// See [`Conn::pending`].
#[derive(Default)]
pub(crate) struct Pending {
    pub replay: Vec<u8>,
    pub replay_at: usize,
    pub stash: Vec<u8>,
    pub stash_at: usize,
}

impl Conn {
    pub fn new(stream: TcpStream, peer: usize, index: usize) -> Conn {
        let ends = Mutex::new(ends(&stream));
        Conn {
            fd: AtomicI32::new(stream.as_raw_fd()),
            streams: Mutex::new(vec![stream]),
            ends,
            peer,
            index,
            send_mid_frame: AtomicBool::new(false),
            recv_mid_frame: AtomicBool::new(false),
            abort_sent: AtomicBool::new(false),
            watch_off: AtomicBool::new(false),
            tx: AtomicU64::new(0),
            rx: AtomicU64::new(0),
            pending: Mutex::new(Pending::default()),
            replaying: AtomicBool::new(false),
            stashed: AtomicBool::new(false),
            kept: Mutex::new((0, Vec::new())),
        }
    }

    pub fn fd(&self) -> RawFd {
        self.fd.load(Ordering::Acquire)
    }

    /// The socket in use (and the ones it replaced).
    pub fn streams(&self) -> MutexGuard<'_, Vec<TcpStream>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `stream` in use, with what it must do first.
    pub fn replace(&self, stream: TcpStream, pending: Pending) {
        let fd = stream.as_raw_fd();
        *self.ends.lock().unwrap_or_else(|e| e.into_inner()) = ends(&stream);
        let mut streams = self.streams();
        if let Some(old) = streams.last() {
            let _ = old.shutdown(std::net::Shutdown::Both);
        }
        streams.push(stream);
        self.replaying.store(pending.replay_at < pending.replay.len(), Ordering::Release);
        self.stashed.store(pending.stash_at < pending.stash.len(), Ordering::Release);
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = pending;
        self.fd.store(fd, Ordering::Release);
    }

    /// Closes both directions of the socket in use.
    pub fn shutdown(&self) {
        if let Some(s) = self.streams().last() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Best effort: tell the peer why we give up, then close both directions.
    pub fn abort(&self, reason: &str) {
        self.send_abort(reason);
        self.shutdown();
    }

    /// Best effort, once: tell the peer why we give up, keeping the connection open.
    pub fn send_abort(&self, reason: &str) {
        if self.abort_sent.swap(true, Ordering::AcqRel) {
            return;
        }
        if !self.send_mid_frame.load(Ordering::Acquire) && !self.replaying.load(Ordering::Acquire) {
            let reason = &reason.as_bytes()[..reason.len().min(MAX_ABORT_REASON)];
            let mut frame = header(KIND_ABORT, reason.len()).to_vec();
            frame.extend_from_slice(reason);
            // SAFETY: the pointer and length describe `frame`, which outlives the call.
            unsafe {
                libc::send(self.fd(), frame.as_ptr().cast(), frame.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT);
            }
        }
    }

    /// Waits up to `grace` for an abort frame from the peer and returns its
    /// reason. `None` when the peer stays silent, sends anything else, or the
    /// stream is mid-frame (its next bytes are not a header).
    pub fn await_abort(&self, grace: Duration) -> Option<String> {
        if self.recv_mid_frame.load(Ordering::Acquire) || self.stashed.load(Ordering::Acquire) {
            return None;
        }
        let deadline = Instant::now() + grace;
        let mut head = [0u8; HEADER_LEN];
        read_until(self.fd(), &mut head, deadline)?;
        let kind = u32::from_le_bytes(head[..4].try_into().unwrap());
        let len = u64::from_le_bytes(head[8..].try_into().unwrap()) as usize;
        if kind != KIND_ABORT || len > MAX_ABORT_REASON {
            return None;
        }
        let mut reason = vec![0u8; len];
        read_until(self.fd(), &mut reason, deadline.max(Instant::now() + Duration::from_millis(200)))?;
        Some(String::from_utf8_lossy(&reason).into_owned())
    }
}

/// Fills `buf` from a non-blocking socket, parking in `poll`, until `deadline`.
fn read_until(fd: RawFd, buf: &mut [u8], deadline: Instant) -> Option<()> {
    let mut at = 0;
    while at < buf.len() {
        let left = deadline.checked_duration_since(Instant::now())?;
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = left.as_millis().clamp(1, POLL_SLICE_MS as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        // SAFETY: reading into the unfilled tail of `buf`.
        let n = unsafe { libc::recv(fd, buf[at..].as_mut_ptr().cast(), buf.len() - at, libc::MSG_DONTWAIT) };
        match n {
            0 => return None,
            n if n > 0 => at += n as usize,
            _ => {
                let err = io::Error::last_os_error();
                if !matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) {
                    return None;
                }
            }
        }
    }
    Some(())
}

fn header(kind: u32, len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&kind.to_le_bytes());
    h[8..].copy_from_slice(&(len as u64).to_le_bytes());
    h
}

/// An outgoing frame in progress.
pub(crate) struct SendJob<'a> {
    pub conn: &'a Conn,
    peer: usize,
    pub header: [u8; HEADER_LEN],
    pub data: &'a [u8],
    pub done: usize,
}

impl<'a> SendJob<'a> {
    pub fn new(conn: &'a Conn, peer: usize, data: &'a [u8]) -> SendJob<'a> {
        SendJob { conn, peer, header: header(KIND_DATA, data.len()), data, done: 0 }
    }

    pub fn total(&self) -> usize {
        HEADER_LEN + self.data.len()
    }

    pub fn complete(&self) -> bool {
        self.done == self.total()
    }

    /// Appends bytes `from..to` of the frame (header, then data) to `out`.
    pub fn frame(&self, from: usize, to: usize, out: &mut Vec<u8>) {
        if from < HEADER_LEN {
            out.extend_from_slice(&self.header[from..to.min(HEADER_LEN)]);
        }
        if to > HEADER_LEN {
            out.extend_from_slice(&self.data[from.max(HEADER_LEN) - HEADER_LEN..to - HEADER_LEN]);
        }
    }
}

/// An incoming frame in progress.
pub(crate) struct RecvJob<'a> {
    pub conn: &'a Conn,
    peer: usize,
    header: [u8; HEADER_LEN],
    buf: &'a mut [u8],
    done: usize,
    checked: bool,
}

impl<'a> RecvJob<'a> {
    pub fn new(conn: &'a Conn, peer: usize, buf: &'a mut [u8]) -> RecvJob<'a> {
        RecvJob { conn, peer, header: [0; HEADER_LEN], buf, done: 0, checked: false }
    }

    fn total(&self) -> usize {
        HEADER_LEN + self.buf.len()
    }

    fn complete(&self) -> bool {
        self.done == self.total()
    }
}

/// Everything the loop needs besides the jobs.
#[derive(Clone, Copy)]
pub(crate) struct PumpCtx<'a> {
    pub peers: &'a [PeerId],
    /// Error out when no byte moved for this long.
    pub op_timeout: Option<Duration>,
    /// Busy-poll this long without progress before parking in `poll`.
    pub spin: Duration,
    /// Set by a sibling thread that failed; we stop with `Cancelled`.
    pub cancel: &'a AtomicBool,
    /// Replaces a connection lost with its cable (`None`: such a loss is fatal).
    pub resumer: Option<&'a dyn Resumer>,
    /// Connections no job of this exchange uses, which this pump watches
    /// while it waits: one that loses its cable, or whose peer connects again
    /// to continue one, is resumed at once (the peer may be waiting for it).
    pub idle: &'a [&'a Conn],
    /// Fails the wait when a peer's heartbeats stopped (`None`: no beacon).
    pub beacon: Option<&'a super::tcp_beacon::Beacon>,
}

/// Finds a new socket for a connection whose cable was lost.
pub(crate) trait Resumer: Sync {
    /// A connected, authenticated, blocking socket to `conn`'s peer that
    /// continues connection `conn.index`, or why there is none.
    fn reconnect(&self, conn: &Conn, why: &str) -> Result<TcpStream>;
    /// Makes a new socket ready for the pump (non-blocking, keep-alive, ...).
    fn tune(&self, stream: &TcpStream) -> io::Result<()>;
    /// The listener peers connect to again, if we accept such connections.
    fn listen_fd(&self) -> Option<RawFd>;
    /// Takes one waiting connection from the listener, if any, and keeps it
    /// for [`Resumer::reconnect`]; returns the (peer, connection index) it continues.
    fn accept_one(&self) -> Option<(usize, usize)>;
}

/// Returned by a pump stopped because a sibling failed; never shown to users.
pub(crate) fn cancelled() -> CommError {
    CommError::invalid("cancelled")
}

enum Step {
    Progress,
    Blocked,
    /// The connection failed the way a lost cable makes it fail.
    Down(String),
}

/// Errors a lost cable (rather than a dead peer) produces.
fn cable_lost(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::ENETDOWN | libc::EHOSTDOWN)
    )
}

fn io_failure(peer: &PeerId, err: &io::Error, doing: &str) -> CommError {
    match err.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionAborted => {
            peer.lost(format!("connection reset while {doing}"))
        }
        _ => peer.lost(format!("{err} while {doing}")),
    }
}

fn try_send(job: &mut SendJob<'_>, peer: &PeerId) -> Result<Step> {
    if job.conn.replaying.load(Ordering::Acquire) {
        return flush_replay(job.conn);
    }
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2];
    let mut n_iov = 0;
    if job.done < HEADER_LEN {
        iov[0] = libc::iovec { iov_base: job.header[job.done..].as_ptr() as *mut _, iov_len: HEADER_LEN - job.done };
        n_iov = 1;
    }
    let data_done = job.done.saturating_sub(HEADER_LEN);
    if data_done < job.data.len() {
        iov[n_iov] =
            libc::iovec { iov_base: job.data[data_done..].as_ptr() as *mut _, iov_len: job.data.len() - data_done };
        n_iov += 1;
    }
    // SAFETY: a zeroed msghdr is valid; the iovecs point into buffers borrowed for this call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n_iov as _;
    // SAFETY: `msg` describes valid readable memory; the fd is owned by `job.conn`.
    let n = unsafe { libc::sendmsg(job.conn.fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Step::Blocked),
            _ if cable_lost(&err) => Ok(Step::Down(format!("{err} while sending"))),
            _ => Err(io_failure(peer, &err, "sending")),
        };
    }
    job.done += n as usize;
    job.conn.tx.fetch_add(n as u64, Ordering::Relaxed);
    job.conn.send_mid_frame.store(!job.complete(), Ordering::Release);
    Ok(if n > 0 { Step::Progress } else { Step::Blocked })
}

fn try_recv(job: &mut RecvJob<'_>, peer: &PeerId, spin: Duration) -> Result<Step> {
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2];
    let mut n_iov = 0;
    if job.done < HEADER_LEN {
        iov[0] = libc::iovec { iov_base: job.header[job.done..].as_mut_ptr().cast(), iov_len: HEADER_LEN - job.done };
        n_iov = 1;
    }
    let data_done = job.done.saturating_sub(HEADER_LEN);
    if data_done < job.buf.len() {
        iov[n_iov] =
            libc::iovec { iov_base: job.buf[data_done..].as_mut_ptr().cast(), iov_len: job.buf.len() - data_done };
        n_iov += 1;
    }
    let n = if job.conn.stashed.load(Ordering::Acquire) {
        from_stash(job.conn, &iov[..n_iov]) as isize
    } else {
        // SAFETY: the iovecs point into writable buffers borrowed for this call.
        unsafe { libc::readv(job.conn.fd(), iov.as_ptr(), n_iov as i32) }
    };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Step::Blocked),
            _ if cable_lost(&err) => Ok(Step::Down(format!("{err} while receiving"))),
            _ => Err(io_failure(peer, &err, "receiving")),
        };
    }
    if n == 0 {
        return Err(peer.lost("it closed the connection"));
    }
    job.done += n as usize;
    job.conn.rx.fetch_add(n as u64, Ordering::Relaxed);
    job.conn.recv_mid_frame.store(!job.complete(), Ordering::Release);
    if !job.checked && job.done >= HEADER_LEN {
        job.checked = true;
        let kind = u32::from_le_bytes(job.header[..4].try_into().unwrap());
        let len = u64::from_le_bytes(job.header[8..].try_into().unwrap()) as usize;
        match kind {
            KIND_DATA if len == job.buf.len() => {}
            KIND_DATA => {
                return Err(peer.protocol(format!(
                    "it sent a message of {len} bytes where {} were expected (were collectives called in a different order?)",
                    job.buf.len()
                )))
            }
            KIND_ABORT => return Err(read_abort(job, len.min(MAX_ABORT_REASON), peer, spin)),
            other => return Err(peer.protocol(format!("unknown frame kind {other:#x}"))),
        }
    }
    Ok(Step::Progress)
}

/// Writes what a resumed connection must replay before anything else.
fn flush_replay(conn: &Conn) -> Result<Step> {
    let mut p = conn.pending.lock().unwrap_or_else(|e| e.into_inner());
    if p.replay_at == p.replay.len() {
        conn.replaying.store(false, Ordering::Release);
        return Ok(Step::Progress);
    }
    let rest = &p.replay[p.replay_at..];
    // SAFETY: the pointer and length describe `rest`, borrowed for the call.
    let n = unsafe { libc::send(conn.fd(), rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Step::Blocked),
            _ => Ok(Step::Down(format!("{err} while replaying"))),
        };
    }
    p.replay_at += n as usize;
    if p.replay_at == p.replay.len() {
        p.replay = Vec::new();
        p.replay_at = 0;
        conn.replaying.store(false, Ordering::Release);
    }
    Ok(Step::Progress)
}

/// Fills `iov` from what a replaced socket still held; returns the bytes given.
fn from_stash(conn: &Conn, iov: &[libc::iovec]) -> usize {
    let mut p = conn.pending.lock().unwrap_or_else(|e| e.into_inner());
    let mut given = 0;
    for v in iov {
        let n = v.iov_len.min(p.stash.len() - p.stash_at);
        // SAFETY: `iov_base` points to `iov_len` writable bytes borrowed by the caller.
        unsafe { std::ptr::copy_nonoverlapping(p.stash[p.stash_at..].as_ptr(), v.iov_base.cast::<u8>(), n) };
        p.stash_at += n;
        given += n;
        if n < v.iov_len {
            break;
        }
    }
    if p.stash_at == p.stash.len() {
        p.stash = Vec::new();
        p.stash_at = 0;
        conn.stashed.store(false, Ordering::Release);
    }
    given
}

/// Collects the reason of an abort frame whose header was just read.
fn read_abort(job: &mut RecvJob<'_>, len: usize, peer: &PeerId, spin: Duration) -> CommError {
    let got = (job.done - HEADER_LEN).min(len);
    let mut reason = job.buf[..got].to_vec();
    reason.resize(len, 0);
    let deadline = Instant::now() + Duration::from_millis(500) + spin;
    let mut at = got;
    while at < len && Instant::now() < deadline {
        // SAFETY: reading into the unfilled tail of `reason`.
        let n = unsafe { libc::recv(job.conn.fd(), reason[at..].as_mut_ptr().cast(), len - at, 0) };
        match n {
            0 => break,
            n if n > 0 => at += n as usize,
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    reason.truncate(at);
    peer.aborted(String::from_utf8_lossy(&reason).into_owned())
}

/// Drives all jobs to completion. Jobs on the same connection and direction
/// run in the order given; everything else proceeds concurrently.
pub(crate) fn pump(sends: &mut [SendJob<'_>], recvs: &mut [RecvJob<'_>], ctx: &PumpCtx<'_>) -> Result<()> {
    let mut last_progress = Instant::now();
    let mut polls: Vec<libc::pollfd> = Vec::new();
    loop {
        let mut progress = false;
        let mut pending = false;
        for i in 0..sends.len() {
            let fd = sends[i].conn.fd();
            if sends[i].complete() || sends[..i].iter().any(|j| !j.complete() && j.conn.fd() == fd) {
                pending |= !sends[i].complete();
                continue;
            }
            pending = true;
            let (peer, conn) = (&ctx.peers[sends[i].peer], sends[i].conn);
            match try_send(&mut sends[i], peer)? {
                Step::Progress => progress = true,
                Step::Blocked => {}
                Step::Down(why) => {
                    resume(conn, &why, sends, ctx)?;
                    progress = true;
                }
            }
        }
        for i in 0..recvs.len() {
            let fd = recvs[i].conn.fd();
            if recvs[i].complete() || recvs[..i].iter().any(|j| !j.complete() && j.conn.fd() == fd) {
                pending |= !recvs[i].complete();
                continue;
            }
            pending = true;
            let (peer, conn) = (&ctx.peers[recvs[i].peer], recvs[i].conn);
            // Keep reading while data flows: one wake-up can drain many frames.
            while !recvs[i].complete() {
                match try_recv(&mut recvs[i], peer, ctx.spin)? {
                    Step::Progress => progress = true,
                    Step::Blocked => break,
                    Step::Down(why) => {
                        resume(conn, &why, sends, ctx)?;
                        progress = true;
                        break;
                    }
                }
            }
        }
        // A resumed connection replays what the peer lost even when this
        // exchange sends nothing on it: the peer may be waiting for it.
        for conn in recvs.iter().map(|r| r.conn).chain(sends.iter().map(|s| s.conn)) {
            if conn.replaying.load(Ordering::Acquire) {
                pending = true;
                match flush_replay(conn)? {
                    Step::Progress => progress = true,
                    Step::Blocked => {}
                    Step::Down(why) => {
                        resume(conn, &why, sends, ctx)?;
                        progress = true;
                    }
                }
            }
        }
        if !pending {
            keep_unacknowledged(sends);
            return Ok(());
        }
        if ctx.cancel.load(Ordering::Relaxed) {
            return Err(cancelled());
        }
        let now = Instant::now();
        if progress {
            last_progress = now;
            continue;
        }
        let idle = now - last_progress;
        if idle < ctx.spin {
            // After a short busy poll, yield between polls: on an oversubscribed
            // host the peer (or the kernel work delivering its data) needs the core.
            if idle < Duration::from_micros(5) {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            continue;
        }
        if let Some(limit) = ctx.op_timeout {
            if idle >= limit {
                return Err(timeout_error(sends, recvs, ctx, idle));
            }
        }
        if let Some(hung) = ctx.beacon.and_then(|b| b.hung(ctx.peers)) {
            return Err(hung);
        }
        polls.clear();
        for s in sends.iter().filter(|s| !s.complete()) {
            polls.push(libc::pollfd { fd: s.conn.fd(), events: libc::POLLOUT, revents: 0 });
        }
        for r in recvs.iter().filter(|r| !r.complete()) {
            polls.push(libc::pollfd { fd: r.conn.fd(), events: libc::POLLIN, revents: 0 });
        }
        for r in recvs.iter().filter(|r| r.conn.replaying.load(Ordering::Acquire)) {
            polls.push(libc::pollfd { fd: r.conn.fd(), events: libc::POLLOUT, revents: 0 });
        }
        let watched = polls.len();
        let resumer = ctx.resumer.filter(|_| !ctx.idle.is_empty());
        if resumer.is_some() {
            for c in ctx.idle.iter().filter(|c| !c.watch_off.load(Ordering::Acquire)) {
                // Errors and hang-ups are always reported.
                polls.push(libc::pollfd { fd: c.fd(), events: 0, revents: 0 });
            }
            if let Some(fd) = resumer.and_then(|r| r.listen_fd()) {
                polls.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
            }
        }
        // SAFETY: `polls` is a valid array of pollfd for the duration of the call.
        unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, POLL_SLICE_MS) };
        if let Some(r) = resumer {
            if polls[watched..].iter().any(|p| p.revents != 0) {
                watch_idle(r, ctx)?;
            }
        }
    }
}

/// Resumes idle connections that lost their cable, or whose peer connected
/// again to continue them.
fn watch_idle(r: &dyn Resumer, ctx: &PumpCtx<'_>) -> Result<()> {
    for c in ctx.idle.iter().filter(|c| !c.watch_off.load(Ordering::Acquire)) {
        let mut pfd = libc::pollfd { fd: c.fd(), events: 0, revents: 0 };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 0) } <= 0 {
            continue;
        }
        let err = c.streams().last().and_then(|s| s.take_error().ok().flatten());
        match err {
            Some(e) if cable_lost(&e) => resume_idle(c, &format!("{e} while idle"), ctx)?,
            _ => c.watch_off.store(true, Ordering::Release),
        }
    }
    while let Some((peer, index)) = r.accept_one() {
        if let Some(c) = ctx.idle.iter().find(|c| (c.peer, c.index) == (peer, index)) {
            resume_idle(c, "its peer connected again to continue it", ctx)?;
        }
    }
    Ok(())
}

fn timeout_error(sends: &[SendJob<'_>], recvs: &[RecvJob<'_>], ctx: &PumpCtx<'_>, idle: Duration) -> CommError {
    if let Some(r) = recvs.iter().find(|r| !r.complete()) {
        return ctx.peers[r.peer].timeout(idle, "waiting for a message");
    }
    let s = sends.iter().find(|s| !s.complete()).expect("a pending job");
    ctx.peers[s.peer].timeout(idle, "waiting for it to accept our message")
}
