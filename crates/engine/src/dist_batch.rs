//! Batched steps over paged KV across a cluster.
//!
//! Rank 0 owns every decision — which sequences run, which KV blocks each one
//! holds, what the prefix cache shares — and sends each step as a descriptor:
//!
//! ```text
//! [n_seqs, then per sequence: n_tokens, start, logits mode, state, restore, snapshot,
//!  table_len, window_first, window_len, table…, window blocks…]
//! ```
//!
//! followed by the tokens (to the embedding stage) or the residual stream (to
//! the next stage). Every rank keeps a pool with the same block count
//! (`OP_POOL`), so a block id names the same positions on all of them and the
//! other ranks need no block bookkeeping of their own: they write and read
//! where the tables say. Hybrid models' recurrent-state slots travel the same
//! way: `state` names the sequence's slot, `restore` a snapshot slot to copy
//! into it before the step, `snapshot` a slot to copy it into after (u32::MAX:
//! none), so every rank's slots hold the same states. Sliding-window layers'
//! blocks (the pool's window group, `OP_POOL`'s `new_capacity` blocks) travel
//! as `window_first` and the held window blocks.

use crate::dist::{comm_err, count_bytes, count_step, mode_code, mode_of, Header, StageRunner, OP_BATCH, OP_POOL};
use crate::EngineError;
use model::{AllReduce, LogitsMode, SeqKv, SeqStep, WindowBlocks};

thread_local! {
    /// When this rank's previous batch step ended (for the step log).
    static LAST_STEP_END: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// One sequence's share of a batched step.
#[derive(Debug, Clone, Copy)]
pub struct BatchItem<'a> {
    /// New tokens, at positions `start..`.
    pub tokens: &'a [u32],
    /// Blocks covering positions `0..start + tokens.len()`.
    pub table: &'a [u32],
    pub start: usize,
    pub mode: LogitsMode,
    /// Prompt tokens ([`model::SeqStep::prompt`]).
    pub prompt: bool,
    /// Hybrid models: the sequence's recurrent-state slot.
    pub state: Option<u32>,
    /// Copy this snapshot slot into `state` before the step (prefix reuse).
    pub restore: Option<u32>,
    /// Copy `state` into this slot after the step (a prefix-cache snapshot).
    pub snapshot: Option<u32>,
    /// Blocks in the pool's sliding-window group (empty without one).
    pub window: WindowBlocks<'a>,
}

/// The pool a batching scheduler asks for: `n_blocks` blocks of `block`
/// positions for the full-attention layers, `n_window_blocks` of the
/// sliding-window group (0: windowed layers use the full blocks), and
/// `n_slots` recurrent-state slots (hybrid models).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolShape {
    pub block: usize,
    pub n_blocks: usize,
    pub n_window_blocks: usize,
    pub n_slots: usize,
}

/// One sequence of a decoded descriptor.
pub(crate) struct SeqDesc {
    pub len: usize,
    pub start: usize,
    pub mode: LogitsMode,
    pub prompt: bool,
    pub state: Option<u32>,
    pub restore: Option<u32>,
    pub snapshot: Option<u32>,
    pub table: Vec<u32>,
    pub window_first: usize,
    pub window: Vec<u32>,
}

impl SeqDesc {
    fn window(&self) -> WindowBlocks<'_> {
        WindowBlocks { first: self.window_first, blocks: &self.window }
    }
}

fn opt_code(v: Option<u32>) -> u32 {
    v.unwrap_or(u32::MAX)
}

fn opt_of(c: u32) -> Option<u32> {
    (c != u32::MAX).then_some(c)
}

/// Before a step: every restore (snapshot → live slot).
pub(crate) fn restore_states(
    pool: &mut model::KvPool,
    ops: impl Iterator<Item = (Option<u32>, Option<u32>)>,
) -> Result<(), EngineError> {
    for (state, from) in ops {
        if let (Some(to), Some(from), Some(st)) = (state, from, pool.states.as_mut()) {
            st.copy(from as usize, to as usize)?;
        }
    }
    Ok(())
}

