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
//! Messages: the header (`op` 7, `mode` = how many leading tokens of the
//! last history sent to stay, `n` tokens that follow them, `chunk` = k),
//! then the `n` tokens: a sequence decoding alone sends its new tokens only,
//! not its whole history (80 KB a step at 20,000 tokens). The reply is
//! [`REPLY_WORDS`] u32s: count ([`RESEND`]: rank R does not have the prefix,
//! as after a restart; rank 0 sends the whole history again), the cost's f32
//! bits (negative: rank R has no draft model), the tokens, padding.

use super::{ModelDrafter, MAX_DRAFT};
use crate::dist::{comm_err, Header, OP_DRAFT};
use crate::generate::Engine;
use crate::EngineError;

/// Words of a reply: count, cost bits, up to [`MAX_DRAFT`] tokens.
pub(crate) const REPLY_WORDS: usize = 2 + MAX_DRAFT;
/// A reply's count when rank R lacks the prefix it was told to keep.
const RESEND: u32 = u32::MAX;

/// Rank 0's side: drafts by asking rank `rank`.
#[derive(Debug)]
pub struct RemoteDrafter {
    rank: usize,
    cost: f32,
    warned: bool,
    /// The history rank R holds: the last one sent.
    sent: Vec<u32>,
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
        let (_, cost) = ask(engine, rank, (0, &[]), 0)?.unwrap_or_default();
        if cost < 0.0 {
            return Err(EngineError::BadArgument(format!(
                "--draft-rank {rank}: rank {rank} could not load the draft model (its log says why)"
            )));
        }
        tracing::info!("draft model on rank {rank}: a drafted token costs {cost:.2} target decode steps");
        Ok(RemoteDrafter { rank, cost, warned: false, sent: Vec::new() })
    }

    /// A drafted token's cost, in target decode steps (rank R's estimate).
    pub fn cost(&self) -> f32 {
        self.cost
    }

    /// Up to `k` tokens to follow `history`. Call only with no step in
    /// flight (see the module notes). A failure (a lost rank) gives no
    /// draft; the next step then meets the failure and the cluster recovers.
    pub fn propose(&mut self, engine: &mut Engine, history: &[u32], k: usize) -> Vec<u32> {
        let mut keep = self.sent.iter().zip(history).take_while(|(a, b)| a == b).count();
        let mut asked = ask(engine, self.rank, (keep, &history[keep..]), k);
        if matches!(asked, Ok(None)) {
            keep = 0;
            asked = ask(engine, self.rank, (0, history), k);
        }
        // What rank R holds now: the history, or (after a failure) unknown.
        self.sent.truncate(if asked.is_ok() { keep } else { 0 });
        match asked {
            Ok(got) => {
                self.sent.extend_from_slice(&history[keep..]);
                got.map_or_else(Vec::new, |(tokens, _)| tokens)
            }
            Err(e) => {
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!("the draft rank {} failed ({e}); steps go without a draft", self.rank);
                }
                Vec::new()
            }
        }
    }
}

/// One request to rank `rank`: keep the first `keep` tokens of the last
/// history, append `tail`, draft `k`. `(tokens, cost)`, or `None` when rank R
/// lacks that prefix.
fn ask(
    engine: &mut Engine,
    rank: usize,
    (keep, tail): (usize, &[u32]),
    k: usize,
) -> Result<Option<(Vec<u32>, f32)>, EngineError> {
    let c = engine.cluster.as_ref().ok_or_else(|| EngineError::BadArgument("no cluster".into()))?;
    let h = Header {
        op: OP_DRAFT,
        n: tail.len() as u32,
        mode: keep as u32,
        chunk: k.min(MAX_DRAFT) as u32,
        ..Default::default()
    };
    c.send_header(rank, h)?;
    if !tail.is_empty() {
        c.world.send(rank, bytemuck::cast_slice(tail)).map_err(comm_err)?;
    }
    let mut reply = [0u32; REPLY_WORDS];
    c.world.recv(rank, bytemuck::cast_slice_mut(&mut reply)).map_err(comm_err)?;
    if reply[0] == RESEND {
        return Ok(None);
    }
    let n = (reply[0] as usize).min(MAX_DRAFT).min(k);
    Ok(Some((reply[2..2 + n].to_vec(), f32::from_bits(reply[1]))))
}

/// Rank R's side: the draft model and the history rank 0 sent last.
pub struct RankDrafter {
    drafter: ModelDrafter,
    history: Vec<u32>,
}

impl RankDrafter {
    pub fn new(drafter: ModelDrafter) -> RankDrafter {
        RankDrafter { drafter, history: Vec::new() }
    }
}

/// Rank R's side of one request (see the module notes; nothing to keep or
/// add: the greeting of [`RemoteDrafter::connect`]): the reply words.
pub(crate) fn answer(rd: Option<&mut RankDrafter>, (keep, tail): (usize, &[u32]), k: usize) -> [u32; REPLY_WORDS] {
    let mut reply = [0u32; REPLY_WORDS];
    let Some(rd) = rd else {
        reply[1] = (-1f32).to_bits();
        return reply;
    };
    if keep > rd.history.len() {
        reply[0] = RESEND;
        return reply;
    }
    rd.history.truncate(keep);
    rd.history.extend_from_slice(tail);
    let d = &mut rd.drafter;
    let tokens = match rd.history.is_empty() || k == 0 {
        true => Vec::new(),
        false => super::Drafter::propose(d, &rd.history, k.min(MAX_DRAFT)),
    };
    let n = tokens.len().min(MAX_DRAFT);
    reply[0] = n as u32;
    reply[1] = super::Drafter::cost(d).to_bits();
    reply[2..2 + n].copy_from_slice(&tokens[..n]);
    reply
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_rank_keeps_the_prefix_it_was_sent_and_asks_again_without_it() {
        assert_eq!(answer(None, (0, &[]), 0)[1], (-1f32).to_bits(), "no draft model: a negative cost");
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama");
        let files = formats::open_model(&path).unwrap();
        let spec = model::ShardSpec::full(files.config.n_layers);
        let m = model::Model::load(&files, &spec, &model::LoadOptions::default()).unwrap();
        let open = || RankDrafter::new(ModelDrafter::open_for(&path, &m, None, 1, 2).unwrap());
        let history: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 1000).collect();
        let mut rd = open();
        assert_eq!(answer(Some(&mut rd), (5, &[]), 4)[0], RESEND, "a prefix it never got");
        answer(Some(&mut rd), (0, &history[..16]), 4);
        // Keeping 16 tokens and adding 8 drafts what the whole history drafts.
        let delta = answer(Some(&mut rd), (16, &history[16..]), 4);
        let whole = answer(Some(&mut open()), (0, &history), 4);
        assert_eq!(delta, whole);
        assert_eq!(delta[0], 4);
    }
}
