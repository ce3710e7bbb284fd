//! TCP transport: authenticated connections between ranks anywhere.
//!
//! Bootstrap is by rank order: every rank listens on its own address, accepts
//! connections from higher ranks and connects to lower ones, so there is no
//! rendezvous server and no race on who connects to whom. Each link is
//! `connections_per_peer` sockets; every socket runs the handshake of
//! [`crate::handshake`] (protocol version, model fingerprint, rank, and an
//! HMAC-SHA256 challenge-response over the cluster secret in both directions).
//!
//! With several cables between two hosts (`links`), connection `k` binds our
//! address on cable `k` and dials the peer's (see [`super::tcp_cables`]), and
//! the pair measures its connections once connected. Messages shorter than
//! `stripe_threshold` travel on the connection with the lowest round trip;
//! longer ones are cut into one stripe per connection, sized in proportion to
//! that connection's measured throughput, each driven by its own thread, which
//! is how two cables (or two NIC queues) add up. All sockets are
//! `TCP_NODELAY`, non-blocking, and use short keep-alive probes so that a
//! silently dead host is noticed in seconds, not hours.
//!
//! When anything fails, the transport sends an `ABORT` frame with the one-line
//! reason to every peer it can and closes all sockets: the other ranks then
//! fail fast with a message that names the rank that really failed.

use super::tcp_beacon::Beacon;
pub use super::tcp_cables::CableStats;
use super::tcp_cables::{all_addresses, common_cables, dial, measure_links, route, validate_links, LinkPlan};
use super::tcp_io::{cancelled, pump, Conn, PumpCtx, RecvJob, Resumer, SendJob};
use super::tcp_resume::resume_idle;
use super::{validate_ops, BusyGuard, RecvOp, SendOp, Transport};
use crate::error::{CommError, PeerId, Result};
use crate::handshake::{handshake, HandshakeIo, Hello, CONN_ANY, FLAG_RESUME, PROTOCOL_VERSION};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which ranks hold direct connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Topology {
    /// Every pair of ranks is connected (needed for the latency-optimised paths).
    #[default]
    FullMesh,
    /// Each rank connects only to `rank - 1` and `rank + 1` (mod size); the
    /// collectives then use ring algorithms only.
    Ring,
}

/// [`TcpConfig::hang_timeout`] unless set: twenty missed heartbeats.
pub const DEFAULT_HANG_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything needed to join a TCP world.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    pub rank: usize,
    pub size: usize,
    /// `host:port` of every rank, indexed by rank (our own entry is where we listen).
    pub peers: Vec<String>,
    /// Listen here instead of `peers[rank]` (e.g. `0.0.0.0:5000`).
    pub bind: Option<String>,
    /// Shared cluster secret; proven by HMAC, never sent.
    pub secret: Vec<u8>,
    /// Identifies the model (and shard plan); all ranks must agree.
    pub fingerprint: u64,
    /// Connections per pair of ranks; 0 (the default) means one per cable the
    /// pair has in common (see `links`), which is 1 without cables.
    pub connections_per_peer: usize,
    /// Cables of every rank, indexed by rank: one address per network path
    /// (an IP or host name, optionally `:port`; alternatives separated by `|`).
    /// Connection `k` between two ranks that both list cables binds our cable
    /// `k mod c` and dials theirs, `c` being the shorter list. Empty (for all
    /// ranks or one): connections dial `peers` and the kernel picks the route.
    pub links: Vec<Vec<String>>,
    /// Bytes sent on every connection, each way, to measure a pair's
    /// connections when it has several (0: equal stripes, no measuring).
    pub calibration_bytes: usize,
    pub topology: Topology,
    /// Deadline for establishing all connections, retries included.
    pub connect_timeout: Duration,
    /// Deadline for one connection's handshake.
    pub handshake_timeout: Duration,
    /// How long a connection whose cable was lost may take to continue over
    /// another cable (after the loss is noticed, within `keepalive` + 3 s).
    pub resume_timeout: Duration,
    /// Fail an operation when a peer sent nothing for this long. `None` waits
    /// forever (idle workers wait for the next request); dead peers are still
    /// detected by closed connections and keep-alive probes.
    pub op_timeout: Option<Duration>,
    /// Fail an operation when a peer that beat before has sent no heartbeat
    /// for this long: its process is stopped or its host frozen, though its
    /// connections stay open (see `tcp_beacon`). A busy peer keeps beating.
    /// `None` disables the beacon.
    pub hang_timeout: Option<Duration>,
    /// Keep-alive idle time before probing (then 1 s apart, 3 probes);
    /// also bounds how long unacknowledged data may wait. `None` disables.
    pub keepalive: Option<Duration>,
    /// Largest message accepted, in bytes.
    pub max_message_bytes: usize,
    /// Messages at least this long are striped across the connections of a link.
    pub stripe_threshold: usize,
    /// Busy-poll for this long before parking in `poll`.
    pub spin: Duration,
    /// Protocol version announced in the handshake (tests only).
    #[doc(hidden)]
    pub protocol_version: u32,
}

