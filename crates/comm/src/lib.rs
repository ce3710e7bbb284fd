//! # shardlm-comm: process groups, collectives and transports
//!
//! shardlm runs one model across several processes, on one host or many. Every
//! rank runs the same program; tensor-parallel layers end in an all-reduce,
//! pipeline stages hand activations on with send/recv, and rank 0 broadcasts
//! each step's work. This crate is that communication layer.
//!
//! ```text
//!   Group  (rank, size, split, all_reduce_sum_f32, all_gather, reduce_scatter,
//!           broadcast, send, recv, barrier)      ── written once, here
//!     │
//!   Transport::exchange  (concurrent batch of framed point-to-point messages)
//!     ├── LocalTransport  threads of one process (tests)
//!     ├── TcpTransport    authenticated TCP, N striped connections per peer
//!     ├── ShmTransport    SPSC rings in /dev/shm, spin-then-futex waiting
//!     └── (MPI)           behind a cargo feature, later: see `transport`
//! ```
//!
//! ## Why our own transports
//!
//! The transports are the product, not plumbing we could borrow:
//!
//! - **Latency.** A 30-layer model does ~60 small all-reduces per generated
//!   token; at batch 1 each one is a few KiB and pure latency. A generic RPC or
//!   message-queue layer costs tens of microseconds per exchange; the
//!   shared-memory rings here cost a few, and the collectives pick a one-round
//!   direct exchange for small payloads instead of a ring's 2(n-1) rounds.
//! - **Authentication.** Ranks exchange activations and, on rank 0's word,
//!   run work. Every connection proves knowledge of a cluster secret with an
//!   HMAC-SHA256 challenge-response in both directions (the secret never
//!   crosses the wire) and checks protocol version and model fingerprint, so a
//!   misconfigured or foreign process is refused with a one-line reason.
//!   llama.cpp's RPC has no authentication at all.
//! - **Striping.** Several TCP connections per peer, each driven by its own
//!   thread, let two cables or NIC queues add up (MLX's ring does the same).
//! - **Failure.** A dead peer must produce an error naming it within seconds,
//!   never a hang or an abort of the survivors. Closed sockets, keep-alive
//!   probes, kernel-released liveness locks and abort notices all feed that.
//! - **Determinism.** All ranks must get bit-identical sums, or their replicated
//!   state (sampled tokens, KV caches) drifts apart. We control summation order.
//!
//! ## Using it
//!
//! Pass a [`Group`] explicitly (there is no hidden global group). A group of
//! one ([`Group::single`]) turns every collective into a no-op, so single- and
//! multi-process runs share one code path.
//!
//! ```
//! use shardlm_comm::Group;
//! let groups = Group::local(2);
//! let handles: Vec<_> = groups
//!     .into_iter()
//!     .map(|g| std::thread::spawn(move || {
//!         let mut x = vec![g.rank() as f32 + 1.0; 4];
//!         g.all_reduce_sum_f32(&mut x).unwrap();
//!         x
//!     }))
//!     .collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap(), vec![3.0; 4]);
//! }
//! ```
//!
//! Real worlds come from [`Group::connect_tcp`], [`Group::connect_shm`] or,
//! for processes started by a launcher, [`Group::from_env`] (see [`bootstrap`]).
//! Values travel in native byte order; all ranks must be little-endian.

#[cfg(target_endian = "big")]
compile_error!("shardlm-comm sends f32 in native byte order and supports little-endian hosts only");

pub mod bootstrap;
mod collectives;
mod error;
mod group;
mod handshake;
pub mod hostfile;
pub mod transport;
pub mod wire;

pub use bootstrap::Bootstrap;
pub use collectives::chunk_range;
pub use error::{CommError, Result};
pub use group::{bytes_sent, Group, Tuning};
pub use handshake::PROTOCOL_VERSION;
pub use hostfile::Hostfile;
pub use transport::local::LocalTransport;
pub use transport::shm::{ShmConfig, ShmTransport};
pub use transport::tcp::{TcpConfig, TcpTransport, Topology};
pub use transport::Transport;
pub use wire::Wire;
