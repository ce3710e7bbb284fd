//! Cables: which addresses each connection of a link uses, and how much of a
//! striped message each connection carries.
//!
//! A rank may list its cables (`TcpConfig::links`): one address per network
//! path, usually each on its own subnet (a Thunderbolt bridge, a second NIC).
//! Between two ranks that both list cables, connection `k` uses cable
//! `k mod c`, where `c` is the number of cables they have in common (the
//! shorter of the two lists): it binds the local address of our cable `k` and
//! dials the peer's cable `k`, so the kernel has no choice but the right
//! interface. With no cables listed on either side, every connection dials the
//! peer's main address, as before.
//!
//! Right after the handshakes, each pair of ranks with several connections
//! measures them ([`calibrate`]): round trips of a few bytes on each
//! connection, then a burst of bytes on all connections at once in each
//! direction. Both sides then hold the same figures, so they cut striped
//! messages the same way: in proportion to each connection's throughput in
//! that direction (a slow cable never holds back a fast one), and send small
//! messages over the connection with the lowest round trip.

use super::tcp::TcpConfig;
use crate::error::{CommError, PeerId, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a connection tries its own cable before the others (at start-up).
const FALLBACK_AFTER: Duration = Duration::from_secs(3);
/// Round trips timed per connection (the fastest counts).
const PING_ROUNDS: usize = 5;

/// Where one connection goes: the peer's addresses to try in order, and the
/// local addresses of the matching cable (empty: let the kernel choose).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    pub remote: Vec<String>,
    pub local: Vec<String>,
}

/// The cables of a rank: its listed links, or none.
fn cables(links: &[Vec<String>], rank: usize) -> &[String] {
    links.get(rank).map_or(&[], |l| l.as_slice())
}

/// Number of cables ranks `a` and `b` have in common (1 when either lists none).
pub(crate) fn common_cables(links: &[Vec<String>], a: usize, b: usize) -> usize {
    let (ca, cb) = (cables(links, a).len(), cables(links, b).len());
    if ca == 0 || cb == 0 {
        1
    } else {
        ca.min(cb)
    }
}

/// The route of connection `conn` from rank `me` to rank `peer` whose main
/// address is `peer_addr` (`host:port`; its port is used for cable addresses
/// without one).
pub(crate) fn route(links: &[Vec<String>], me: usize, peer: usize, peer_addr: &str, conn: usize) -> Route {
    let (mine, theirs) = (cables(links, me), cables(links, peer));
    if mine.is_empty() || theirs.is_empty() {
        return Route { remote: vec![peer_addr.to_string()], local: Vec::new() };
    }
    let k = conn % mine.len().min(theirs.len());
    let port = peer_addr.rsplit_once(':').map_or("", |(_, p)| p);
    Route {
        remote: alternatives(&theirs[k]).map(|a| with_port(a, port)).collect(),
        local: alternatives(&mine[k]).map(str::to_string).collect(),
    }
}