impl TcpConfig {
    /// A config with default tuning; fill in the rest with struct update syntax.
    pub fn new(rank: usize, peers: Vec<String>, secret: impl Into<Vec<u8>>, fingerprint: u64) -> TcpConfig {
        TcpConfig {
            rank,
            size: peers.len(),
            peers,
            bind: None,
            secret: secret.into(),
            fingerprint,
            connections_per_peer: 0,
            links: Vec::new(),
            calibration_bytes: 2 << 20,
            topology: Topology::FullMesh,
            connect_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            resume_timeout: Duration::from_secs(10),
            op_timeout: None,
            hang_timeout: Some(DEFAULT_HANG_TIMEOUT),
            keepalive: Some(Duration::from_secs(2)),
            max_message_bytes: 1 << 30,
            stripe_threshold: 256 << 10,
            // As shm's: a tensor rank waits for its peer's half of an
            // all-reduce 61 times a token (SmolLM2); parking in `poll` after
            // 50 µs and waking through the kernel cost 2-rank decode 11% at
            // depth 2048 against 200 µs (loopback, 2026-12-01).
            spin: Duration::from_micros(200),
            protocol_version: PROTOCOL_VERSION,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.size == 0 || self.rank >= self.size {
            return Err(CommError::invalid(format!("rank {} is outside a world of {}", self.rank, self.size)));
        }
        if self.peers.len() != self.size {
            return Err(CommError::invalid(format!(
                "{} peer addresses given for a world of {}",
                self.peers.len(),
                self.size
            )));
        }
        if self.connections_per_peer > 64 {
            return Err(CommError::invalid("connections_per_peer must be between 1 and 64 (0: one per cable)"));
        }
        validate_links(&self.links, self.size)
    }

    /// Connections between us and rank `peer`.
    fn conns_for(&self, peer: usize) -> usize {
        match self.connections_per_peer {
            0 => common_cables(&self.links, self.rank, peer),
            n => n,
        }
    }

    /// Where we listen: `bind`, else our address in `peers`, on every
    /// interface when we have cables (peers dial each cable's address).
    fn listen_addr(&self) -> Result<String> {
        let ours = self.bind.clone().unwrap_or_else(|| self.peers[self.rank].clone());
        if self.bind.is_some() || self.links.get(self.rank).is_none_or(Vec::is_empty) {
            return Ok(ours);
        }
        let resolved = ours
            .to_socket_addrs()
            .map_err(|e| CommError::io(format!("resolving our address {ours}"), e))?
            .next()
            .ok_or_else(|| CommError::invalid(format!("our address {ours} resolves to nothing")))?;
        Ok(match resolved {
            SocketAddr::V4(a) => format!("0.0.0.0:{}", a.port()),
            SocketAddr::V6(a) => format!("[::]:{}", a.port()),
        })
    }

    fn neighbours(&self) -> Vec<bool> {
        let (r, n) = (self.rank, self.size);
        (0..n)
            .map(|p| {
                p != r
                    && match self.topology {
                        Topology::FullMesh => true,
                        Topology::Ring => p == (r + 1) % n || p == (r + n - 1) % n,
                    }
            })
            .collect()
    }
}

/// One rank of a TCP world. Build it with [`TcpTransport::connect`].
pub struct TcpTransport {
    inner: Arc<TcpInner>,
    /// Accepts connections that continue ours while no exchange runs.
    watcher: Option<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl std::ops::Deref for TcpTransport {
    type Target = TcpInner;
    fn deref(&self) -> &TcpInner {
        &self.inner
    }
}

/// The state of a [`TcpTransport`], shared with its watcher thread.
#[doc(hidden)]
pub struct TcpInner {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) peers: Vec<PeerId>,
    /// `links[p]` holds the connections to rank `p` (empty when not a neighbour).
    pub(super) links: Vec<Vec<Conn>>,
    /// `plans[p]`: how messages to and from rank `p` use its connections.
    pub(super) plans: Vec<LinkPlan>,
    pub(super) op_timeout: Option<Duration>,
    pub(super) spin: Duration,
    pub(super) stripe_threshold: usize,
    pub(super) max_message: usize,
    pub(super) topology: Topology,
    pub(super) busy: AtomicBool,
    pub(super) failed: Mutex<Option<CommError>>,
    /// For continuing connections whose cable was lost: the configuration,
    /// our listener (lower ranks accept the new connections), and new
    /// connections accepted for another connection than the one looked for.
    pub(super) cfg: TcpConfig,
    pub(super) listener: Option<TcpListener>,
    pub(super) mailbox: Mutex<Vec<(usize, usize, TcpStream)>>,
    /// Held by an exchange, and by the watcher while it continues a connection.
    pub(super) quiet: Mutex<()>,
    /// Our heartbeats, and when we last heard each peer's.
    pub(super) beacon: Option<Beacon>,
}

impl TcpTransport {
    /// Binds `cfg.bind` (or our entry of `cfg.peers`) and connects to the world.
    pub fn connect(cfg: &TcpConfig) -> Result<TcpTransport> {
        cfg.validate()?;
        if cfg.size == 1 {
            return Ok(Self::assemble(cfg, Vec::new(), Vec::new(), None, None));
        }
        let bind = cfg.listen_addr()?;
        let listener = TcpListener::bind(&bind).map_err(|e| CommError::io(format!("listening on {bind}"), e))?;
        Self::connect_with_listener(cfg, listener)
    }

