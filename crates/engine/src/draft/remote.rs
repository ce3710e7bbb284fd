//! A draft model on another rank of the cluster (`--draft-rank R`).
//!
//! Rank R loads the draft model beside its shard ([`ModelDrafter`], the
//! same drafter `--draft-model` runs on rank 0) and answers `OP_DRAFT`
//! between steps: rank 0 sends a sequence's history and `k`, rank R decodes
//! up to `k` tokens greedily and sends them back with its drafting cost. The
//! draft model's memory and cores then leave rank 0, which in a cluster of
//! several machines is often the fullest one.
//!
//! # Why R reads rank 0 directly, and why only with no step in flight
//! `OP_DRAFT` travels on the step protocol's own streams, so it needs no
//! connection of its own and survives a cluster's re-formation as every op
//! does. Two rules keep it from mixing with steps:
//! - R must read its commands from rank 0 directly: a rank of the embedding
//!   stage (any rank under tensor parallelism, the last stage's in a
//!   pipeline). A middle stage reads from the stage before it.
//! - Rank 0 asks only when no step is in flight: in a pipeline of two the
//!   draft rank's stream to rank 0 also carries the residual stream of the
//!   micro-batches it ran, and a reply queued behind one would be read as
//!   it. One stream decoding alone always drafts (its draft needs the last
//!   verify step's tokens anyway); with other micro-batches in flight a
//!   sequence decodes without a draft for that step.
//!
//! Messages: the header (`op` 7, `n` history tokens, `chunk` = k), then
//! the `n` tokens; the reply is [`REPLY_WORDS`] u32s: count, the cost's f32
//! bits (negative: rank R has no draft model), the tokens, padding.

use super::{ModelDrafter, MAX_DRAFT};
use crate::dist::{comm_err, Header, OP_DRAFT};
use crate::generate::Engine;
use crate::EngineError;

/// Words of a reply: count, cost bits, up to [`MAX_DRAFT`] tokens.
pub(crate) const REPLY_WORDS: usize = 2 + MAX_DRAFT;

/// Rank 0's side: drafts by asking rank `rank`.
#[derive(Debug)]
pub struct RemoteDrafter {
    rank: usize,
    cost: f32,
    warned: bool,
}

impl RemoteDrafter {
    /// Rank 0: checks that rank `rank` can draft (it reads rank 0's commands
    /// directly and loaded the draft model) and learns its drafting cost.
    pub fn connect(engine: &mut Engine, rank: usize) -> Result<RemoteDrafter, EngineError> {
        let c = engine
            .cluster
            .as_ref()
            .ok_or_else(|| EngineError::BadArgument("--draft-rank needs a cluster (--ranks N or a launch)".into()))?;
        let direct: Vec<usize> = c.embed_stage_ranks().collect();
        if !direct.contains(&rank) {
            let which = direct.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
            return Err(EngineError::BadArgument(format!(
                "--draft-rank {rank}: the draft model runs on a rank that reads rank 0's commands directly \
                 (here: {which}; rank 0 itself is the default)"
            )));
        }
        let (_, cost) = ask(engine, rank, &[], 0)?;
        if cost < 0.0 {
            return Err(EngineError::BadArgument(format!(
                "--draft-rank {rank}: rank {rank} could not load the draft model (its log says why)"
            )));
        }
        tracing::info!("draft model on rank {rank}: a drafted token costs {cost:.2} target decode steps");
        Ok(RemoteDrafter { rank, cost, warned: false })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// A drafted token's cost, in target decode steps (rank R's estimate).
    pub fn cost(&self) -> f32 {
        self.cost
    }

    /// Up to `k` tokens to follow `history`. Call only with no step in
    /// flight (see the module notes). A failure (a lost rank) gives no
    /// draft; the next step then meets the failure and the cluster recovers.
    pub fn propose(&mut self, engine: &mut Engine, history: &[u32], k: usize) -> Vec<u32> {
        match ask(engine, self.rank, history, k) {
            Ok((tokens, _)) => tokens,
            Err(e) => {
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!("the draft rank {} failed ({e}); steps go without a draft", self.rank);
                }
                Vec::new()
            }
        }
    }
}

/// One request to rank `rank`: `(tokens, cost)`.
fn ask(engine: &mut Engine, rank: usize, history: &[u32], k: usize) -> Result<(Vec<u32>, f32), EngineError> {
    let c = engine.cluster.as_ref().ok_or_else(|| EngineError::BadArgument("no cluster".into()))?;
    let h = Header { op: OP_DRAFT, n: history.len() as u32, chunk: k.min(MAX_DRAFT) as u32, ..Default::default() };
    c.send_header(rank, h)?;
    if !history.is_empty() {
        c.world.send(rank, bytemuck::cast_slice(history)).map_err(comm_err)?;
    }
    let mut reply = [0u32; REPLY_WORDS];
    c.world.recv(rank, bytemuck::cast_slice_mut(&mut reply)).map_err(comm_err)?;
    let n = (reply[0] as usize).min(MAX_DRAFT).min(k);
    Ok((reply[2..2 + n].to_vec(), f32::from_bits(reply[1])))
}

/// Rank R's side of one request (`history` empty: the greeting of
/// [`RemoteDrafter::connect`]): the reply words.
pub(crate) fn answer(drafter: Option<&mut ModelDrafter>, history: &[u32], k: usize) -> [u32; REPLY_WORDS] {
    let mut reply = [0u32; REPLY_WORDS];
    let Some(d) = drafter else {
        reply[1] = (-1f32).to_bits();
        return reply;
    };
    let tokens = if history.is_empty() { Vec::new() } else { super::Drafter::propose(d, history, k.min(MAX_DRAFT)) };
    let n = tokens.len().min(MAX_DRAFT);
    reply[0] = n as u32;
    reply[1] = super::Drafter::cost(d).to_bits();
    reply[2..2 + n].copy_from_slice(&tokens[..n]);
    reply
}