/// Every address of rank `peer` that rank `me` may reach it at: its main
/// address `peer_addr`, then each cable's (with `peer_addr`'s port where the
/// cable gives none). Heartbeats go to all of them.
pub(crate) fn all_addresses(links: &[Vec<String>], me: usize, peer: usize, peer_addr: &str) -> Vec<String> {
    let mut out = vec![peer_addr.to_string()];
    for k in 0..common_cables(links, me, peer) {
        for a in route(links, me, peer, peer_addr, k).remote {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

/// A cable entry may hold several addresses separated by `|` (e.g. IPv4 and IPv6).
fn alternatives(entry: &str) -> impl Iterator<Item = &str> {
    entry.split('|').map(str::trim).filter(|a| !a.is_empty())
}

fn with_port(addr: &str, port: &str) -> String {
    if addr.parse::<SocketAddr>().is_ok() {
        return addr.to_string();
    }
    if let Ok(IpAddr::V6(ip)) = addr.parse::<IpAddr>() {
        return format!("[{ip}]:{port}");
    }
    match addr.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && p.parse::<u16>().is_ok() => addr.to_string(),
        _ => format!("{addr}:{port}"),
    }
}

/// The local IP of `local` (an IP, or a host name) of the same family as `remote`.
fn local_ip(local: &[String], remote: &SocketAddr) -> Option<IpAddr> {
    local
        .iter()
        .filter_map(|l| {
            let l = l.trim_start_matches('[').trim_end_matches(']');
            l.parse::<IpAddr>()
                .ok()
                .or_else(|| (l, 0).to_socket_addrs().ok()?.map(|a| a.ip()).find(|ip| ip.is_ipv4() == remote.is_ipv4()))
        })
        .find(|ip| ip.is_ipv4() == remote.is_ipv4())
}

/// One attempt to connect `route` within `timeout`: each remote address in
/// turn, from the matching local address when the route names one.
pub(crate) fn dial_route(route: &Route, timeout: Duration) -> std::result::Result<TcpStream, String> {
    let mut last = String::from("no address");
    for remote in &route.remote {
        let addrs: Vec<SocketAddr> = match remote.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                last = format!("cannot resolve {remote}: {e}");
                continue;
            }
        };
        for addr in addrs {
            let r = match (route.local.is_empty(), local_ip(&route.local, &addr)) {
                (true, _) => TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string()),
                (false, Some(ip)) => connect_from(ip, &addr, timeout)
                    .map_err(|e| format!("{e} (from {ip}; is that address on this host and its cable up?)")),
                (false, None) => Err(format!("no local address of the same family as {addr} in {:?}", route.local)),
            };
            match r {
                Ok(s) => return Ok(s),
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
    }
    Err(last)
}

/// `connect` from `local` (bound before connecting, any port).
fn connect_from(local: IpAddr, remote: &SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let domain = if remote.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket we own; TcpStream closes it on drop (also on errors below).
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let (la, ll) = sockaddr(&SocketAddr::new(local, 0));
    // SAFETY: `la` holds a sockaddr of length `ll`.
    if unsafe { libc::bind(fd, (&raw const la).cast(), ll) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (ra, rl) = sockaddr(remote);
    // SAFETY: `ra` holds a sockaddr of length `rl`.
    if unsafe { libc::connect(fd, (&raw const ra).cast(), rl) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(err);
        }
        let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::TimedOut));
        }
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

fn sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut s).cast(), sin) };
            (s, size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut s).cast(), sin6) };
            (s, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

/// What was measured on one connection to a peer.
#[derive(Debug, Clone, PartialEq)]
pub struct CableStats {
    /// Index of the connection to this peer.
    pub conn: usize,
    /// Our end and the peer's end (`ip:port`).
    pub local: String,
    pub remote: String,
    /// Fastest round trip of a few bytes, in microseconds (0 when not measured).
    pub rtt_us: f64,
    /// Throughput measured with all connections busy, towards the peer and
    /// from it, in bytes per second (0 when not measured).
    pub send_bps: f64,
    pub recv_bps: f64,
    /// Parts of a striped message this connection carries, per direction.
    pub send_weight: u32,
    pub recv_weight: u32,
}

/// How messages to and from one peer use its connections (the same on both sides).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct LinkPlan {
    /// Connection for messages below the stripe threshold.
    pub small: usize,
    pub stats: Vec<CableStats>,
}

impl LinkPlan {
    /// Equal shares, small messages on connection 0 (nothing measured).
    pub fn even(streams: &[TcpStream]) -> LinkPlan {
        LinkPlan { small: 0, stats: streams.iter().enumerate().map(|(c, s)| stats_of(c, s, 0.0, 0.0, 0.0)).collect() }
    }

    /// Byte range of a `len`-byte message that connection `c` carries,
    /// outgoing (`send`) or incoming.
    pub fn part(&self, len: usize, send: bool, c: usize) -> Range<usize> {
        let w = |s: &CableStats| u128::from(if send { s.send_weight } else { s.recv_weight });
        let total: u128 = self.stats.iter().map(w).sum();
        let before: u128 = self.stats[..c].iter().map(w).sum();
        let at = |x: u128| (len as u128 * x / total.max(1)) as usize;
        at(before)..at(before + w(&self.stats[c]))
    }
}

