//! Surviving a lost cable: a connection whose cable fails is continued over a
//! new TCP connection on another cable, without losing or repeating a byte.
//!
//! Every connection is a byte stream of frames in each direction, and each
//! side counts what it wrote (`tx`) and what it took (`rx`). A lost cable
//! shows as a time-out (keep-alive or unacknowledged data, a few seconds) or
//! "no route" on its sockets; the pump then calls [`resume`]:
//!
//! 1. the [`Resumer`] finds a new, authenticated socket to the same peer over
//!    another cable: the higher rank dials (the other cables' addresses first),
//!    the lower rank accepts on its listener, and the handshake names the
//!    connection it continues;
//! 2. what the old socket still holds is taken out (the kernel acknowledged
//!    it, so the peer will not send it again) and handed out first;
//! 3. both sides send how much of the other's stream they have, and each
//!    replays the rest: from the tail it kept of earlier exchanges (the bytes
//!    the kernel had not seen acknowledged when the exchange ended, see
//!    [`keep_unacknowledged`]) and from the jobs of the exchange in progress;
//! 4. the pump carries on with the same jobs on the new socket.
//!
//! A peer that died closes or resets its sockets instead, which stays an
//! error naming it, as before. The plan (stripe shares, which connection
//! carries small messages) does not change: the resumed connection and the
//! one already on that cable now share it.

use super::tcp::{run_handshake, tune_socket, TcpConfig, TcpInner};
use super::tcp_cables::{dial_route, route};
use super::tcp_io::{Conn, Pending, PumpCtx, Resumer, SendJob};
use crate::error::{CommError, PeerId, Result};
use crate::handshake::{CONN_ANY, FLAG_RESUME};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Continues `conn` over a new socket; see the module documentation.
pub(crate) fn resume(conn: &Conn, why: &str, sends: &[SendJob<'_>], ctx: &PumpCtx<'_>) -> Result<()> {
    let peer = &ctx.peers[conn.peer];
    let Some(resumer) = ctx.resumer else {
        return Err(peer.lost(why.to_string()));
    };
    let mut stream = resumer.reconnect(conn, why)?;
    let fail = |e: std::io::Error| peer.lost(format!("{e} while resuming connection {} ({why})", conn.index));
    // What the old socket still holds (and what an earlier resume left unread).
    let mut stash = {
        let mut p = conn.pending.lock().unwrap_or_else(|e| e.into_inner());
        let at = p.stash_at;
        p.stash.split_off(at)
    };
    drain(conn.fd(), &mut stash);
    let have = conn.rx.load(Ordering::Acquire) + stash.len() as u64;
    stream.write_all(&have.to_le_bytes()).map_err(fail)?;
    let mut theirs = [0u8; 8];
    stream.read_exact(&mut theirs).map_err(fail)?;
    let replay = lost_bytes(conn, u64::from_le_bytes(theirs), sends)
        .map_err(|d| peer.lost(format!("cannot resume connection {} ({why}): {d}", conn.index)))?;
    resumer.tune(&stream).map_err(fail)?;
    conn.replace(stream, Pending { replay, replay_at: 0, stash, stash_at: 0 });
    Ok(())
}

/// [`resume`] for a connection no job of this exchange uses; its replay is
/// written before returning, as no job will write it.
pub(crate) fn resume_idle(conn: &Conn, why: &str, ctx: &PumpCtx<'_>) -> Result<()> {
    resume(conn, why, &[], ctx)?;
    let peer = &ctx.peers[conn.peer];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut p = conn.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.replay_at == p.replay.len() {
            p.replay = Vec::new();
            p.replay_at = 0;
            conn.replaying.store(false, Ordering::Release);
            return Ok(());
        }
        let rest = &p.replay[p.replay_at..];
        // SAFETY: the pointer and length describe `rest`, borrowed for the call.
        let n =
            unsafe { libc::send(conn.fd(), rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n > 0 {
            p.replay_at += n as usize;
            continue;
        }
        let err = std::io::Error::last_os_error();
        if n < 0 && !matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) {
            return Err(peer.lost(format!("{err} while replaying on resumed connection {}", conn.index)));
        }
        drop(p);
        if std::time::Instant::now() >= deadline {
            return Err(peer.timeout(std::time::Duration::from_secs(10), "replaying on a resumed connection"));
        }
        let mut pfd = libc::pollfd { fd: conn.fd(), events: libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 50) };
    }
}

