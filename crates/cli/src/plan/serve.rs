//! What `serve` gives many agents at once: the aggregate decode rate of `N`
//! concurrent streams on a split (issue 27), beside the one-stream figures of
//! [`super::cost`].
//!
//! A batched decode step of `m` sequences on a stage reads the stage's weights
//! once and each sequence's KV once, and computes `m` activation rows; so its
//! time is `max(weights, m · row) + m · kv` (plus the per-layer overhead inside
//! the batch-1 time), where
//! - `weights` = the stage's batch-1 decode time less one sequence's KV read;
//! - `kv` = one sequence's KV read at the depth (bytes over bandwidth, or the
//!   measured attention slope × depth on `local` machines);
//! - `row` = one activation row's cost: on `local` machines the timed
//!   prefill of the stage's shard per prompt token (at the plan's context:
//!   plan at the streams' depth); elsewhere the row's matmul FLOPs (`2 ·
//!   params` of the stage's share) at the machine's prefill FLOP rate.
//!
//! Splits (as the scheduler runs them, docs/ARCHITECTURE.md "Micro-batches in
//! flight"):
//! - one stage (single, tensor): one step of all `N`, plus the tensor group's
//!   all-reduces of `N` rows: `agg = N / T(N)`;
//! - a pipeline of `S` stages: `S` micro-batches of `m = ⌈N/S⌉` in flight; a
//!   round gives every stream one token and lasts the busiest stage's `S`
//!   micro-batches or one micro-batch's trip through every stage and back,
//!   whichever is longer: `agg = N / max(S · max T_s(m), Σ T_s(m) + hops)`.

/// One stage's inputs for [`batched_step`].
#[derive(Debug, Clone, Copy)]
pub struct StageCost {
    /// Batch-1 decode step of the stage (the slowest rank), seconds.
    pub decode_1: f64,
    /// One sequence's KV (and state) read at the depth, seconds.
    pub kv_1: f64,
    /// One activation row's cost, seconds: prefill per prompt token, or, when
    /// `rows_add`, what each sequence beyond the first was measured to add to
    /// a batched decode step.
    pub row: f64,
    /// The rows were timed in a batched step on this machine: they add to the
    /// batch-1 step instead of overlapping the weights' stream.
    pub rows_add: bool,
}

/// A stage's decode step over `m` sequences: with timed rows, the batch-1
/// step plus each further sequence's row and KV read (measured on SmolLM2 at
/// 2 threads: an 8-row step costs ≈2.9 ms a row beyond the weights, where a
/// prefill token costs ≈1.1 ms, so overlapping them over-predicted 8 streams
/// by 25–70%); otherwise `max(weights, m · row) + m · kv`.
pub fn batched_step(s: &StageCost, m: usize) -> f64 {
    let m = m.max(1) as f64;
    if s.rows_add {
        return s.decode_1 + (m - 1.0) * (s.row + s.kv_1);
    }
    let weights = (s.decode_1 - s.kv_1).max(0.0);
    weights.max(m * s.row) + m * s.kv_1
}

/// Aggregate tok/s of `streams` concurrent streams over `stages` (in data-flow
/// order or not: only their times matter). `comm(m)`: the communication one
/// step of `m` rows adds (a tensor group's all-reduces; for a pipeline, one
/// micro-batch's hops around the ring).
pub fn aggregate_tok_s(stages: &[StageCost], streams: usize, comm: impl Fn(usize) -> f64) -> f64 {
    let n = streams.max(1);
    if stages.len() <= 1 {
        let t = stages.first().map_or(0.0, |s| batched_step(s, n)) + comm(n);
        return n as f64 / t.max(1e-12);
    }
    let s = stages.len();
    let m = n.div_ceil(s);
    let times: Vec<f64> = stages.iter().map(|st| batched_step(st, m)).collect();
    let busiest = times.iter().copied().fold(0.0, f64::max);
    let trip: f64 = times.iter().sum::<f64>() + comm(m);
    n as f64 / (s as f64 * busiest).max(trip).max(1e-12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batching_pays_until_compute_binds_and_a_pipeline_overlaps_its_stages() {
        // Weights 10 ms, KV 0.1 ms a sequence, 1 ms of compute a row.
        let st = StageCost { decode_1: 0.0101, kv_1: 0.0001, row: 0.001, rows_add: false };
        assert!((batched_step(&st, 1) - 0.0101).abs() < 1e-12);
        // 8 rows: still weight-bound (8 ms of compute < 10 ms).
        assert!((batched_step(&st, 8) - (0.010 + 0.0008)).abs() < 1e-12);
        // 20 rows: compute-bound.
        assert!((batched_step(&st, 20) - (0.020 + 0.002)).abs() < 1e-12);
        let one = aggregate_tok_s(&[st], 8, |_| 0.0);
        assert!((one - 8.0 / 0.0108).abs() < 1e-6);
        // Two half stages: each 4-row micro-batch takes half the time; the
        // round is two micro-batches on the busiest stage.
        let half = StageCost { decode_1: 0.00505, kv_1: 0.00005, row: 0.0005, rows_add: false };
        let two = aggregate_tok_s(&[half, half], 8, |_| 0.0);
        let t = batched_step(&half, 4);
        assert!((two - 8.0 / (2.0 * t)).abs() < 1e-6, "{two}");
        // Slow hops make the trip the bound.
        let slow = aggregate_tok_s(&[half, half], 8, |_| 1.0);
        assert!((slow - 8.0 / (2.0 * t + 1.0)).abs() < 1e-6);
    }

    #[test]
    fn timed_rows_add_to_the_batch_one_step() {
        // Batch-1 step 3 ms (0.1 ms of it KV), each further row 2.9 ms.
        let st = StageCost { decode_1: 0.003, kv_1: 0.0001, row: 0.0029, rows_add: true };
        assert!((batched_step(&st, 1) - 0.003).abs() < 1e-12);
        assert!((batched_step(&st, 8) - (0.003 + 7.0 * 0.003)).abs() < 1e-12);
        // The old estimate (a prefill token's 1.1 ms overlapping the
        // weights) predicted 8 streams 2.5× faster than the timed rows.
        let overlap = StageCost { rows_add: false, row: 0.0011, ..st };
        assert!((batched_step(&overlap, 8) - (8.0 * 0.0011 + 8.0 * 0.0001)).abs() < 1e-12);
        assert!(batched_step(&st, 8) > 2.4 * batched_step(&overlap, 8));
    }
}