/// After a step: every snapshot (live slot → snapshot slot).
pub(crate) fn snapshot_states(
    pool: &mut model::KvPool,
    ops: impl Iterator<Item = (Option<u32>, Option<u32>)>,
) -> Result<(), EngineError> {
    for (state, to) in ops {
        if let (Some(from), Some(to), Some(st)) = (state, to, pool.states.as_mut()) {
            st.copy(from as usize, to as usize)?;
        }
    }
    Ok(())
}

/// The bit of a descriptor's mode word that marks prompt tokens.
const PROMPT_BIT: u32 = 8;

/// A decoded descriptor.
struct Desc {
    seqs: Vec<SeqDesc>,
}

pub(crate) fn encode(items: &[BatchItem<'_>]) -> Vec<u32> {
    let mut d = vec![items.len() as u32];
    for it in items {
        d.extend([it.tokens.len() as u32, it.start as u32, mode_code(it.mode) | (it.prompt as u32) << PROMPT_BIT]);
        d.extend([opt_code(it.state), opt_code(it.restore), opt_code(it.snapshot), it.table.len() as u32]);
        d.extend([it.window.first as u32, it.window.blocks.len() as u32]);
        d.extend_from_slice(it.table);
        d.extend_from_slice(it.window.blocks);
    }
    d
}

fn decode(d: &[u32]) -> Result<Desc, EngineError> {
    let bad = || EngineError::BadArgument("malformed batch descriptor".into());
    let n = *d.first().ok_or_else(bad)? as usize;
    let mut at = 1;
    let mut seqs = Vec::with_capacity(n);
    for _ in 0..n {
        const HEAD: usize = 9;
        let head = d.get(at..at + HEAD).ok_or_else(bad)?;
        let (tl, wl) = (head[6] as usize, head[8] as usize);
        let table = d.get(at + HEAD..at + HEAD + tl).ok_or_else(bad)?.to_vec();
        let window = d.get(at + HEAD + tl..at + HEAD + tl + wl).ok_or_else(bad)?.to_vec();
        seqs.push(SeqDesc {
            len: head[0] as usize,
            start: head[1] as usize,
            mode: mode_of(head[2] & ((1 << PROMPT_BIT) - 1)),
            prompt: head[2] >> PROMPT_BIT & 1 == 1,
            state: opt_of(head[3]),
            restore: opt_of(head[4]),
            snapshot: opt_of(head[5]),
            table,
            window_first: head[7] as usize,
            window,
        });
        at += HEAD + tl + wl;
    }
    if at != d.len() {
        return Err(bad());
    }
    Ok(Desc { seqs })
}

impl StageRunner<'_> {
    /// Rank 0: asks every rank to allocate a pool of `n_blocks` blocks of
    /// `block` positions (and `n_slots` recurrent-state slots for a hybrid
    /// model, in the header's `mode`; `n_window_blocks` blocks of the
    /// sliding-window group in its `new_capacity`), and allocates its own.
    pub fn init_pool(&mut self, shape: PoolShape) -> Result<(), EngineError> {
        let h = Header {
            op: OP_POOL,
            n: shape.n_blocks as u32,
            chunk: shape.block as u32,
            mode: shape.n_slots as u32,
            new_capacity: shape.n_window_blocks as u32,
        };
        for r in self.cluster.embed_stage_ranks() {
            self.cluster.send_header(r, h)?;
        }
        let mut pool = self.model.new_pool_windowed(shape.block, shape.n_blocks, shape.n_window_blocks);
        pool.states = self.model.state_pool(shape.n_slots);
        self.model.check_device_pool(&pool)?;
        *self.paged = Some(pool);
        Ok(())
    }

    /// Rank 0: sends one batched step to the embedding stage. With one stage
    /// it runs here at once (its logits are ready for [`Self::collect_batch`]);
    /// in a pipeline it only leaves, so that rank 0 can send the next
    /// micro-batch before this one comes back: the stages then work on
    /// different micro-batches at the same time. Steps run in the order they
    /// were sent, on every rank.
    pub fn submit_batch(&mut self, items: &[BatchItem<'_>]) -> Result<(), EngineError> {
        let c = self.cluster;
        let desc = encode(items);
        let tokens: Vec<u32> = items.iter().flat_map(|it| it.tokens.iter().copied()).collect();
        let h = Header { op: OP_BATCH, n: tokens.len() as u32, chunk: desc.len() as u32, ..Default::default() };
        let decode_step = items.iter().all(|it| it.tokens.len() == 1);
        let send = || -> Result<(), EngineError> {
            for r in c.embed_stage_ranks() {
                c.send_header(r, h)?;
                c.world.send(r, bytemuck::cast_slice(&desc)).map_err(comm_err)?;
                c.world.send(r, bytemuck::cast_slice(&tokens)).map_err(comm_err)?;
            }
            Ok(())
        };
        if c.stages == 1 {
            return count_step(decode_step, tokens.len(), || {
                send()?;
                self.run_batch(&decode(&desc)?, Some(&tokens))
            });
        }
        // The step is counted when it comes back (`collect_batch`).
        count_bytes(decode_step, send)
    }

    /// Rank 0: finishes the oldest step sent by [`Self::submit_batch`]. In a
    /// pipeline it receives that step's residual stream from the stage
    /// before the head and runs this stage's layers and the head; afterwards
    /// `batch_logits[i]` holds item `i`'s requested logits.
    pub fn collect_batch(&mut self) -> Result<(), EngineError> {
        let c = self.cluster;
        if c.stages == 1 {
            return Ok(());
        }
        let from = c.upstream().expect("stage 0 of a pipeline has an upstream");
        let hh = c.recv_header(from)?;
        if hh.op != OP_BATCH {
            return Err(EngineError::BadArgument(format!(
                "rank 0 expected a batch from rank {from}, got op {}",
                hh.op
            )));
        }
        self.handle_batch(hh, from)
    }

    /// Any rank: receives a batch step's descriptor and input, runs it.
    pub(crate) fn handle_batch(&mut self, h: Header, from: usize) -> Result<(), EngineError> {
        let c = self.cluster;
        let mut desc = vec![0u32; h.chunk as usize];
        c.world.recv(from, bytemuck::cast_slice_mut(&mut desc)).map_err(comm_err)?;
        let d = decode(&desc)?;
        let n = h.n as usize;
        if d.seqs.iter().map(|s| s.len).sum::<usize>() != n {
            return Err(EngineError::BadArgument("batch descriptor disagrees with its token count".into()));
        }
        let decode_step = d.seqs.iter().all(|s| s.len == 1);
        let start = std::time::Instant::now();
        let out = count_step(decode_step, n, || self.run_received(&d, n, from));
        // Where a pipeline's time goes, stage by stage: `idle` is the time
        // since this rank's previous step ended (waiting for input, and on
        // rank 0 sampling and scheduling), `ran` this step's receive and run.
        let end = std::time::Instant::now();
        let idle = LAST_STEP_END.replace(Some(end)).map_or(0.0, |t| start.duration_since(t).as_secs_f64());
        tracing::debug!(
            "stage {} step: {} seqs, {n} tokens, idle {:.2} ms, ran {:.2} ms",
            c.stage,
            d.seqs.len(),
            idle * 1e3,
            (end - start).as_secs_f64() * 1e3
        );
        out
    }

    /// [`Self::handle_batch`] once the descriptor is in: receives the step's
    /// input (tokens or the residual stream) and runs it.
    fn run_received(&mut self, d: &Desc, n: usize, from: usize) -> Result<(), EngineError> {
        let c = self.cluster;
        if c.stage + 1 == c.stages {
            let mut tokens = vec![0u32; n];
            c.world.recv(from, bytemuck::cast_slice_mut(&mut tokens)).map_err(comm_err)?;
            self.run_batch(d, Some(&tokens))
        } else {
            let width = self.model.config.hidden_size;
            if self.ws.x.len() < n * width {
                self.ws.x.resize(n * width, 0.0);
            }
            c.world.recv(from, bytemuck::cast_slice_mut(&mut self.ws.x[..n * width])).map_err(comm_err)?;
            self.run_batch(d, None)
        }
    }

    /// This stage's part of a batch whose input is in place (token ids for the
    /// embedding stage, `ws.x` otherwise); passes the result downstream.
    fn run_batch(&mut self, d: &Desc, tokens: Option<&[u32]>) -> Result<(), EngineError> {
        let pool = self.paged.as_mut().ok_or_else(|| EngineError::BadArgument("batch step before OP_POOL".into()))?;
        let n: usize = d.seqs.iter().map(|s| s.len).sum();
        restore_states(pool, d.seqs.iter().map(|s| (s.state, s.restore)))?;
        let zeros;
        let toks = match tokens {
            Some(t) => t,
            None => {
                zeros = vec![0u32; n];
                &zeros[..]
            }
        };
        if self.batch_logits.len() < d.seqs.len() {
            self.batch_logits.resize_with(d.seqs.len(), Vec::new);
        }
        let mut steps = Vec::with_capacity(d.seqs.len());
        let mut at = 0;
        for (s, logits) in d.seqs.iter().zip(self.batch_logits.iter_mut()) {
            steps.push(SeqStep {
                tokens: &toks[at..at + s.len],
                cache: SeqKv::Paged { table: &s.table, start: s.start, state: s.state, window: s.window() },
                mode: s.mode,
                prompt: s.prompt,
                logits,
            });
            at += s.len;
        }
        let comm: &dyn AllReduce = &self.cluster.tp_group;
        if tokens.is_some() {
            self.model.embed_tokens(self.ws, &steps, comm)?;
        }
        self.model.run_layers(self.pool, self.ws, &mut steps, Some(pool), comm)?;
        self.model.head(self.pool, self.ws, &mut steps, comm)?;
        drop(steps);
        snapshot_states(pool, d.seqs.iter().map(|s| (s.state, s.snapshot)))?;
        if let Some(to) = self.cluster.downstream() {
            let desc = {
                let items: Vec<BatchItem<'_>> = d
                    .seqs
                    .iter()
                    .map(|s| BatchItem {
                        tokens: &toks[..s.len],
                        table: &s.table,
                        start: s.start,
                        mode: s.mode,
                        prompt: s.prompt,
                        state: s.state,
                        restore: s.restore,
                        snapshot: s.snapshot,
                        window: s.window(),
                    })
                    .collect();
                encode(&items)
            };
            let h = Header { op: OP_BATCH, n: n as u32, chunk: desc.len() as u32, ..Default::default() };
            self.cluster.send_header(to, h)?;
            self.cluster.world.send(to, bytemuck::cast_slice(&desc)).map_err(comm_err)?;
            let width = self.model.config.hidden_size;
            self.cluster.world.send(to, bytemuck::cast_slice(&self.ws.x[..n * width])).map_err(comm_err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_carry_state_slot_ops_and_window_blocks() {
        let (t1, t2) = ([1u32, 2, 3], [4u32]);
        let items = [
            BatchItem {
                tokens: &t1,
                table: &[5, 6],
                start: 64,
                mode: LogitsMode::None,
                prompt: true,
                state: Some(2),
                restore: Some(7),
                snapshot: None,
                window: WindowBlocks { first: 1, blocks: &[3, 0] },
            },
            BatchItem {
                tokens: &t2,
                table: &[1],
                start: 9,
                mode: LogitsMode::Argmax,
                prompt: false,
                state: None,
                restore: None,
                snapshot: Some(0),
                window: WindowBlocks::default(),
            },
        ];
        let d = decode(&encode(&items)).unwrap();
        let got: Vec<_> = d
            .seqs
            .iter()
            .map(|s| {
                (s.len, s.start, s.state, s.restore, s.snapshot, s.table.clone(), s.window_first, s.window.clone())
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (3, 64, Some(2), Some(7), None, vec![5, 6], 1, vec![3, 0]),
                (1, 9, None, None, Some(0), vec![1], 0, vec![])
            ]
        );
        assert!(decode(&encode(&items)[..5]).is_err(), "a truncated descriptor is refused");
    }
}