fn stats_of(conn: usize, s: &TcpStream, rtt_us: f64, send_bps: f64, recv_bps: f64) -> CableStats {
    let show = |a: std::io::Result<SocketAddr>| a.map_or_else(|_| "?".to_string(), |a| a.to_string());
    CableStats {
        conn,
        local: show(s.local_addr()),
        remote: show(s.peer_addr()),
        rtt_us,
        send_bps,
        recv_bps,
        send_weight: 1,
        recv_weight: 1,
    }
}

/// Integer weights in proportion to `rates` (1..=1000; all 1 when nothing was measured).
fn weights(rates: &[f64]) -> Vec<u32> {
    let max = rates.iter().cloned().fold(0.0, f64::max);
    if !(max > 0.0 && max.is_finite()) {
        return vec![1; rates.len()];
    }
    rates.iter().map(|r| ((r / max * 1000.0).round() as u32).clamp(1, 1000)).collect()
}

/// Measures the connections to one peer (blocking sockets, timeouts set) and
/// agrees with it on a plan. `lower` is true on the side with the lower rank;
/// `bytes` 0 times round trips only.
pub(crate) fn calibrate(streams: &mut [TcpStream], lower: bool, bytes: usize, peer: &PeerId) -> Result<LinkPlan> {
    let n = streams.len();
    let fail = |what: &str, e: std::io::Error| peer.lost(format!("{e} while measuring the cables ({what})"));
    // Round trips: the lower side pings, the higher side echoes.
    let mut rtt = vec![f64::INFINITY; n];
    for _ in 0..PING_ROUNDS {
        for (c, s) in streams.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            if lower {
                let t = Instant::now();
                s.write_all(&b).map_err(|e| fail("ping", e))?;
                s.read_exact(&mut b).map_err(|e| fail("ping", e))?;
                rtt[c] = rtt[c].min(t.elapsed().as_secs_f64() * 1e6);
            } else {
                s.read_exact(&mut b).map_err(|e| fail("ping", e))?;
                s.write_all(&b).map_err(|e| fail("ping", e))?;
            }
        }
    }
    // Bursts: lower to higher, then higher to lower, all connections at once
    // (none with `bytes` 0: round trips only).
    let (down, up) = if bytes == 0 {
        (vec![0.0; n], vec![0.0; n])
    } else {
        (
            burst(streams, lower, bytes).map_err(|e| fail("burst", e))?,
            burst(streams, !lower, bytes).map_err(|e| fail("burst", e))?,
        )
    };
    // `down`/`up` hold rates measured by the receiving side; swap them so both know all.
    let (mut sent_rates, mut rtts) = (vec![0.0; n], rtt.clone());
    let recv_rates = if lower { up } else { down };
    let mut ours = Vec::with_capacity(16 * n);
    for c in 0..n {
        ours.extend_from_slice(&recv_rates[c].to_le_bytes());
        ours.extend_from_slice(&rtt[c].to_le_bytes());
    }
    let mut theirs = vec![0u8; ours.len()];
    let s = &mut streams[0];
    if lower {
        s.write_all(&ours).map_err(|e| fail("results", e))?;
        s.read_exact(&mut theirs).map_err(|e| fail("results", e))?;
    } else {
        s.read_exact(&mut theirs).map_err(|e| fail("results", e))?;
        s.write_all(&ours).map_err(|e| fail("results", e))?;
    }
    for c in 0..n {
        let f = |i: usize| f64::from_le_bytes(theirs[16 * c + i..16 * c + i + 8].try_into().unwrap());
        sent_rates[c] = f(0);
        if !lower {
            rtts[c] = f(8);
        }
    }
    let (sw, rw) = (weights(&sent_rates), weights(&recv_rates));
    let small = pick_small(&rtts, &sent_rates, &recv_rates);
    let stats = streams
        .iter()
        .enumerate()
        .map(|(c, s)| CableStats {
            send_weight: sw[c],
            recv_weight: rw[c],
            ..stats_of(c, s, rtts[c], sent_rates[c], recv_rates[c])
        })
        .collect();
    Ok(LinkPlan { small, stats })
}