    /// Like [`TcpTransport::connect`] with a listener the caller already bound
    /// (useful with port 0 in tests).
    pub fn connect_with_listener(cfg: &TcpConfig, listener: TcpListener) -> Result<TcpTransport> {
        cfg.validate()?;
        let peers: Vec<PeerId> = cfg.peers.iter().enumerate().map(|(r, a)| PeerId::new(r, a.clone())).collect();
        let neighbours = cfg.neighbours();
        let deadline = Instant::now() + cfg.connect_timeout;
        let stop = AtomicBool::new(false);
        let mut slots: Vec<Vec<Option<TcpStream>>> = (0..cfg.size)
            .map(|p| (0..if neighbours[p] { cfg.conns_for(p) } else { 0 }).map(|_| None).collect())
            .collect();
        let expected_accepts: usize =
            (cfg.rank + 1..cfg.size).filter(|&p| neighbours[p]).map(|p| cfg.conns_for(p)).sum();

        let (accepted, connected) = std::thread::scope(|s| {
            let acceptor = s.spawn(|| {
                let r = accept_all(cfg, &listener, &peers, &neighbours, expected_accepts, deadline, &stop);
                if r.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                r
            });
            let connected = connect_down(cfg, &peers, &neighbours, deadline, &stop);
            if connected.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            (acceptor.join().expect("acceptor thread panicked"), connected)
        });
        // Report the first real failure; a side stopped by the other is not one.
        let (accepted, connected) = match (accepted, connected) {
            (Ok(a), Ok(c)) => (a, c),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => return Err(e),
            (Err(a), Err(c)) => return Err(if a == stopped() { c } else { a }),
        };
        for (rank, conn, stream) in accepted.into_iter().chain(connected) {
            slots[rank][conn] = Some(stream);
        }
        let mut streams =
            slots.into_iter().map(|conns| conns.into_iter().map_while(|c| c).collect::<Vec<_>>()).collect::<Vec<_>>();
        let plans = measure_links(cfg, &peers, &mut streams)?;
        let links: Vec<Vec<Conn>> = streams
            .into_iter()
            .enumerate()
            .map(|(p, conns)| conns.into_iter().enumerate().map(|(k, s)| Conn::new(s, p, k)).collect())
            .collect();
        for (p, link) in links.iter().enumerate() {
            for conn in link {
                tune_socket(&conn.streams()[0], cfg.keepalive)
                    .map_err(|e| CommError::io(format!("tuning socket to {p}"), e))?;
            }
        }
        let beacon = match (cfg.hang_timeout, listener.local_addr()) {
            (Some(limit), Ok(local)) => Beacon::start(cfg.rank, local, &beacon_targets(cfg), &cfg.secret, limit),
            _ => None,
        };
        Ok(Self::assemble(cfg, links, plans, Some(listener), beacon))
    }

