//! The head: the final norm and lm_head over the rows each sequence asked
//! for, and under tensor parallelism, where each rank holds a slice of the
//! vocabulary rows of the lm_head, a distributed argmax (one (value, index)
//! pair per row crosses the link instead of the row) and a gather of whole
//! logit rows when the caller wants them.

use super::{LogitsMode, Model, SeqStep};
use crate::linear::Linear;
use crate::shard::AllReduce;
use crate::workspace::{grow, Workspace};
use crate::ModelError;
use kernels::{ops, ThreadPool};

impl Model {
    /// Final norm and lm_head for the rows each sequence asked for.
    pub fn head(
        &self,
        pool: &ThreadPool,
        ws: &mut Workspace,
        seqs: &mut [SeqStep<'_>],
        comm: &dyn AllReduce,
    ) -> Result<(), ModelError> {
        let (Some(norm), Some(lm_head)) = (&self.final_norm, &self.lm_head) else { return Ok(()) };
        let (h, vocab) = (self.config.hidden_size, self.config.vocab_size);
        let mut rows = 0;
        let mut t = 0;
        // The step's rows the head runs on (the device reads them where they are).
        let mut picked = Vec::new();
        for s in seqs.iter() {
            let len = s.tokens.len();
            let range = match s.mode {
                LogitsMode::None => 0..0,
                LogitsMode::Last | LogitsMode::Argmax => len.saturating_sub(1)..len,
                LogitsMode::All | LogitsMode::Verify => 0..len,
            };
            grow(&mut ws.head_in, (rows + range.len()) * h);
            for r in range {
                ws.head_in[rows * h..(rows + 1) * h].copy_from_slice(&ws.x[(t + r) * h..(t + r + 1) * h]);
                picked.push(t + r);
                rows += 1;
            }
            t += len;
        }
        if rows == 0 {
            seqs.iter_mut().for_each(|s| s.logits.clear());
            return Ok(());
        }
        grow(&mut ws.logits, rows * vocab);
        if self.gpu.is_none() {
            grow(&mut ws.xn, rows * h);
            ops::rms_norm(&ws.head_in[..rows * h], norm, self.config.rms_norm_eps, h, &mut ws.xn[..rows * h]);
        }
        let only_argmax = seqs.iter().all(|s| matches!(s.mode, LogitsMode::Argmax | LogitsMode::None));
        if self.local.vocab_all.is_empty() {
            let mut logits = std::mem::take(&mut ws.logits);
            self.lm_head_rows(pool, ws, &picked, lm_head, &mut logits)?;
            ws.logits = logits;
        } else if only_argmax {
            self.argmax_vocab_parallel(pool, ws, &picked, lm_head, comm)?;
        } else {
            self.gather_vocab_parallel(pool, ws, &picked, lm_head, comm)?;
        }
        let mut r = 0;
        for s in seqs.iter_mut() {
            let n = match s.mode {
                LogitsMode::None => 0,
                LogitsMode::Last | LogitsMode::Argmax => usize::from(!s.tokens.is_empty()),
                LogitsMode::All | LogitsMode::Verify => s.tokens.len(),
            };
            s.logits.clear();
            s.logits.extend_from_slice(&ws.logits[r * vocab..(r + n) * vocab]);
            r += n;
        }
        Ok(())
    }

    /// This rank's lm_head rows over the `rows` head rows: from `ws.xn`
    /// (normalized above) on the CPU; on a GPU the device normalizes
    /// `ws.head_in` itself.
    fn lm_head_rows(
        &self,
        pool: &ThreadPool,
        ws: &mut Workspace,
        picked: &[usize],
        lm_head: &Linear,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let rows = picked.len();
        match &self.gpu {
            Some(g) => g.head(self, picked, &ws.head_in, out),
            None => {
                lm_head.forward(pool, &ws.xn, rows, out, &mut ws.scratch);
                Ok(())
            }
        }
    }

    /// Distributed argmax: each rank finds the best of its vocabulary rows and the
    /// ranks exchange one (value, index) pair per row — 8 bytes instead of the row.
    /// Ties go to the lowest index, as in a single process.
    pub(super) fn argmax_vocab_parallel(
        &self,
        pool: &ThreadPool,
        ws: &mut Workspace,
        picked: &[usize],
        lm_head: &Linear,
        comm: &dyn AllReduce,
    ) -> Result<(), ModelError> {
        let rows = picked.len();
        let vocab = self.config.vocab_size;
        let mine = self.local.vocab.len();
        let n = self.local.vocab_all.len();
        grow(&mut ws.local_logits, rows * mine);
        let mut local = std::mem::take(&mut ws.local_logits);
        self.lm_head_rows(pool, ws, picked, lm_head, &mut local)?;
        let mut pairs = vec![0f32; rows * 2];
        for i in 0..rows {
            let row = &local[i * mine..(i + 1) * mine];
            let best = (0..row.len()).fold(0, |b, j| if row[j] > row[b] { j } else { b });
            pairs[2 * i] = row[best];
            pairs[2 * i + 1] = f32::from_bits((self.local.vocab.start + best) as u32);
        }
        ws.local_logits = local;
        let mut all = vec![0f32; n * rows * 2];
        comm.all_gather(&pairs, &mut all)?;
        for i in 0..rows {
            let (mut best_v, mut best_id) = (f32::NEG_INFINITY, u32::MAX);
            for r in 0..n {
                let (v, id) = (all[(r * rows + i) * 2], all[(r * rows + i) * 2 + 1].to_bits());
                if v > best_v || (v == best_v && id < best_id) {
                    (best_v, best_id) = (v, id);
                }
            }
            let out = &mut ws.logits[i * vocab..(i + 1) * vocab];
            out.fill(f32::NEG_INFINITY);
            out[best_id as usize] = best_v;
        }
        Ok(())
    }

    /// Vocab-parallel lm_head: each rank computes its rows' logits, then an
    /// all-gather (padded to the widest slice) assembles `rows × vocab` in `ws.logits`.
    pub(super) fn gather_vocab_parallel(
        &self,
        pool: &ThreadPool,
        ws: &mut Workspace,
        picked: &[usize],
        lm_head: &Linear,
        comm: &dyn AllReduce,
    ) -> Result<(), ModelError> {
        let rows = picked.len();
        let vocab = self.config.vocab_size;
        let all = &self.local.vocab_all;
        let width = all.iter().map(|r| r.len()).max().unwrap_or(0);
        let mine = self.local.vocab.len();
        grow(&mut ws.local_logits, rows * width);
        grow(&mut ws.gather, all.len() * rows * width);
        let mut local = std::mem::take(&mut ws.local_logits);
        self.lm_head_rows(pool, ws, picked, lm_head, &mut local)?;
        // Re-space rows from `mine` to `width` (back to front, in place).
        for i in (0..rows).rev() {
            local.copy_within(i * mine..(i + 1) * mine, i * width);
        }
        comm.all_gather(&local[..rows * width], &mut ws.gather[..all.len() * rows * width])?;
        ws.local_logits = local;
        for (rk, range) in all.iter().enumerate() {
            for i in 0..rows {
                let src = &ws.gather[(rk * rows + i) * width..][..range.len()];
                ws.logits[i * vocab + range.start..i * vocab + range.end].copy_from_slice(src);
            }
        }
        Ok(())
    }
}
