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

use crate::error::{CommError, PeerId, Result};
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub(crate) const HEADER_LEN: usize = 16;
const KIND_DATA: u32 = 0x4441_5441;
const KIND_ABORT: u32 = 0x4142_5254;
const MAX_ABORT_REASON: usize = 4096;
/// Longest single park in `poll`, so cancellation is noticed promptly.
const POLL_SLICE_MS: i32 = 50;

/// One TCP connection to a peer (non-blocking after the handshake).
pub(crate) struct Conn {
    pub stream: TcpStream,
    /// A frame has been partly written: an abort frame now would corrupt it.
    pub send_mid_frame: AtomicBool,
    /// A frame has been partly read: the next bytes are not a frame header.
    pub recv_mid_frame: AtomicBool,
    /// We already told the peer why we give up.
    abort_sent: AtomicBool,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            send_mid_frame: AtomicBool::new(false),
            recv_mid_frame: AtomicBool::new(false),
            abort_sent: AtomicBool::new(false),
        }
    }

    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Best effort: tell the peer why we give up, then close both directions.
    pub fn abort(&self, reason: &str) {
        self.send_abort(reason);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Best effort, once: tell the peer why we give up, keeping the connection open.
    pub fn send_abort(&self, reason: &str) {
        if self.abort_sent.swap(true, Ordering::AcqRel) {
            return;
        }
        if !self.send_mid_frame.load(Ordering::Acquire) {
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
        if self.recv_mid_frame.load(Ordering::Acquire) {
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
    conn: &'a Conn,
    peer: usize,
    header: [u8; HEADER_LEN],
    data: &'a [u8],
    done: usize,
}

impl<'a> SendJob<'a> {
    pub fn new(conn: &'a Conn, peer: usize, data: &'a [u8]) -> SendJob<'a> {
        SendJob { conn, peer, header: header(KIND_DATA, data.len()), data, done: 0 }
    }

    fn total(&self) -> usize {
        HEADER_LEN + self.data.len()
    }

    fn complete(&self) -> bool {
        self.done == self.total()
    }
}

/// An incoming frame in progress.
pub(crate) struct RecvJob<'a> {
    conn: &'a Conn,
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
pub(crate) struct PumpCtx<'a> {
    pub peers: &'a [PeerId],
    /// Error out when no byte moved for this long.
    pub op_timeout: Option<Duration>,
    /// Busy-poll this long without progress before parking in `poll`.
    pub spin: Duration,
    /// Set by a sibling thread that failed; we stop with `Cancelled`.
    pub cancel: &'a AtomicBool,
}

/// Returned by a pump stopped because a sibling failed; never shown to users.
pub(crate) fn cancelled() -> CommError {
    CommError::invalid("cancelled")
}

enum Step {
    Progress,
    Blocked,
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
            _ => Err(io_failure(peer, &err, "sending")),
        };
    }
    job.done += n as usize;
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
    // SAFETY: the iovecs point into writable buffers borrowed for this call.
    let n = unsafe { libc::readv(job.conn.fd(), iov.as_ptr(), n_iov as i32) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Step::Blocked),
            _ => Err(io_failure(peer, &err, "receiving")),
        };
    }
    if n == 0 {
        return Err(peer.lost("it closed the connection"));
    }
    job.done += n as usize;
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
            let peer = &ctx.peers[sends[i].peer];
            if let Step::Progress = try_send(&mut sends[i], peer)? {
                progress = true;
            }
        }
        for i in 0..recvs.len() {
            let fd = recvs[i].conn.fd();
            if recvs[i].complete() || recvs[..i].iter().any(|j| !j.complete() && j.conn.fd() == fd) {
                pending |= !recvs[i].complete();
                continue;
            }
            pending = true;
            let peer = &ctx.peers[recvs[i].peer];
            // Keep reading while data flows: one wake-up can drain many frames.
            while !recvs[i].complete() {
                match try_recv(&mut recvs[i], peer, ctx.spin)? {
                    Step::Progress => progress = true,
                    Step::Blocked => break,
                }
            }
        }
        if !pending {
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
        polls.clear();
        for s in sends.iter().filter(|s| !s.complete()) {
            polls.push(libc::pollfd { fd: s.conn.fd(), events: libc::POLLOUT, revents: 0 });
        }
        for r in recvs.iter().filter(|r| !r.complete()) {
            polls.push(libc::pollfd { fd: r.conn.fd(), events: libc::POLLIN, revents: 0 });
        }
        // SAFETY: `polls` is a valid array of pollfd for the duration of the call.
        unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, POLL_SLICE_MS) };
    }
}

fn timeout_error(sends: &[SendJob<'_>], recvs: &[RecvJob<'_>], ctx: &PumpCtx<'_>, idle: Duration) -> CommError {
    if let Some(r) = recvs.iter().find(|r| !r.complete()) {
        return ctx.peers[r.peer].timeout(idle, "waiting for a message");
    }
    let s = sends.iter().find(|s| !s.complete()).expect("a pending job");
    ctx.peers[s.peer].timeout(idle, "waiting for it to accept our message")
}