    /// The connections to rank `peer` as measured when connecting (empty when
    /// not connected to it).
    pub fn cables(&self, peer: usize) -> Vec<CableStats> {
        self.plans.get(peer).map_or_else(Vec::new, |p| p.stats.clone())
    }

    fn assemble(
        cfg: &TcpConfig,
        links: Vec<Vec<Conn>>,
        plans: Vec<LinkPlan>,
        listener: Option<TcpListener>,
        beacon: Option<Beacon>,
    ) -> TcpTransport {
        let watch = listener.is_some();
        let inner = Arc::new(TcpInner {
            rank: cfg.rank,
            size: cfg.size,
            peers: cfg.peers.iter().enumerate().map(|(r, a)| PeerId::new(r, a.clone())).collect(),
            links,
            plans,
            op_timeout: cfg.op_timeout,
            spin: cfg.spin,
            stripe_threshold: cfg.stripe_threshold.max(1),
            max_message: cfg.max_message_bytes,
            topology: cfg.topology,
            busy: AtomicBool::new(false),
            failed: Mutex::new(None),
            cfg: cfg.clone(),
            listener,
            mailbox: Mutex::new(Vec::new()),
            quiet: Mutex::new(()),
            beacon,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = watch.then(|| {
            let (inner, stop) = (inner.clone(), stop.clone());
            std::thread::spawn(move || inner.watch(&stop))
        });
        TcpTransport { inner, watcher, stop }
    }
}

impl TcpInner {
    /// While no exchange runs, accepts the connections peers make to continue
    /// one whose cable was lost (an exchange in progress does it itself).
    fn watch(&self, stop: &AtomicBool) {
        let Some(fd) = self.listener.as_ref().map(|l| l.as_raw_fd()) else { return };
        while !stop.load(Ordering::Acquire) {
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
                continue;
            }
            let Ok(_quiet) = self.quiet.try_lock() else {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            if self.failed.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                return;
            }
            let cancel = AtomicBool::new(false);
            let ctx = self.pump_ctx(&cancel);
            while let Some((p, k)) = self.accept_one() {
                if let Err(e) = resume_idle(&self.links[p][k], "its peer connected again to continue it", &ctx) {
                    self.fail(e);
                    return;
                }
            }
        }
    }

    /// Records the first failure, tells every peer, and closes all sockets.
    ///
    /// A timeout is ambiguous: the silent peer may itself be stuck behind the
    /// rank that really failed. So before blaming it we tell everyone else and
    /// give it a grace period to send its own abort, whose reason names the
    /// real culprit. A peer that is truly stopped stays silent and is blamed.
    fn fail(&self, mut err: CommError) -> CommError {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if let (None, CommError::Timeout { rank, waited, .. }) = (failed.as_ref(), &err) {
            let (silent, grace) = (*rank, (*waited).min(Duration::from_secs(10)));
            let reason = err.to_string();
            for (p, link) in self.links.iter().enumerate() {
                if p != silent {
                    link.iter().for_each(|c| c.send_abort(&reason));
                }
            }
            if let Some(theirs) = self.links[silent].first().and_then(|c| c.await_abort(grace)) {
                err = self.peers[silent].aborted(theirs);
            }
        }
        if failed.is_none() {
            *failed = Some(err.clone());
            let reason = err.to_string();
            for conn in self.links.iter().flatten() {
                conn.abort(&reason);
            }
        }
        err
    }

    /// A pump context over every peer that resumes lost cables through us,
    /// watching no idle connections.
    fn pump_ctx<'a>(&'a self, cancel: &'a AtomicBool) -> PumpCtx<'a> {
        PumpCtx {
            peers: &self.peers,
            op_timeout: self.op_timeout,
            spin: self.spin,
            cancel,
            resumer: Some(self),
            idle: &[],
            beacon: self.beacon.as_ref(),
        }
    }

    fn run(&self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>]) -> Result<()> {
        let stripe = |peer: usize, len: usize| self.links[peer].len() > 1 && len >= self.stripe_threshold;
        let small = |peer: usize| &self.links[peer][self.plans[peer].small];
        let cancel = AtomicBool::new(false);
        let ctx = self.pump_ctx(&cancel);
        let any_striped =
            sends.iter().any(|s| stripe(s.peer, s.data.len())) || recvs.iter().any(|r| stripe(r.peer, r.buf.len()));
        // Connections this exchange leaves alone are watched by the first pump.
        let used = |c: &Conn| {
            let p = c.peer;
            sends.iter().any(|s| s.peer == p && (stripe(p, s.data.len()) || std::ptr::eq(small(p), c)))
                || recvs.iter().any(|r| r.peer == p && (stripe(p, r.buf.len()) || std::ptr::eq(small(p), c)))
        };
        let idle: Vec<&Conn> = self.links.iter().flatten().filter(|c| !used(c)).collect();
        let first_ctx = PumpCtx { idle: &idle, ..ctx };
        if !any_striped {
            let mut sj: Vec<SendJob> = sends.iter().map(|s| SendJob::new(small(s.peer), s.peer, s.data)).collect();
            let mut rj: Vec<RecvJob> = recvs.iter_mut().map(|r| RecvJob::new(small(r.peer), r.peer, r.buf)).collect();
            return pump(&mut sj, &mut rj, &first_ctx);
        }
        // One job list per connection index (one thread each); small messages
        // go on their peer's lowest-latency connection.
        let nconn = self.links.iter().map(Vec::len).max().unwrap_or(1);
        let mut per_conn: Vec<(Vec<SendJob>, Vec<RecvJob>)> = (0..nconn).map(|_| (Vec::new(), Vec::new())).collect();
        for s in sends {
            let plan = &self.plans[s.peer];
            if stripe(s.peer, s.data.len()) {
                for (c, conn) in self.links[s.peer].iter().enumerate() {
                    let part = &s.data[plan.part(s.data.len(), true, c)];
                    per_conn[c].0.push(SendJob::new(conn, s.peer, part));
                }
            } else {
                per_conn[plan.small].0.push(SendJob::new(small(s.peer), s.peer, s.data));
            }
        }
        for r in recvs.iter_mut() {
            let plan = &self.plans[r.peer];
            if stripe(r.peer, r.buf.len()) {
                let len = r.buf.len();
                let mut rest: &mut [u8] = r.buf;
                for (c, conn) in self.links[r.peer].iter().enumerate() {
                    let (part, tail) = rest.split_at_mut(plan.part(len, false, c).len());
                    rest = tail;
                    per_conn[c].1.push(RecvJob::new(conn, r.peer, part));
                }
            } else {
                per_conn[plan.small].1.push(RecvJob::new(small(r.peer), r.peer, r.buf));
            }
        }
        let ctx = &ctx;
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let mut iter = per_conn.into_iter();
            let (mut s0, mut r0) = iter.next().expect("at least one connection");
            let handles: Vec<_> = iter
                .map(|(mut sj, mut rj)| {
                    s.spawn(move || {
                        let r = pump(&mut sj, &mut rj, ctx);
                        if r.is_err() {
                            ctx.cancel.store(true, Ordering::Relaxed);
                        }
                        r
                    })
                })
                .collect();
            let first = pump(&mut s0, &mut r0, &first_ctx);
            if first.is_err() {
                ctx.cancel.store(true, Ordering::Relaxed);
            }
            std::iter::once(first)
                .chain(handles.into_iter().map(|h| h.join().expect("stripe thread panicked")))
                .collect()
        });
        let mut errors = results.into_iter().filter_map(Result::err);
        match errors.next() {
            None => Ok(()),
            Some(first) => {
                Err(std::iter::once(first).chain(errors).find(|e| *e != cancelled()).unwrap_or_else(cancelled))
            }
        }
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> &'static str {
        "tcp"
    }

    fn link_stats(&self, peer: usize) -> Vec<super::CableStats> {
        self.cables(peer)
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn peer_addr(&self, peer: usize) -> String {
        self.peers[peer].addr.clone()
    }

    fn connected(&self, peer: usize) -> bool {
        peer < self.size && !self.links[peer].is_empty()
    }

    fn full_mesh(&self) -> bool {
        self.topology == Topology::FullMesh || self.size <= 3
    }

    fn cable_report(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (p, plan) in self.plans.iter().enumerate() {
            let (sw, rw) = plan
                .stats
                .iter()
                .fold((0u64, 0u64), |(s, r), c| (s + u64::from(c.send_weight), r + u64::from(c.recv_weight)));
            for c in &plan.stats {
                let mbit = |bps: f64| if bps > 0.0 { format!("{:.0} Mbit/s", bps * 8e-6) } else { "-".into() };
                let rtt = if c.rtt_us > 0.0 { format!("{:.0} µs", c.rtt_us) } else { "-".into() };
                out.push(format!(
                    "peer {p} connection {}: {} -> {}, round trip {rtt}, to peer {} ({:.0}% of stripes), from peer {} ({:.0}%){}",
                    c.conn,
                    c.local,
                    c.remote,
                    mbit(c.send_bps),
                    100.0 * f64::from(c.send_weight) / sw.max(1) as f64,
                    mbit(c.recv_bps),
                    100.0 * f64::from(c.recv_weight) / rw.max(1) as f64,
                    if c.conn == plan.small { ", small messages" } else { "" },
                ));
            }
        }
        out
    }

    fn exchange(&self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>]) -> Result<()> {
        validate_ops(self, sends, recvs, self.max_message)?;
        let _busy = BusyGuard::enter(&self.busy)?;
        let _quiet = self.quiet.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(err) = self.failed.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(err);
        }
        self.run(sends, recvs).map_err(|e| self.fail(e))
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.watcher.take() {
            // Wakes the watcher from its poll at once.
            if let Some(l) = &self.listener {
                // SAFETY: shutting down a socket we own; it is not used after.
                unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
            }
            let _ = w.join();
        }
        for conn in self.links.iter().flatten() {
            conn.shutdown();
        }
    }
}