/// Appends whatever `fd` still has to read, without waiting.
fn drain(fd: i32, out: &mut Vec<u8>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // SAFETY: reading into `buf`, owned here.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n <= 0 {
            return;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
}

/// Our stream on `conn` from offset `from` to what we wrote so far: the kept
/// tail of earlier exchanges, then the jobs of this one on `conn`.
fn lost_bytes(conn: &Conn, from: u64, sends: &[SendJob<'_>]) -> std::result::Result<Vec<u8>, String> {
    let tx = conn.tx.load(Ordering::Acquire);
    let kept = conn.kept.lock().unwrap_or_else(|e| e.into_inner());
    let (start, tail) = (&kept.0, &kept.1);
    let t0 = start + tail.len() as u64;
    let mine = || sends.iter().filter(|j| std::ptr::eq(j.conn, conn));
    let written: u64 = mine().map(|j| j.done as u64).sum();
    if t0 + written != tx {
        return Err(format!("{tx} bytes written, {} accounted for", t0 + written));
    }
    if from > tx {
        return Err(format!("the peer has {from} bytes of our stream, we wrote {tx}"));
    }
    if from < *start {
        return Err(format!("the peer has {from} bytes of our stream, we kept only those from {start} on"));
    }
    let mut out = Vec::with_capacity((tx - from) as usize);
    if from < t0 {
        out.extend_from_slice(&tail[(from - start) as usize..]);
    }
    let mut at = t0;
    for j in mine() {
        let end = at + j.done as u64;
        if end > from {
            j.frame(from.saturating_sub(at) as usize, j.done, &mut out);
        }
        at = end;
    }
    Ok(out)
}

/// After an exchange: keeps, for every connection it wrote to, the tail of
/// the stream the peer's kernel has not acknowledged yet (what a lost cable
/// could lose). Usually nothing or the last message.
pub(crate) fn keep_unacknowledged(sends: &[SendJob<'_>]) {
    for (i, j) in sends.iter().enumerate() {
        let conn = j.conn;
        if sends[..i].iter().any(|o| std::ptr::eq(o.conn, conn)) {
            continue;
        }
        let tx = conn.tx.load(Ordering::Acquire);
        let unacked = unacknowledged(conn).min(tx);
        let mut kept = conn.kept.lock().unwrap_or_else(|e| e.into_inner());
        let new_start = tx - unacked;
        let t0 = kept.0 + kept.1.len() as u64;
        let mut tail = Vec::new();
        if new_start < t0 {
            let from = new_start.max(kept.0);
            tail.extend_from_slice(&kept.1[(from - kept.0) as usize..]);
        }
        let mut at = t0;
        for o in sends[i..].iter().filter(|o| std::ptr::eq(o.conn, conn)) {
            let end = at + o.done as u64;
            if end > new_start {
                o.frame(new_start.saturating_sub(at) as usize, o.done, &mut tail);
            }
            at = end;
        }
        *kept = (tx - tail.len() as u64, tail);
    }
}

/// Bytes written to `conn` that the peer has not acknowledged (Linux:
/// `SIOCOUTQ`; elsewhere the send buffer's size, which bounds it).
fn unacknowledged(conn: &Conn) -> u64 {
    let fd = conn.streams().last().map_or(-1, |s| s.as_raw_fd());
    let mut n: libc::c_int = 0;
    #[cfg(target_os = "linux")]
    {
        // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one c_int.
        if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) } == 0 {
            return n.max(0) as u64;
        }
    }
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_SNDBUF writes one c_int of length `len`.
    let rc = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&raw mut n).cast(), &mut len) };
    if rc == 0 {
        n.max(0) as u64
    } else {
        u64::MAX
    }
}

