//! [`Group`]: an ordered set of ranks over one transport, and its collectives.
//!
//! The collectives are written once, here and in `collectives.rs`, against
//! [`Transport::exchange`]; every transport gets all of them. A group of size 1
//! returns from every collective at once, so single-process inference runs the
//! same code path as distributed inference.

use crate::error::{CommError, Result};
use crate::transport::local::LocalTransport;
use crate::transport::shm::{ShmConfig, ShmTransport};
use crate::transport::tcp::{TcpConfig, TcpTransport};
use crate::transport::{RecvOp, SendOp, Transport};
use crate::wire::Wire;
use std::sync::Arc;

/// Algorithm thresholds. Every rank of a group must use the same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Messages up to this many bytes take the latency path (one direct
    /// exchange, or recursive doubling); longer ones take the ring.
    pub small_bytes: usize,
    /// Up to this many ranks the latency path is a single all-to-all exchange;
    /// beyond it, recursive doubling (log2 rounds).
    pub direct_max_ranks: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { small_bytes: 64 << 10, direct_max_ranks: 8 }
    }
}

/// An ordered set of ranks that run collectives together.
///
/// Cloning is cheap and yields the same group (same transport). Groups made by
/// [`Group::split`] share their parent's transport: issue operations on all
/// groups of one transport from one thread, in the same order on every rank.
/// Any error is fatal to the transport (and so to every group on it).
/// Bytes this process has handed to its transport, over every group (each
/// rank is one process). Wire-traffic figures (`bench`) read its differences.
static BYTES_SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes this process has sent to other ranks so far (payloads, before any
/// transport framing).
pub fn bytes_sent() -> u64 {
    BYTES_SENT.load(std::sync::atomic::Ordering::Relaxed)
}

#[derive(Clone)]
pub struct Group {
    pub(crate) transport: Arc<dyn Transport>,
    /// World rank of each group rank.
    pub(crate) members: Arc<[usize]>,
    pub(crate) rank: usize,
    pub(crate) wire: Wire,
    pub(crate) tuning: Tuning,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank)
            .field("size", &self.members.len())
            .field("members", &self.members)
            .field("wire", &self.wire)
            .finish()
    }
}

impl Group {
    /// The group of all ranks of `transport`.
    pub fn new(transport: Arc<dyn Transport>) -> Group {
        let members: Arc<[usize]> = (0..transport.size()).collect();
        let rank = transport.rank();
        Group { transport, members, rank, wire: Wire::F32, tuning: Tuning::default() }
    }

    /// A group of one: every collective returns its input.
    pub fn single() -> Group {
        Group::new(Arc::new(LocalTransport::world(1).pop().expect("one rank")))
    }

    /// `size` groups linked in-process (one per thread), index = rank.
    pub fn local(size: usize) -> Vec<Group> {
        LocalTransport::world(size).into_iter().map(|t| Group::new(Arc::new(t))).collect()
    }

    /// Joins a TCP world; see [`TcpConfig`].
    pub fn connect_tcp(cfg: &TcpConfig) -> Result<Group> {
        Ok(Group::new(Arc::new(TcpTransport::connect(cfg)?)))
    }

    /// Joins a shared-memory world on this host; see [`ShmConfig`].
    pub fn connect_shm(cfg: &ShmConfig) -> Result<Group> {
        Ok(Group::new(Arc::new(ShmTransport::connect(cfg)?)))
    }

    /// This process's rank in the group, `0..size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The world (transport) rank of group rank `r`, as named in errors.
    pub fn world_rank(&self, r: usize) -> usize {
        self.members[r]
    }

    /// The transport under this group.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// The encoding used for all-reduce payloads.
    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// The same group with another default all-reduce encoding (all ranks must agree).
    pub fn with_wire(mut self, wire: Wire) -> Group {
        self.wire = wire;
        self
    }

    /// The same group with other algorithm thresholds (all ranks must agree).
    pub fn with_tuning(mut self, tuning: Tuning) -> Group {
        self.tuning = tuning;
        self
    }

    pub(crate) fn mesh(&self) -> bool {
        self.transport.full_mesh()
    }

    pub(crate) fn small(&self, bytes: usize) -> bool {
        self.mesh() && bytes <= self.tuning.small_bytes
    }

    /// Runs one exchange; peers are group ranks.
    pub(crate) fn xchg(&self, sends: &[(usize, &[u8])], recvs: &mut [(usize, &mut [u8])]) -> Result<()> {
        let sent: usize = sends.iter().map(|(_, d)| d.len()).sum();
        BYTES_SENT.fetch_add(sent as u64, std::sync::atomic::Ordering::Relaxed);
        let s: Vec<SendOp> = sends.iter().map(|&(p, data)| SendOp { peer: self.members[p], data }).collect();
        let mut r: Vec<RecvOp> =
            recvs.iter_mut().map(|(p, buf)| RecvOp { peer: self.members[*p], buf: &mut buf[..] }).collect();
        self.transport.exchange(&s, &mut r)
    }

    /// Group rank `self.rank + delta` modulo the size.
    pub(crate) fn rel(&self, delta: isize) -> usize {
        let n = self.size() as isize;
        ((self.rank as isize + delta).rem_euclid(n)) as usize
    }

