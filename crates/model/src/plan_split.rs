//! The pipeline split that keeps every stage busy within a memory bound.
//!
//! Two costs pull a pipeline's layer boundaries in different directions:
//! - **memory**: what a stage holds, its layers' weights plus one sequence's
//!   KV at the full context, and on the head stage the lm_head and the
//!   tokenizer ([`crate::plan::pipeline_layers_by_layer_bytes`] balances it);
//! - **time**: what a stage does per decode step, which follows the weights
//!   it reads per token: its layers' and, on the head stage, the lm_head's.
//!
//! They disagree most where the head is large beside a layer. SmolLM2 (30
//! layers of 2.2 MB, a 30 MB Q8_0 head, 6.3 MB of f16 KV per layer at its
//! 8192 context): balanced by memory the head stage takes 12 layers and
//! then does 9.4 ms of a 4-sequence micro-batch to the other stage's
//! 6.7 ms, so serving 8 streams through a pipeline of 2 ran at 0.82× one
//! process on the same 2 cores; with 10 layers the stages ran 7.4 / 6.9 ms
//! and 8 streams 0.93× (issue 27, docs/PERFORMANCE.md).
//!
//! So the split balances time, as long as no stage then holds more than
//! [`MEMORY_SLACK`] × what the fullest stage of the memory-balanced split
//! holds (per unit of its weight); when the time split would, it moves
//! toward the memory split until the bound holds. Where the head is small
//! beside a layer (large models, the ones a pipeline exists to fit), the two
//! splits are the same.

use crate::plan::{pipeline_layers_by_layer_bytes, PlanError};
use std::ops::Range;

/// How much more than the memory-balanced split's fullest stage a stage may
/// hold (per unit of weight) so that the stages' decode times even out.
pub const MEMORY_SLACK: f64 = 1.15;

/// Layer ranges in data-flow order (the first embeds, the last holds the
/// head). `read[i]` / `head_read`: bytes layer `i` and the head read per
/// decode token; `held[i]` / `head_held`: bytes they hold (weights, KV at the
/// full context, the tokenizer); `weights`: each stage's share (memory or
/// speed), in data-flow order.
pub fn pipeline_layers_balanced(
    read: &[f64],
    head_read: f64,
    held: &[f64],
    head_held: f64,
    weights: &[f64],
) -> Result<Vec<Range<usize>>, PlanError> {
    let by_memory = pipeline_layers_by_layer_bytes(held, head_held, weights)?;
    let total = |v: &[f64], head: f64| v.iter().sum::<f64>() + head;
    let (read_total, held_total) = (total(read, head_read), total(held, head_held));
    if read.len() != held.len() || read_total <= 0.0 || held_total <= 0.0 {
        return Ok(by_memory);
    }
    // What each stage holds per unit of its weight; the bound is the memory
    // split's fullest stage, plus the slack.
    let fullest = |ranges: &[Range<usize>]| -> f64 {
        ranges
            .iter()
            .enumerate()
            .map(|(s, r)| {
                let head = if s + 1 == ranges.len() { head_held } else { 0.0 };
                (held[r.clone()].iter().sum::<f64>() + head) / weights[s]
            })
            .fold(0.0, f64::max)
    };
    let bound = fullest(&by_memory) * MEMORY_SLACK;
    // From time alone (t = 1) toward memory alone (t = 0): each layer's cost
    // a blend of its shares of the two totals.
    for step in (1..=10).rev() {
        let t = step as f64 / 10.0;
        let blend = |r: f64, h: f64| t * r / read_total + (1.0 - t) * h / held_total;
        let cost: Vec<f64> = read.iter().zip(held).map(|(&r, &h)| blend(r, h)).collect();
        let ranges = pipeline_layers_by_layer_bytes(&cost, blend(head_read, head_held), weights)?;
        if fullest(&ranges) <= bound {
            return Ok(ranges);
        }
    }
    Ok(by_memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2 at its 8192 context: 12 / 18 by memory, 8 / 22 by time; the
    /// bound allows 10 / 20.
    #[test]
    fn smollm2_moves_layers_off_the_head_stage_within_the_bound() {
        let read = vec![2.2e6; 30];
        let held = vec![2.2e6 + 6.3e6; 30];
        let (head_read, head_held) = (30e6, 30e6 + 19e6);
        let mem = pipeline_layers_by_layer_bytes(&held, head_held, &[1.0, 1.0]).unwrap();
        assert_eq!(mem, vec![0..18, 18..30]);
        let r = pipeline_layers_balanced(&read, head_read, &held, head_held, &[1.0, 1.0]).unwrap();
        assert_eq!(r, vec![0..20, 20..30]);
        // With room to spare (no KV), time decides alone.
        let r = pipeline_layers_balanced(&read, head_read, &read, head_read, &[1.0, 1.0]).unwrap();
        assert_eq!(r, vec![0..22, 22..30]);
    }

    /// A large model's head is small beside a layer: the two splits agree.
    #[test]
    fn a_small_head_keeps_the_memory_split() {
        let read = vec![8e9; 61];
        let held = vec![8.5e9; 61];
        for w in [[1.0, 1.0], [1.0, 2.0]] {
            let mem = pipeline_layers_by_layer_bytes(&held, 1.2e9, &w).unwrap();
            assert_eq!(pipeline_layers_balanced(&read, 1e9, &held, 1.2e9, &w).unwrap(), mem);
        }
    }

    /// Every stage keeps at least one layer and no layer is dropped.
    #[test]
    fn ranges_cover_every_layer() {
        for n in 2..12 {
            for head in [0.0, 1e6, 1e9] {
                for w in [vec![1.0, 1.0], vec![1.0, 2.0, 1.0]] {
                    if w.len() > n {
                        continue;
                    }
                    let r = pipeline_layers_balanced(&vec![1e5; n], head, &vec![3e5; n], head * 1.5, &w).unwrap();
                    assert_eq!(r.len(), w.len());
                    assert_eq!((r[0].start, r[r.len() - 1].end), (0, n));
                    assert!(r.windows(2).all(|p| p[0].end == p[1].start));
                    assert!(r.iter().all(|x| !x.is_empty()));
                }
            }
        }
    }
}