impl Resumer for TcpInner {
    fn reconnect(&self, conn: &Conn, why: &str) -> Result<TcpStream> {
        let (p, k) = (conn.peer, conn.index);
        let peer = &self.peers[p];
        let n = self.links[p].len();
        let ends = conn.ends.lock().unwrap_or_else(|e| e.into_inner()).clone();
        eprintln!(
            "shardlm-comm: rank {}: connection {k} ({ends}) to peer {p} at {} lost its cable ({why}); continuing it over {}",
            self.rank,
            peer.addr,
            if n > 1 { "another cable" } else { "a new connection" }
        );
        let deadline = Instant::now() + self.cfg.resume_timeout;
        let gave_up = |detail: String| {
            peer.lost(format!(
                "connection {k} lost its cable ({why}) and could not continue within {:.1}s: {detail}",
                self.cfg.resume_timeout.as_secs_f64()
            ))
        };
        if self.rank > p {
            // Dial: the other cables first, then this one.
            let mut last = String::from("no attempt");
            while Instant::now() < deadline {
                for other in (1..=n).map(|d| (k + d) % n) {
                    let to = route(&self.cfg.links, self.rank, p, &peer.addr, other);
                    let mut stream = match dial_route(&to, Duration::from_secs(1)) {
                        Ok(s) => s,
                        Err(e) => {
                            last = e;
                            continue;
                        }
                    };
                    let peer_of = |claimed: Option<usize>| match claimed {
                        Some(r) if r == p => Ok(peer.clone()),
                        _ => Err(peer.handshake("another process answered at its address")),
                    };
                    let hs = run_handshake(&self.cfg, &mut stream, k, n, FLAG_RESUME, peer.clone(), &peer_of);
                    match hs {
                        Ok(_) => return Ok(stream),
                        Err(e @ (CommError::AuthFailed { .. } | CommError::FingerprintMismatch { .. })) => {
                            return Err(e)
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            return Err(gave_up(last));
        }
        // Accept: the peer dials us. Connections that continue other
        // connections wait in the mailbox for whoever resumes those.
        while Instant::now() < deadline {
            {
                let mut mail = self.mailbox.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(i) = mail.iter().position(|(r, c, _)| (*r, *c) == (p, k)) {
                    return Ok(mail.swap_remove(i).2);
                }
            }
            if self.accept_one().is_none() {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Err(gave_up(format!("peer {p} did not connect again")))
    }

    fn tune(&self, stream: &TcpStream) -> std::io::Result<()> {
        tune_socket(stream, self.cfg.keepalive)
    }

    fn listen_fd(&self) -> Option<std::os::fd::RawFd> {
        self.listener.as_ref().map(|l| l.as_raw_fd())
    }

    fn accept_one(&self) -> Option<(usize, usize)> {
        let (mut stream, remote) = self.listener.as_ref()?.accept().ok()?;
        let stranger = PeerId::new(usize::MAX, remote.to_string());
        let peer_of = |claimed: Option<usize>| match claimed {
            Some(r) if r < self.size && r > self.rank && !self.links[r].is_empty() => Ok(self.peers[r].clone()),
            _ => Err(stranger.handshake("not a peer of ours")),
        };
        // A peer continuing a connection answers at once; a stranger must not hold us up.
        let timeout = self.cfg.handshake_timeout.min(Duration::from_secs(2));
        let cfg = TcpConfig { handshake_timeout: timeout, ..self.cfg.clone() };
        let (r, c, _, flags) =
            run_handshake(&cfg, &mut stream, CONN_ANY, CONN_ANY, FLAG_RESUME, stranger.clone(), &peer_of).ok()?;
        if flags & FLAG_RESUME == 0 || c >= self.links[r].len() {
            return None;
        }
        let mut mail = self.mailbox.lock().unwrap_or_else(|e| e.into_inner());
        mail.retain(|(mr, mc, _)| (*mr, *mc) != (r, c));
        mail.push((r, c, stream));
        Some((r, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tcp_io::HEADER_LEN;

    #[test]
    fn lost_bytes_come_from_the_kept_tail_and_the_jobs() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let conn = Conn::new(a, 1, 0);
        let data = vec![7u8; 100];
        let mut job = SendJob::new(&conn, 1, &data);
        // 40 bytes of an earlier exchange were kept (offsets 10..50), then this job wrote 30.
        *conn.kept.lock().unwrap() = (10, (10u8..50).collect());
        job.done = 30;
        conn.tx.store(80, Ordering::Release);
        let got = lost_bytes(&conn, 45, std::slice::from_ref(&job)).unwrap();
        assert_eq!(&got[..5], &[45, 46, 47, 48, 49]);
        assert_eq!(&got[5..5 + HEADER_LEN], &job.header);
        assert_eq!(&got[5 + HEADER_LEN..], &[7u8; 30 - HEADER_LEN]);
        assert!(lost_bytes(&conn, 5, std::slice::from_ref(&job)).unwrap_err().contains("kept only those from 10"));
        assert!(lost_bytes(&conn, 81, std::slice::from_ref(&job)).is_err());
    }
}
