//! Heartbeats of a TCP world: telling a hung rank from a slow one.
//!
//! A rank that is stopped (SIGSTOP, a frozen VM, a laptop lid closed without
//! the network going down) keeps its TCP connections open: its kernel still
//! acknowledges what we send, so neither a closed socket nor a keep-alive
//! probe ever tells. Waiting on it blocks forever, and a deadline on receives
//! cannot tell it from a rank that is busy with a long prefill chunk.
//!
//! So every rank runs a beacon: a thread that sends a small UDP datagram to
//! every peer each [`BEAT`], from the same port number as its TCP listener,
//! and records when it last heard each peer's. A peer with several cables
//! gets the datagram on each of them (its main address and every cable
//! address a connection would dial), so a peer is silent only when every
//! cable to it is down: losing one cable while another carries the
//! connections on is not a hang. The thread beats whatever the
//! rank's compute threads are doing, so a busy rank keeps beating; a stopped
//! process beats no more. A pump that waits fails with
//! [`CommError::Hung`] once some peer it has heard from has been silent for
//! the hang timeout.
//!
//! Peers never heard from are never declared hung: where a firewall drops the
//! datagrams, the world works as it did without beacons. A datagram carries a
//! tag derived from the cluster secret, so another world's beats (or stray
//! packets) are ignored; it is a liveness hint, not authenticated traffic (a
//! forged beat can only keep a stopped rank looking alive, as before).

use crate::error::{CommError, PeerId};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Interval between a rank's heartbeats.
pub(crate) const BEAT: Duration = Duration::from_millis(250);
const MAGIC: [u8; 4] = *b"SLMB";
const PACKET: usize = 16;

/// What the beacon thread shares with the pumps.
struct Shared {
    stop: AtomicBool,
    epoch: Instant,
    /// Per rank: milliseconds since `epoch` of its last beat, plus 1 (0: never heard).
    heard: Vec<AtomicU64>,
}

/// One rank's beacon. Dropping it stops and joins its thread.
pub(crate) struct Beacon {
    shared: Arc<Shared>,
    limit: Duration,
    thread: Option<JoinHandle<()>>,
}

impl Beacon {
    /// Starts beating from `local` (our TCP listener's address: the same port,
    /// in UDP) to every other rank: `targets[r]` lists rank `r`'s addresses
    /// (`host:port`, the port of its listener; one per cable), `targets.len()`
    /// is the world's size. `None` when the socket cannot be bound: the world
    /// then runs without hang detection, as it did before beacons.
    pub(crate) fn start(
        rank: usize,
        local: SocketAddr,
        targets: &[Vec<String>],
        secret: &[u8],
        limit: Duration,
    ) -> Option<Beacon> {
        let socket = UdpSocket::bind(local).ok()?;
        socket.set_read_timeout(Some(BEAT / 2)).ok()?;
        let mut addrs: Vec<SocketAddr> = Vec::new();
        for a in targets.iter().enumerate().filter(|&(r, _)| r != rank).flat_map(|(_, t)| t) {
            let found = a.to_socket_addrs().ok().and_then(|mut it| it.find(|s| s.is_ipv4() == local.is_ipv4()));
            if let Some(s) = found.filter(|s| !addrs.contains(s)) {
                addrs.push(s);
            }
        }
        let tag = world_tag(secret);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            epoch: Instant::now(),
            heard: (0..targets.len()).map(|_| AtomicU64::new(0)).collect(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("beacon-{rank}"))
            .spawn(move || beat(&socket, rank, &addrs, tag, &s))
            .ok()?;
        Some(Beacon { shared, limit, thread: Some(thread) })
    }

    /// The first peer heard from at least once and silent for the hang
    /// timeout or longer, as the error to fail with.
    pub(crate) fn hung(&self, peers: &[PeerId]) -> Option<CommError> {
        let now = self.shared.epoch.elapsed().as_millis() as u64 + 1;
        self.shared.heard.iter().enumerate().find_map(|(r, h)| {
            let last = h.load(Ordering::Relaxed);
            let silent = Duration::from_millis(now.saturating_sub(last));
            (last != 0 && silent >= self.limit).then(|| {
                let addr = peers.get(r).map_or_else(String::new, |p| p.addr.clone());
                CommError::Hung { rank: r, addr, silent }
            })
        })
    }
}