/// The connection for small messages: the lowest round trip, and among
/// those within 10% (+2 µs) of it, the fastest (cables of one kind have the
/// same round trip, and small messages should not queue behind the slower
/// cable's share of a stripe). The same on both sides: the inputs are.
fn pick_small(rtts: &[f64], sent: &[f64], recv: &[f64]) -> usize {
    let best = rtts.iter().cloned().fold(f64::INFINITY, f64::min);
    let near = |c: usize| rtts[c] <= best * 1.1 + 2.0;
    (0..rtts.len())
        .filter(|&c| near(c))
        .fold(None, |pick: Option<usize>, c| match pick {
            Some(p) if sent[p] + recv[p] >= sent[c] + recv[c] => Some(p),
            _ => Some(c),
        })
        .unwrap_or(0)
}

/// `bytes` on every connection at once; the receiving side returns each
/// connection's rate in bytes per second (the sending side zeros).
fn burst(streams: &mut [TcpStream], sending: bool, bytes: usize) -> std::io::Result<Vec<f64>> {
    let start = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter_mut()
            .map(|st| {
                s.spawn(move || -> std::io::Result<f64> {
                    let mut buf = vec![0u8; (64 << 10).min(bytes.max(1))];
                    let mut left = bytes;
                    while left > 0 {
                        let n = left.min(buf.len());
                        if sending {
                            st.write_all(&buf[..n])?;
                        } else {
                            st.read_exact(&mut buf[..n])?;
                        }
                        left -= n;
                    }
                    if sending {
                        return Ok(0.0);
                    }
                    Ok(bytes as f64 / start.elapsed().as_secs_f64().max(1e-9))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("calibration thread panicked"))
            .collect::<std::io::Result<Vec<f64>>>()
    })
    .and_then(|rates| {
        // The receiver says when it has everything, so the next burst starts together.
        let mut done = [0u8; 1];
        if sending {
            streams[0].read_exact(&mut done)?;
        } else {
            streams[0].write_all(&done)?;
        }
        Ok(rates)
    })
}

pub(crate) fn dial(peer: &PeerId, routes: &[Route], deadline: Instant, stop: &AtomicBool) -> Result<TcpStream> {
    let start = Instant::now();
    let to = &routes[0];
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(super::tcp::stopped());
        }
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
        let last_err = match dial_route(to, left.min(Duration::from_secs(2))) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        // A cable that has been unusable for a while (not merely refused: the
        // peer may not listen yet) is stood in for by the others.
        if start.elapsed() >= FALLBACK_AFTER && !last_err.contains("refused") {
            for other in &routes[1..] {
                if let Ok(s) = dial_route(other, Duration::from_secs(1)) {
                    eprintln!(
                        "shardlm-comm: peer {} at {}: cable {} unusable ({last_err}); this connection uses cable {} instead",
                        peer.rank,
                        peer.addr,
                        to.remote.join("|"),
                        other.remote.join("|")
                    );
                    return Ok(s);
                }
            }
        }
        if Instant::now() >= deadline {
            let addr = if to.remote.len() == 1 && to.remote[0] == peer.addr {
                peer.addr.clone()
            } else {
                format!("{} (cable {})", peer.addr, to.remote.join("|"))
            };
            return Err(CommError::Connect { rank: peer.rank, addr, waited: start.elapsed(), detail: last_err });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Measures the connections of every pair (all pairs at once, one thread
/// each; bursts only where a pair has several) and returns how to use them,
/// indexed by rank.
pub(crate) fn measure_links(
    cfg: &TcpConfig,
    peers: &[PeerId],
    streams: &mut [Vec<TcpStream>],
) -> Result<Vec<LinkPlan>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter_mut()
            .enumerate()
            .map(|(p, conns)| {
                s.spawn(move || {
                    if conns.is_empty() || cfg.calibration_bytes == 0 {
                        return Ok(LinkPlan::even(conns));
                    }
                    // One connection has nothing to share out: time its round trips only.
                    let bytes = if conns.len() > 1 { cfg.calibration_bytes } else { 0 };
                    calibrate(conns, cfg.rank < p, bytes, &peers[p])
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("calibration thread panicked")).collect()
    })
}

/// Checks a cable list for [`crate::TcpConfig::links`]: `Err` names the problem.
pub(crate) fn validate_links(links: &[Vec<String>], size: usize) -> Result<()> {
    if !links.is_empty() && links.len() != size {
        return Err(CommError::invalid(format!("cables given for {} ranks in a world of {size}", links.len())));
    }
    for (r, l) in links.iter().enumerate() {
        if l.iter().any(|c| alternatives(c).next().is_none()) {
            return Err(CommError::invalid(format!("rank {r} has an empty cable address in {l:?}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn heartbeats_go_to_every_cable() {
        let links = vec![s(&["10.78.18.1", "10.79.18.1"]), s(&["10.78.18.2", "10.79.18.2|fd00::2"])];
        assert_eq!(
            all_addresses(&links, 0, 1, "10.78.18.2:7000"),
            s(&["10.78.18.2:7000", "10.79.18.2:7000", "[fd00::2]:7000"])
        );
        assert_eq!(all_addresses(&[], 0, 1, "h:7"), s(&["h:7"]));
    }

    #[test]
    fn connection_k_uses_cable_k() {
        let links = vec![s(&["10.1.0.1", "10.2.0.1"]), s(&["10.1.0.2", "10.2.0.2:7100"]), vec![]];
        assert_eq!(common_cables(&links, 0, 1), 2);
        assert_eq!(common_cables(&links, 0, 2), 1);
        let r = route(&links, 0, 1, "h1:7000", 1);
        assert_eq!(r, Route { remote: s(&["10.2.0.2:7100"]), local: s(&["10.2.0.1"]) });
        let r = route(&links, 1, 0, "h0:7000", 2);
        assert_eq!(r, Route { remote: s(&["10.1.0.1:7000"]), local: s(&["10.1.0.2"]) });
        assert_eq!(route(&links, 0, 2, "h2:7000", 1), Route { remote: s(&["h2:7000"]), local: vec![] });
        let v6 = vec![s(&["10.1.0.1|fe80::1"]), s(&["10.1.0.2 | fe80::2"])];
        assert_eq!(route(&v6, 0, 1, "h1:9", 0).remote, s(&["10.1.0.2:9", "[fe80::2]:9"]));
    }

    #[test]
    fn parts_follow_the_weights() {
        let mut plan = LinkPlan::default();
        for (c, (sw, rw)) in [(2u32, 1u32), (1, 1)].into_iter().enumerate() {
            plan.stats.push(CableStats {
                conn: c,
                local: String::new(),
                remote: String::new(),
                rtt_us: 0.0,
                send_bps: 0.0,
                recv_bps: 0.0,
                send_weight: sw,
                recv_weight: rw,
            });
        }
        assert_eq!((plan.part(300, true, 0), plan.part(300, true, 1)), (0..200, 200..300));
        assert_eq!((plan.part(301, false, 0), plan.part(301, false, 1)), (0..150, 150..301));
        assert_eq!(weights(&[200e6, 100e6]), vec![1000, 500]);
        assert_eq!(weights(&[0.0, 0.0]), vec![1, 1]);
        assert_eq!(pick_small(&[7.0, 7.5], &[1.0, 2.0], &[1.0, 2.0]), 1, "same round trip: the faster");
        assert_eq!(pick_small(&[7.0, 30.0], &[1.0, 2.0], &[1.0, 2.0]), 0, "lower round trip first");
        assert_eq!(pick_small(&[f64::INFINITY; 2], &[0.0; 2], &[0.0; 2]), 0);
    }
}