pub(crate) fn stopped() -> CommError {
    CommError::invalid("bootstrap stopped")
}

/// Blocking socket with timeouts, used during the handshake only.
struct HandshakeStream<'a> {
    stream: &'a mut TcpStream,
    peer: PeerId,
    timeout: Duration,
}

impl HandshakeStream<'_> {
    fn map(&self, e: std::io::Error) -> CommError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => self.peer.timeout(self.timeout, "during the handshake"),
            ErrorKind::UnexpectedEof => self.peer.lost("it closed the connection during the handshake"),
            _ => self.peer.lost(format!("{e} during the handshake")),
        }
    }
}

impl HandshakeIo for HandshakeStream<'_> {
    fn write_all(&mut self, data: &[u8]) -> Result<()> {
        self.stream.write_all(data).map_err(|e| self.map(e))
    }
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        self.stream.read_exact(buf).map_err(|e| self.map(e))
    }
}

pub(super) fn run_handshake(
    cfg: &TcpConfig,
    stream: &mut TcpStream,
    conn: usize,
    conns: usize,
    flags: u32,
    fallback: PeerId,
    peer_of: &dyn Fn(Option<usize>) -> Result<PeerId>,
) -> Result<(usize, usize, usize, u32)> {
    let set = |s: &TcpStream| -> std::io::Result<()> {
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(cfg.handshake_timeout))?;
        s.set_write_timeout(Some(cfg.handshake_timeout))
    };
    set(stream).map_err(|e| fallback.lost(format!("{e} while preparing the socket")))?;
    let mut ours = Hello::new(cfg.protocol_version, cfg.rank, cfg.size, conn, conns, cfg.fingerprint)?;
    ours.flags = flags;
    let mut io = HandshakeStream { stream, peer: fallback, timeout: cfg.handshake_timeout };
    let (theirs, _) = handshake(&mut io, &ours, &cfg.secret, peer_of)?;
    Ok((theirs.rank as usize, theirs.conn as usize, theirs.conns as usize, theirs.flags))
}

