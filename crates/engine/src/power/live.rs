//! Live power of every rank, for rank 0's `GET /cluster`: each rank answers
//! an idle server's ping (`engine::dist`, `OP_PING`) with "pong" and then its
//! latest reading, a [`PowerSnapshot`]: a 4-byte little-endian length, then
//! that many bytes of JSON. Rank 0 keeps the latest one per rank ([`record`],
//! [`latest`]).

use super::{global, PhaseEnergy};
use comm::Group;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A snapshot longer than this is refused (a real one is a few hundred bytes).
pub const MAX_SNAPSHOT_BYTES: usize = 64 << 10;

/// One rank's power as it reads it now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PowerSnapshot {
    /// Where the rank runs: ranks on one host read the same package or board.
    pub host: String,
    /// What it reads ("rapl package-0", …); empty when nothing.
    pub sources: Vec<String>,
    /// Why nothing is readable there (`None` when `sources` are read).
    pub reason: Option<String>,
    /// Mean watts over the last second (`None` before the first interval).
    pub watts: Option<f64>,
    /// Joules since the rank's meter started (a counter: its difference
    /// between two snapshots is the energy in between).
    pub joules: f64,
    /// Its prefill and decode steps' energy since it started.
    pub phases: [PhaseEnergy; 2],
}

impl PowerSnapshot {
    /// This process's reading (its meter starts on first use).
    pub fn here() -> PowerSnapshot {
        let host = crate::rank_info::hostname();
        match global() {
            Ok(m) => PowerSnapshot {
                host,
                sources: m.sources.clone(),
                reason: None,
                watts: m.watts_recent(),
                joules: m.joules_total(),
                phases: m.phases(),
            },
            Err(e) => PowerSnapshot { host, reason: Some(e.to_string()), ..Default::default() },
        }
    }
}

/// A snapshot that came back wrong.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("a {0}-byte power snapshot is longer than {MAX_SNAPSHOT_BYTES} bytes")]
    TooLong(usize),
    #[error("a power snapshot that is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The length prefix and the JSON of `s`.
pub fn encode(s: &PowerSnapshot) -> Result<([u8; 4], Vec<u8>), SnapshotError> {
    let body = serde_json::to_vec(s)?;
    if body.len() > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLong(body.len()));
    }
    Ok(((body.len() as u32).to_le_bytes(), body))
}

/// The body length a prefix announces, if it is acceptable.
pub fn body_len(prefix: [u8; 4]) -> Result<usize, SnapshotError> {
    let n = u32::from_le_bytes(prefix) as usize;
    if n > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLong(n));
    }
    Ok(n)
}

pub fn decode(body: &[u8]) -> Result<PowerSnapshot, SnapshotError> {
    Ok(serde_json::from_slice(body)?)
}

/// A rank's half of the ping: sends this process's snapshot to rank 0 (after
/// its "pong").
pub fn send_reading(world: &Group) -> Result<(), crate::EngineError> {
    let (len, body) = encode(&PowerSnapshot::here()).map_err(|e| crate::EngineError::BadArgument(e.to_string()))?;
    world.send(0, &len).map_err(crate::dist::comm_err)?;
    world.send(0, &body).map_err(crate::dist::comm_err)
}

/// Rank 0's half: receives rank `r`'s snapshot (after its "pong") and keeps it.
/// A malformed one is a cluster failure, as a wrong "pong" is.
pub fn recv_reading(world: &Group, r: usize) -> Result<(), crate::EngineError> {
    let bad = |e: SnapshotError| {
        crate::dist::comm_err(comm::CommError::InvalidArgument(format!("rank {r}'s power snapshot: {e}")))
    };
    let mut len = [0u8; 4];
    world.recv(r, &mut len).map_err(crate::dist::comm_err)?;
    let mut body = vec![0u8; body_len(len).map_err(bad)?];
    world.recv(r, &mut body).map_err(crate::dist::comm_err)?;
    record(r, decode(&body).map_err(bad)?);
    Ok(())
}

/// The latest snapshot of each rank and when it arrived (rank 0's process).
static LATEST: Mutex<Vec<Option<(Instant, PowerSnapshot)>>> = Mutex::new(Vec::new());

/// Keeps `s` as rank `rank`'s latest reading.
pub fn record(rank: usize, s: PowerSnapshot) {
    let mut g = LATEST.lock().unwrap_or_else(|e| e.into_inner());
    if g.len() <= rank {
        g.resize(rank + 1, None);
    }
    g[rank] = Some((Instant::now(), s));
}

/// Rank `rank`'s latest reading and how old it is (`None` before the first).
pub fn latest(rank: usize) -> Option<(Duration, PowerSnapshot)> {
    let g = LATEST.lock().unwrap_or_else(|e| e.into_inner());
    g.get(rank)?.as_ref().map(|(t, s)| (t.elapsed(), s.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PowerSnapshot {
        PowerSnapshot {
            host: "mac-b".into(),
            sources: vec!["rapl package-0".into()],
            reason: None,
            watts: Some(31.5),
            joules: 1234.5,
            phases: [
                PhaseEnergy { joules: 10.0, seconds: 0.5, peak_w: 25.0, tokens: 64 },
                PhaseEnergy { joules: 40.0, seconds: 2.0, peak_w: 22.0, tokens: 48 },
            ],
        }
    }

    #[test]
    fn a_snapshot_round_trips_through_its_wire_form() {
        let s = sample();
        let (len, body) = encode(&s).unwrap();
        assert_eq!(body_len(len).unwrap(), body.len());
        assert_eq!(decode(&body).unwrap(), s);
        let none = PowerSnapshot { host: "h".into(), reason: Some("no sensor".into()), ..Default::default() };
        let (_, body) = encode(&none).unwrap();
        assert_eq!(decode(&body).unwrap(), none);
    }

    #[test]
    fn a_bad_snapshot_is_an_error_not_a_panic() {
        assert!(matches!(body_len((10u32 << 20).to_le_bytes()), Err(SnapshotError::TooLong(_))));
        assert!(matches!(decode(b"pong"), Err(SnapshotError::Json(_))));
        assert!(matches!(decode(b"{\"host\": 3}"), Err(SnapshotError::Json(_))));
    }

    #[test]
    fn the_latest_reading_per_rank_is_kept() {
        assert!(latest(77).is_none());
        record(77, sample());
        let mut s = sample();
        s.watts = Some(40.0);
        record(77, s);
        let (age, got) = latest(77).unwrap();
        assert!(age < Duration::from_secs(5));
        assert_eq!(got.watts, Some(40.0));
        assert!(latest(76).is_none());
    }
}
