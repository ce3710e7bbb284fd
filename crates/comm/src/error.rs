//! The one error type of this crate.
//!
//! Every variant renders as a single line that names the peer (by its rank in
//! the transport, i.e. the world rank, and its address) whenever a peer is
//! involved, so an operator reading a log knows which machine to look at.

use std::fmt;
use std::time::Duration;

/// Result alias used throughout the crate.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// What went wrong in a transport, a handshake, a collective or a config file.
///
/// Errors are `Clone`: a transport that fails remembers its first error and
/// returns it again from every later call (a failed group is never reused).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    /// The peer could not prove knowledge of the cluster secret (or we could not).
    #[error("peer {rank} at {addr} failed authentication (wrong cluster secret)")]
    AuthFailed { rank: usize, addr: String },
    /// The peer runs a different wire protocol version.
    #[error("peer {rank} at {addr} speaks protocol v{theirs}, we speak v{ours}")]
    VersionMismatch { rank: usize, addr: String, theirs: u32, ours: u32 },
    /// The peer loaded a different model (or a different shard plan).
    #[error("peer {rank} at {addr} has model fingerprint {theirs:016x}, we have {ours:016x}")]
    FingerprintMismatch { rank: usize, addr: String, theirs: u64, ours: u64 },
    /// Any other disagreement found during the handshake (group size, rank, magic).
    #[error("handshake with peer {rank} at {addr} failed: {detail}")]
    Handshake { rank: usize, addr: String, detail: String },
    /// Could not open a connection to the peer before the deadline.
    #[error("could not connect to peer {rank} at {addr} within {:.1}s: {detail}", .waited.as_secs_f64())]
    Connect { rank: usize, addr: String, waited: Duration, detail: String },
    /// The peer went away (connection closed or reset, process exited).
    #[error("peer {rank} at {addr} is gone: {detail}")]
    PeerLost { rank: usize, addr: String, detail: String },
    /// The peer told us it aborted (usually because it lost another peer).
    #[error("peer {rank} at {addr} aborted: {reason}")]
    PeerAborted { rank: usize, addr: String, reason: String },
    /// Nothing arrived from the peer within the configured time.
    #[error("peer {rank} at {addr} sent nothing for {:.1}s ({what})", .waited.as_secs_f64())]
    Timeout { rank: usize, addr: String, waited: Duration, what: String },
    /// The peer's heartbeats stopped: its process is stopped (SIGSTOP) or its
    /// host frozen, though its connections stay open (`transport::tcp_beacon`).
    #[error("peer {rank} at {addr} is hung: no heartbeat for {:.1}s (stopped, or its host frozen)", .silent.as_secs_f64())]
    Hung { rank: usize, addr: String, silent: Duration },
    /// The peer sent something we did not expect (collectives called in a different order?).
    #[error("protocol error with peer {rank} at {addr}: {detail}")]
    Protocol { rank: usize, addr: String, detail: String },
    /// A message larger than the configured cap.
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// The caller passed something inconsistent (buffer sizes, ranks, config).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A local operating-system failure (bind, mmap, ...).
    #[error("{context}: {detail}")]
    Io { context: String, detail: String },
    /// A hostfile could not be read or is malformed.
    #[error("hostfile {path}: {detail}")]
    Hostfile { path: String, detail: String },
    /// The launcher environment (`SHARDLM_*` variables) is malformed.
    #[error("environment: {0}")]
    Env(String),
}

impl CommError {
    /// The world rank of the peer this error is about, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            CommError::AuthFailed { rank, .. }
            | CommError::VersionMismatch { rank, .. }
            | CommError::FingerprintMismatch { rank, .. }
            | CommError::Handshake { rank, .. }
            | CommError::Connect { rank, .. }
            | CommError::PeerLost { rank, .. }
            | CommError::PeerAborted { rank, .. }
            | CommError::Timeout { rank, .. }
            | CommError::Hung { rank, .. }
            | CommError::Protocol { rank, .. } => Some(*rank),
            _ => None,
        }
    }

    pub(crate) fn io(context: impl fmt::Display, err: std::io::Error) -> CommError {
        CommError::Io { context: context.to_string(), detail: err.to_string() }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> CommError {
        CommError::InvalidArgument(msg.into())
    }
}

/// Identifies a peer in error messages: its world rank and a printable address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerId {
    pub rank: usize,
    pub addr: String,
}

impl PeerId {
    pub fn new(rank: usize, addr: impl Into<String>) -> PeerId {
        PeerId { rank, addr: addr.into() }
    }

    pub fn lost(&self, detail: impl Into<String>) -> CommError {
        CommError::PeerLost { rank: self.rank, addr: self.addr.clone(), detail: detail.into() }
    }

    pub fn protocol(&self, detail: impl Into<String>) -> CommError {
        CommError::Protocol { rank: self.rank, addr: self.addr.clone(), detail: detail.into() }
    }

    pub fn handshake(&self, detail: impl Into<String>) -> CommError {
        CommError::Handshake { rank: self.rank, addr: self.addr.clone(), detail: detail.into() }
    }

    pub fn timeout(&self, waited: Duration, what: impl Into<String>) -> CommError {
        CommError::Timeout { rank: self.rank, addr: self.addr.clone(), waited, what: what.into() }
    }

    pub fn aborted(&self, reason: impl Into<String>) -> CommError {
        CommError::PeerAborted { rank: self.rank, addr: self.addr.clone(), reason: reason.into() }
    }
}