    /// Splits into sub-groups: ranks passing the same `color` form one group,
    /// ordered by `key` and then by their rank here. Collective: every rank
    /// of this group must call it.
    pub fn split(&self, color: u32, key: u32) -> Result<Group> {
        let mut mine = [0u8; 8];
        mine[..4].copy_from_slice(&color.to_le_bytes());
        mine[4..].copy_from_slice(&key.to_le_bytes());
        let mut all = vec![0u8; 8 * self.size()];
        self.all_gather(&mine, &mut all)?;
        let mut chosen: Vec<(u32, usize)> = all
            .chunks_exact(8)
            .enumerate()
            .filter(|(_, b)| b[..4] == color.to_le_bytes())
            .map(|(r, b)| (u32::from_le_bytes(b[4..].try_into().unwrap()), r))
            .collect();
        chosen.sort_unstable();
        let rank = chosen.iter().position(|&(_, r)| r == self.rank).expect("we chose our own color");
        let members: Arc<[usize]> = chosen.iter().map(|&(_, r)| self.members[r]).collect();
        Ok(Group { transport: self.transport.clone(), members, rank, wire: self.wire, tuning: self.tuning })
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.size() || peer == self.rank {
            return Err(CommError::invalid(format!(
                "rank {} cannot address rank {peer} in a group of {}",
                self.rank,
                self.size()
            )));
        }
        Ok(())
    }

    /// Sends `data` to group rank `peer`.
    pub fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.xchg(&[(peer, data)], &mut [])
    }

    /// Receives exactly `buf.len()` bytes from group rank `peer`.
    pub fn recv(&self, peer: usize, buf: &mut [u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.xchg(&[], &mut [(peer, buf)])
    }

    /// Sends to `to` while receiving from `from`, without risk of deadlock.
    pub fn send_recv(&self, to: usize, data: &[u8], from: usize, buf: &mut [u8]) -> Result<()> {
        self.check_peer(to)?;
        self.check_peer(from)?;
        self.xchg(&[(to, data)], &mut [(from, buf)])
    }

    /// Returns once every rank of the group has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        let n = self.size();
        if n == 1 {
            return Ok(());
        }
        if self.mesh() {
            // Dissemination: after round k each rank has heard from 2^(k+1) ranks.
            let mut dist = 1;
            while dist < n {
                self.xchg(&[(self.rel(dist as isize), &[])], &mut [(self.rel(-(dist as isize)), &mut [])])?;
                dist *= 2;
            }
        } else {
            for _ in 0..n - 1 {
                self.xchg(&[(self.rel(1), &[])], &mut [(self.rel(-1), &mut [])])?;
            }
        }
        Ok(())
    }

    /// Copies `buf` of group rank `root` into `buf` of every rank.
    pub fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        let n = self.size();
        if root >= n {
            return Err(CommError::invalid(format!("broadcast root {root} outside a group of {n}")));
        }
        if n == 1 {
            return Ok(());
        }
        if !self.mesh() {
            // Pass it along the ring.
            if self.rank != root {
                self.xchg(&[], &mut [(self.rel(-1), buf)])?;
            }
            if self.rel(1) != root {
                self.xchg(&[(self.rel(1), buf)], &mut [])?;
            }
            return Ok(());
        }
        if self.small(buf.len()) || n == 2 {
            if self.rank == root {
                let sends: Vec<(usize, &[u8])> = (0..n).filter(|&p| p != root).map(|p| (p, &buf[..])).collect();
                return self.xchg(&sends, &mut []);
            }
            return self.xchg(&[], &mut [(root, buf)]);
        }
        // Binomial tree on ranks relative to the root: log2(n) rounds.
        let v = (self.rank + n - root) % n;
        let abs = |x: usize| (x + root) % n;
        let mut mask = 1;
        while mask < n {
            if v < mask && v + mask < n {
                self.xchg(&[(abs(v + mask), &buf[..])], &mut [])?;
            } else if v >= mask && v < 2 * mask {
                self.xchg(&[], &mut [(abs(v - mask), &mut buf[..])])?;
            }
            mask *= 2;
        }
        Ok(())
    }

    /// Gathers `send` of every rank into `recv`, ordered by rank.
    /// `recv.len()` must be `size * send.len()`, the same `send.len()` everywhere.
    pub fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (n, len) = (self.size(), send.len());
        if recv.len() != n * len {
            return Err(CommError::invalid(format!(
                "all_gather: receive buffer of {} bytes for {n} ranks × {len} bytes",
                recv.len()
            )));
        }
        recv[self.rank * len..(self.rank + 1) * len].copy_from_slice(send);
        if n == 1 {
            return Ok(());
        }
        if self.small(len) {
            let sends: Vec<(usize, &[u8])> = (0..n).filter(|&p| p != self.rank).map(|p| (p, send)).collect();
            let mut recvs: Vec<(usize, &mut [u8])> =
                recv.chunks_mut(len.max(1)).take(n).enumerate().filter(|(p, _)| *p != self.rank).collect();
            if len == 0 {
                recvs = (0..n).filter(|&p| p != self.rank).map(|p| (p, &mut [][..])).collect();
            }
            return self.xchg(&sends, &mut recvs);
        }
        let chunks: Vec<std::ops::Range<usize>> = (0..n).map(|i| i * len..(i + 1) * len).collect();
        self.ring_all_gather_bytes(recv, &[crate::collectives::Lane { chunks, dir: 1, shift: n - 1 }])
    }

    /// [`Group::all_gather`] for `f32` values.
    pub fn all_gather_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        self.all_gather(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv))
    }
}