impl Drop for Beacon {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Eight bytes that only ranks knowing the cluster secret agree on.
fn world_tag(secret: &[u8]) -> [u8; 8] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(b"shardlm beacon v1");
    let out = mac.finalize().into_bytes();
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&out[..8]);
    tag
}

/// The beacon thread: beats every [`BEAT`] and records the peers' beats.
fn beat(socket: &UdpSocket, rank: usize, targets: &[SocketAddr], tag: [u8; 8], s: &Shared) {
    let mut packet = [0u8; PACKET];
    packet[..4].copy_from_slice(&MAGIC);
    packet[4..8].copy_from_slice(&(rank as u32).to_le_bytes());
    packet[8..].copy_from_slice(&tag);
    let mut next = Instant::now();
    let mut buf = [0u8; 64];
    while !s.stop.load(Ordering::Acquire) {
        if Instant::now() >= next {
            for t in targets {
                // A peer not listening yet (or gone) refuses; the next beat tries again.
                let _ = socket.send_to(&packet, t);
            }
            next += BEAT;
            if next < Instant::now() {
                next = Instant::now() + BEAT;
            }
        }
        if let Ok((n, _)) = socket.recv_from(&mut buf) {
            if n == PACKET && buf[..4] == MAGIC && buf[8..PACKET] == tag {
                let from = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")) as usize;
                if let Some(h) = s.heard.get(from).filter(|_| from != rank) {
                    h.store(s.epoch.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    fn targets(peers: &[String]) -> Vec<Vec<String>> {
        peers.iter().map(|p| vec![p.clone()]).collect()
    }

    #[test]
    fn a_peer_heard_on_any_of_its_addresses_is_not_hung() {
        // Rank 1 is reached at a dead address (its "lost cable") and at its
        // real one: rank 0's beats still reach it, and its reach rank 0.
        let ports = [free_port(), free_port()];
        let peers: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let ids: Vec<PeerId> = peers.iter().enumerate().map(|(r, a)| PeerId::new(r, a.clone())).collect();
        let dead = format!("127.0.0.1:{}", free_port());
        let t = vec![vec![peers[0].clone()], vec![dead, peers[1].clone()]];
        let limit = Duration::from_millis(800);
        let a = Beacon::start(0, peers[0].parse().unwrap(), &t, b"s", limit).expect("beacon 0");
        let b = Beacon::start(1, peers[1].parse().unwrap(), &t, b"s", limit).expect("beacon 1");
        std::thread::sleep(Duration::from_millis(1200));
        assert!(a.hung(&ids).is_none() && b.hung(&ids).is_none());
        assert!(b.shared.heard[0].load(Ordering::Relaxed) != 0, "rank 1 heard rank 0 over its live address");
    }

    #[test]
    fn a_silent_peer_is_hung_and_a_beating_one_is_not() {
        let ports = [free_port(), free_port()];
        let peers: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let ids: Vec<PeerId> = peers.iter().enumerate().map(|(r, a)| PeerId::new(r, a.clone())).collect();
        let addr = |r: usize| peers[r].parse::<SocketAddr>().unwrap();
        let limit = Duration::from_millis(800);
        let t = targets(&peers);
        let a = Beacon::start(0, addr(0), &t, b"s", limit).expect("beacon 0");
        let b = Beacon::start(1, addr(1), &t, b"s", limit).expect("beacon 1");
        std::thread::sleep(Duration::from_millis(1200));
        assert!(a.hung(&ids).is_none() && b.hung(&ids).is_none());
        drop(b);
        std::thread::sleep(Duration::from_millis(1200));
        let err = a.hung(&ids).expect("rank 1 stopped beating");
        assert_eq!(err.peer(), Some(1));
        assert!(err.to_string().contains("no heartbeat"), "{err}");
    }

    #[test]
    fn another_worlds_beats_are_ignored() {
        let ports = [free_port(), free_port()];
        let peers: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let ids: Vec<PeerId> = peers.iter().enumerate().map(|(r, a)| PeerId::new(r, a.clone())).collect();
        let limit = Duration::from_millis(100);
        let t = targets(&peers);
        let a = Beacon::start(0, peers[0].parse().unwrap(), &t, b"one", limit).unwrap();
        let _b = Beacon::start(1, peers[1].parse().unwrap(), &t, b"two", limit).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        // Never heard (the tags differ): never declared hung.
        assert!(a.hung(&ids).is_none());
    }
}
