//! Point-to-point transports: the only layer that knows how bytes move.
//!
//! A transport connects a fixed set of `size` processes (its "world"). It offers
//! exactly one primitive, [`Transport::exchange`], which performs a batch of
//! sends and receives *concurrently*: a collective step such as "send my chunk
//! to the right while receiving one from the left" is a single call, and no
//! transport may deadlock on it however large the messages are. `send`, `recv`
//! and `send_recv` are conveniences over it.
//!
//! Messages are framed and exact: a receive names the length it expects, and a
//! frame of any other length is a [`CommError::Protocol`](crate::CommError)
//! error (it means the ranks called collectives in different orders).
//!
//! Implementations:
//! - [`local`]: ranks are threads of one process, linked by channels (tests).
//! - [`tcp`]: ranks anywhere, linked by authenticated TCP connections, with
//!   several connections per peer and large messages striped across them.
//! - [`shm`]: ranks on one host, linked by single-producer single-consumer
//!   rings in a shared-memory segment; the lowest-latency path.
//!
//! **Adding a transport** (the MPI seam): write `src/transport/mpi.rs`
//! implementing [`Transport`] (`exchange` maps to `MPI_Isend`/`MPI_Irecv` plus
//! `MPI_Waitall`, with one tag per (peer, direction) so per-peer order holds),
//! declare it here as `#[cfg(feature = "mpi")] pub mod mpi;`, add the feature
//! line `mpi = ["dep:mpi"]` to this crate's `Cargo.toml`, and a
//! `Group::connect_mpi` constructor. Nothing above this module changes: the
//! collectives in [`crate::Group`] are written once against this trait.
//!
//! Concurrency: a transport carries one stream of operations at a time. Groups
//! split from one another share their transport, so every rank must issue
//! their operations in the same order, from one thread at a time (as with MPI
//! communicators). Transports detect concurrent use and return an error.

pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod shm;
pub mod tcp;
mod tcp_beacon;
mod tcp_cables;
pub use tcp_cables::CableStats;
mod tcp_io;
mod tcp_resume;

use crate::error::Result;

/// One outgoing message of an [`Transport::exchange`] batch.
#[derive(Debug, Clone, Copy)]
pub struct SendOp<'a> {
    /// World rank of the destination.
    pub peer: usize,
    pub data: &'a [u8],
}

/// One incoming message of an [`Transport::exchange`] batch.
#[derive(Debug)]
pub struct RecvOp<'a> {
    /// World rank of the source.
    pub peer: usize,
    /// Filled completely; the incoming message must have exactly this length.
    pub buf: &'a mut [u8],
}

/// A point-to-point link between the `size` ranks of one world.
pub trait Transport: Send + Sync {
    /// This process's rank in the world, `0..size`.
    fn rank(&self) -> usize;

    /// Number of ranks in the world.
    fn size(&self) -> usize;

    /// A printable address of `peer` for messages ("127.0.0.1:5001", "shm:job").
    fn peer_addr(&self, peer: usize) -> String;

    /// Whether this rank can exchange messages with `peer` directly. Transports
    /// built as a ring only reach their two neighbours.
    fn connected(&self, peer: usize) -> bool {
        peer != self.rank() && peer < self.size()
    }

    /// Whether every pair of ranks is directly connected. Must give the same
    /// answer on every rank: collectives choose their algorithms by it.
    fn full_mesh(&self) -> bool {
        true
    }

    /// One line per connection to each peer, with what was measured on it
    /// (addresses, round trip, throughput, share of striped messages), for
    /// `--verbose`. Empty for transports without such connections.
    fn cable_report(&self) -> Vec<String> {
        Vec::new()
    }

    /// What this transport is, for `GET /cluster`: "tcp", "shm", "mpi" or "local".
    fn kind(&self) -> &'static str {
        "?"
    }

    /// The connections to `peer` with what was measured on them when
    /// connecting (empty for transports without such connections).
    fn link_stats(&self, _peer: usize) -> Vec<CableStats> {
        Vec::new()
    }

    /// Performs all `sends` and `recvs` concurrently and returns when all are
    /// complete. Messages between the same pair of ranks in the same direction
    /// are delivered in the order given. Any error leaves the transport failed:
    /// later calls return the same error.
    fn exchange(&self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>]) -> Result<()>;

    /// Sends one message to `peer`.
    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.exchange(&[SendOp { peer, data }], &mut [])
    }

    /// Receives one message of exactly `buf.len()` bytes from `peer`.
    fn recv(&self, peer: usize, buf: &mut [u8]) -> Result<()> {
        self.exchange(&[], &mut [RecvOp { peer, buf }])
    }

    /// Sends to one peer while receiving from another (or the same) peer.
    fn send_recv(&self, to: usize, data: &[u8], from: usize, buf: &mut [u8]) -> Result<()> {
        self.exchange(&[SendOp { peer: to, data }], &mut [RecvOp { peer: from, buf }])
    }
}

/// Checks the peers and sizes of an exchange batch against a world.
pub(crate) fn validate_ops(
    t: &dyn Transport,
    sends: &[SendOp<'_>],
    recvs: &[RecvOp<'_>],
    max_message: usize,
) -> Result<()> {
    use crate::error::CommError;
    let peers = sends.iter().map(|s| (s.peer, s.data.len())).chain(recvs.iter().map(|r| (r.peer, r.buf.len())));
    for (peer, len) in peers {
        if peer >= t.size() || peer == t.rank() {
            return Err(CommError::invalid(format!(
                "rank {} cannot exchange with rank {peer} in a world of {}",
                t.rank(),
                t.size()
            )));
        }
        if !t.connected(peer) {
            return Err(CommError::invalid(format!(
                "rank {} has no connection to rank {peer} (ring topology reaches only neighbours)",
                t.rank()
            )));
        }
        if len > max_message {
            return Err(CommError::TooLarge { len, max: max_message });
        }
    }
    Ok(())
}

/// Marks a transport busy for the duration of one exchange, refusing a second
/// concurrent user (which would interleave frames).
pub(crate) struct BusyGuard<'a>(&'a std::sync::atomic::AtomicBool);

impl<'a> BusyGuard<'a> {
    pub fn enter(flag: &'a std::sync::atomic::AtomicBool) -> Result<BusyGuard<'a>> {
        use std::sync::atomic::Ordering;
        if flag.swap(true, Ordering::Acquire) {
            return Err(crate::error::CommError::invalid(
                "transport used from two threads at once; issue operations of groups sharing a transport from one thread",
            ));
        }
        Ok(BusyGuard(flag))
    }
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}