/// Accepts `expected` connections from higher ranks and handshakes each.
/// Where our heartbeats go: every address of every rank (each cable's), so
/// that a peer goes silent only when all its cables are down.
fn beacon_targets(cfg: &TcpConfig) -> Vec<Vec<String>> {
    cfg.peers.iter().enumerate().map(|(r, a)| all_addresses(&cfg.links, cfg.rank, r, a)).collect()
}

fn accept_all(
    cfg: &TcpConfig,
    listener: &TcpListener,
    peers: &[PeerId],
    neighbours: &[bool],
    expected: usize,
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<Vec<(usize, usize, TcpStream)>> {
    let mut got: Vec<(usize, usize, TcpStream)> = Vec::new();
    listener.set_nonblocking(true).map_err(|e| CommError::io("configuring listener", e))?;
    while got.len() < expected {
        if stop.load(Ordering::Relaxed) {
            return Err(stopped());
        }
        let (mut stream, remote) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = missing_ranks(cfg, neighbours, &got);
                    let p = &peers[missing[0]];
                    return Err(CommError::Connect {
                        rank: p.rank,
                        addr: p.addr.clone(),
                        waited: cfg.connect_timeout,
                        detail: format!("ranks {missing:?} never connected to us"),
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => return Err(CommError::io("accepting a connection", e)),
        };
        let stranger = PeerId::new(usize::MAX, remote.to_string());
        let peer_of = |claimed: Option<usize>| match claimed {
            Some(r) if r < cfg.size && r > cfg.rank && neighbours[r] => Ok(peers[r].clone()),
            Some(r) if r < cfg.size => Err(peers[r].handshake(format!(
                "it connected to rank {} but should not (rank order or topology differ)",
                cfg.rank
            ))),
            Some(_) | None => Err(stranger.handshake("not a shardlm process")),
        };
        // We learn who connected from their hello, so we announce no count
        // and check theirs against ours for that rank here.
        match run_handshake(cfg, &mut stream, CONN_ANY, CONN_ANY, 0, stranger.clone(), &peer_of) {
            // A connection resuming one of a world we are not part of yet: stale.
            Ok((_, _, _, flags)) if flags & FLAG_RESUME != 0 => continue,
            Ok((rank, conn, conns, _)) => {
                if conns != cfg.conns_for(rank) {
                    return Err(peers[rank].handshake(format!(
                        "it opens {conns} connections to us, we expect {} (connections per peer or cables differ)",
                        cfg.conns_for(rank)
                    )));
                }
                if got.iter().any(|(r, c, _)| *r == rank && *c == conn) {
                    return Err(peers[rank].handshake(format!("it opened connection {conn} twice")));
                }
                got.push((rank, conn, stream));
            }
            // Strangers (port scanners, health checks) are dropped, not fatal.
            Err(e) if e.peer() == Some(usize::MAX) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn missing_ranks(cfg: &TcpConfig, neighbours: &[bool], got: &[(usize, usize, TcpStream)]) -> Vec<usize> {
    (cfg.rank + 1..cfg.size)
        .filter(|&r| neighbours[r] && got.iter().filter(|(g, _, _)| *g == r).count() < cfg.conns_for(r))
        .collect()
}

/// Connects to every lower-ranked neighbour, retrying until the deadline.
fn connect_down(
    cfg: &TcpConfig,
    peers: &[PeerId],
    neighbours: &[bool],
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<Vec<(usize, usize, TcpStream)>> {
    let mut out = Vec::new();
    for p in (0..cfg.rank).filter(|&p| neighbours[p]) {
        let conns = cfg.conns_for(p);
        for conn in 0..conns {
            // Our cable for this connection first, then the others.
            let cables = common_cables(&cfg.links, cfg.rank, p);
            let routes: Vec<_> =
                (0..cables).map(|d| route(&cfg.links, cfg.rank, p, &peers[p].addr, conn + d)).collect();
            let mut stream = dial(&peers[p], &routes, deadline, stop)?;
            let peer_of = |claimed: Option<usize>| match claimed {
                Some(r) if r == p => Ok(peers[p].clone()),
                Some(r) => Err(peers[p].handshake(format!("it claims rank {r}; check the order of the peer list"))),
                None => Err(peers[p].handshake("it is not a shardlm process (bad magic)")),
            };
            // The acceptor learns our connection index from our hello and checks
            // it against its own, so both sides announce the same index.
            run_handshake(cfg, &mut stream, conn, conns, 0, peers[p].clone(), &peer_of)?;
            out.push((p, conn, stream));
        }
    }
    Ok(out)
}

/// Non-blocking, no Nagle, and keep-alive probes tight enough to notice a
/// silently dead host within a few seconds.
pub(super) fn tune_socket(stream: &TcpStream, keepalive: Option<Duration>) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    stream.set_nonblocking(true)?;
    if let Some(idle) = keepalive {
        let fd = stream.as_raw_fd();
        let idle_s = idle.as_secs().max(1) as libc::c_int;
        let user_timeout_ms = (idle_s as libc::c_uint + 3) * 1000;
        let set = |level, name, value: libc::c_int| -> std::io::Result<()> {
            // SAFETY: `value` is a valid c_int for the duration of the call.
            let rc = unsafe {
                libc::setsockopt(fd, level, name, (&value as *const libc::c_int).cast(), size_of::<libc::c_int>() as _)
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
        set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_s)?;
        set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1)?;
        set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3)?;
        set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, user_timeout_ms as libc::c_int)?;
    }
    Ok(())
}
