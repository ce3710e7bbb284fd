//! Batched steps over paged KV across a cluster.
//!
//! Rank 0 owns every decision — which sequences run, which KV blocks each one
//! holds, what the prefix cache shares — and sends each step as a descriptor:
//!
//! ```text
//! [n_seqs, then per sequence: n_tokens, start, logits mode, table_len, table…]
//! ```
//!
//! followed by the tokens (to the embedding stage) or the residual stream (to
//! the next stage). Every rank keeps a pool with the same block count
//! (`OP_POOL`), so a block id names the same positions on all of them and the
//! other ranks need no block bookkeeping of their own: they write and read
//! where the tables say.

use crate::dist::{comm_err, mode_code, mode_of, Header, StageRunner, OP_BATCH, OP_POOL};
use crate::EngineError;
use model::{AllReduce, LogitsMode, SeqKv, SeqStep};

/// One sequence's share of a batched step.
#[derive(Debug, Clone, Copy)]
pub struct BatchItem<'a> {
    /// New tokens, at positions `start..`.
    pub tokens: &'a [u32],
    /// Blocks covering positions `0..start + tokens.len()`.
    pub table: &'a [u32],
    pub start: usize,
    pub mode: LogitsMode,
}

/// A decoded descriptor: per sequence (tokens, start, mode, table).
struct Desc {
    seqs: Vec<(usize, usize, LogitsMode, Vec<u32>)>,
}

pub(crate) fn encode(items: &[BatchItem<'_>]) -> Vec<u32> {
    let mut d = vec![items.len() as u32];
    for it in items {
        d.extend([it.tokens.len() as u32, it.start as u32, mode_code(it.mode), it.table.len() as u32]);
        d.extend_from_slice(it.table);
    }
    d
}

fn decode(d: &[u32]) -> Result<Desc, EngineError> {
    let bad = || EngineError::BadArgument("malformed batch descriptor".into());
    let n = *d.first().ok_or_else(bad)? as usize;
    let mut at = 1;
    let mut seqs = Vec::with_capacity(n);
    for _ in 0..n {
        let head = d.get(at..at + 4).ok_or_else(bad)?;
        let (len, start, mode, tl) = (head[0] as usize, head[1] as usize, mode_of(head[2]), head[3] as usize);
        let table = d.get(at + 4..at + 4 + tl).ok_or_else(bad)?.to_vec();
        seqs.push((len, start, mode, table));
        at += 4 + tl;
    }
    if at != d.len() {
        return Err(bad());
    }
    Ok(Desc { seqs })
}

impl StageRunner<'_> {
    /// Rank 0: asks every rank to allocate a pool of `n_blocks` blocks of
    /// `block` positions, and allocates its own.
    pub fn init_pool(&mut self, block: usize, n_blocks: usize) -> Result<(), EngineError> {
        let h = Header { op: OP_POOL, n: n_blocks as u32, chunk: block as u32, ..Default::default() };
        for r in self.cluster.embed_stage_ranks() {
            self.cluster.send_header(r, h)?;
        }
        *self.paged = Some(self.model.new_pool(block, n_blocks));
        Ok(())
    }

    /// Rank 0: runs one batched step across the cluster. Afterwards
    /// `batch_logits[i]` holds item `i`'s requested logits.
    pub fn drive_batch(&mut self, items: &[BatchItem<'_>]) -> Result<(), EngineError> {
        let c = self.cluster;
        let desc = encode(items);
        let tokens: Vec<u32> = items.iter().flat_map(|it| it.tokens.iter().copied()).collect();
        let h = Header { op: OP_BATCH, n: tokens.len() as u32, chunk: desc.len() as u32, ..Default::default() };
        for r in c.embed_stage_ranks() {
            c.send_header(r, h)?;
            c.world.send(r, bytemuck::cast_slice(&desc)).map_err(comm_err)?;
            c.world.send(r, bytemuck::cast_slice(&tokens)).map_err(comm_err)?;
        }
        if c.stages == 1 {
            return self.run_batch(&decode(&desc)?, Some(&tokens));
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
        if d.seqs.iter().map(|s| s.0).sum::<usize>() != n {
            return Err(EngineError::BadArgument("batch descriptor disagrees with its token count".into()));
        }
        if c.stage + 1 == c.stages {
            let mut tokens = vec![0u32; n];
            c.world.recv(from, bytemuck::cast_slice_mut(&mut tokens)).map_err(comm_err)?;
            self.run_batch(&d, Some(&tokens))
        } else {
            let width = self.model.config.hidden_size;
            if self.ws.x.len() < n * width {
                self.ws.x.resize(n * width, 0.0);
            }
            c.world.recv(from, bytemuck::cast_slice_mut(&mut self.ws.x[..n * width])).map_err(comm_err)?;
            self.run_batch(&d, None)
        }
    }

    /// This stage's part of a batch whose input is in place (token ids for the
    /// embedding stage, `ws.x` otherwise); passes the result downstream.
    fn run_batch(&mut self, d: &Desc, tokens: Option<&[u32]>) -> Result<(), EngineError> {
        let pool = self.paged.as_mut().ok_or_else(|| EngineError::BadArgument("batch step before OP_POOL".into()))?;
        let n: usize = d.seqs.iter().map(|s| s.0).sum();
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
        for ((len, start, mode, table), logits) in d.seqs.iter().zip(self.batch_logits.iter_mut()) {
            steps.push(SeqStep {
                tokens: &toks[at..at + len],
                cache: SeqKv::Paged { table, start: *start, state: None },
                mode: *mode,
                logits,
            });
            at += len;
        }
        let comm: &dyn AllReduce = &self.cluster.tp_group;
        if tokens.is_some() {
            self.model.embed_tokens(self.ws, &steps, comm)?;
        }
        self.model.run_layers(self.pool, self.ws, &mut steps, Some(pool), comm)?;
        self.model.head(self.pool, self.ws, &mut steps, comm)?;
        if let Some(to) = self.cluster.downstream() {
            let desc = {
                let items: Vec<BatchItem<'_>> = d
                    .seqs
                    .iter()
                    .map(|(len, start, mode, table)| BatchItem {
                        tokens: &toks[..*len],
                        table,
                        start: *start,
                        mode: *mode,
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
