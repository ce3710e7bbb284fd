//! The shard plan: which layers each pipeline stage computes, and which heads,
//! MLP columns and vocabulary rows each tensor-parallel rank owns.
//!
//! Rules (each tested below):
//! * pipeline: contiguous layer ranges in proportion to the stage weights (e.g.
//!   usable memory), every stage at least one layer, no layer dropped;
//! * tensor: when `tp ≤ kv_heads`, whole GQA groups (a KV head and its query heads)
//!   per rank, weighted; when `tp > kv_heads`, each rank takes one KV head
//!   (replicated across the ranks that share it) and a share of its query heads;
//! * MLP columns in multiples of the weight's quant block, weighted;
//! * vocabulary rows weighted (row slices are free).

use std::ops::Range;

/// Splits `n` items into `weights.len()` contiguous ranges in proportion to the
/// weights, in units of `unit` items (the last range takes the remainder), every
/// range non-empty when `n ≥ unit · parts`.
pub fn proportional_ranges(n: usize, weights: &[f64], unit: usize) -> Vec<Range<usize>> {
    let parts = weights.len().max(1);
    let units = n / unit;
    let total: f64 = weights.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let mut bounds = vec![0usize];
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate().take(parts - 1) {
        acc += w / total;
        let mut b = (acc * units as f64).round() as usize;
        // Keep at least one unit for this range and for each that follows.
        let prev = bounds[i];
        let min = if units >= parts { prev + 1 } else { prev };
        let max = if units >= parts { units - (parts - 1 - i) } else { units };
        b = b.clamp(min, max.max(min));
        bounds.push(b);
    }
    let mut out: Vec<Range<usize>> = bounds.windows(2).map(|w| w[0] * unit..w[1] * unit).collect();
    let last = *bounds.last().unwrap() * unit;
    out.push(last..n);
    out
}

/// What one tensor-parallel rank owns of every layer.
#[derive(Debug, Clone, PartialEq)]
pub struct TpSlice {
    pub q_heads: Range<usize>,
    pub kv_heads: Range<usize>,
    pub ffn: Range<usize>,
    pub vocab: Range<usize>,
    /// Every rank's vocabulary rows, for gathering vocab-parallel logits.
    pub vocab_all: Vec<Range<usize>>,
    /// Every rank's query heads and MLP columns (for the exact mode's gathers).
    pub q_heads_all: Vec<Range<usize>>,
    pub ffn_all: Vec<Range<usize>>,
    /// Exact mode: o and down projections split by *output* rows (this rank's
    /// `hidden` range) after gathering their full inputs, so every value is
    /// computed exactly as in one process (bit-identical logits even with 8-bit
    /// activation quantization), at the cost of four all-gathers per layer
    /// instead of two all-reduces.
    pub exact: bool,
    pub hidden: Range<usize>,
    pub hidden_all: Vec<Range<usize>>,
    /// Every rank's weight, this rank's index and the quant block the widths are
    /// cut in: [`TpSlice::part_of`] slices further widths (MoE experts) alike.
    pub weights: Vec<f64>,
    pub rank: usize,
    pub block: usize,
    /// Expert parallelism: the routed experts this rank holds whole (`None`:
    /// every expert, each sliced like the MLP).
    pub experts: Option<Range<usize>>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot split {heads} attention heads over {ranks} tensor-parallel ranks")]
    TooFewHeads { heads: usize, ranks: usize },
    #[error("cannot split an MLP of width {ffn} over {ranks} ranks in blocks of {block}")]
    TooNarrow { ffn: usize, ranks: usize, block: usize },
    #[error("cannot place {experts} experts on {ranks} expert-parallel ranks")]
    TooFewExperts { experts: usize, ranks: usize },
    #[error("cannot split {layers} layers over {stages} pipeline stages")]
    TooFewLayers { layers: usize, stages: usize },
}

/// Layer ranges of the pipeline stages, in data-flow order (first range embeds).
pub fn pipeline_layers(n_layers: usize, weights: &[f64]) -> Result<Vec<Range<usize>>, PlanError> {
    if weights.len() > n_layers {
        return Err(PlanError::TooFewLayers { layers: n_layers, stages: weights.len() });
    }
    Ok(proportional_ranges(n_layers, weights, 1))
}

/// Layer ranges that balance *bytes* rather than layer counts: the last stage in
/// data-flow order also holds the lm_head (`head_bytes`), so it gets fewer layers.
/// Each stage's share of all bytes follows its weight (e.g. usable memory).
pub fn pipeline_layers_by_bytes(
    n_layers: usize,
    layer_bytes: f64,
    head_bytes: f64,
    weights: &[f64],
) -> Result<Vec<Range<usize>>, PlanError> {
    pipeline_layers_by_layer_bytes(&vec![layer_bytes; n_layers], head_bytes, weights)
}

/// [`pipeline_layers_by_bytes`] for layers of different sizes (`layer_bytes[i]`
/// for layer `i`: a model whose first layers are dense and the rest MoE, as
/// DeepSeek's): each boundary goes where the running sum of layer bytes comes
/// closest to the stages' shares, ties to the later layer (so equal layers
/// split as `round` would).
pub fn pipeline_layers_by_layer_bytes(
    layer_bytes: &[f64],
    head_bytes: f64,
    weights: &[f64],
) -> Result<Vec<Range<usize>>, PlanError> {
    let (n_layers, stages) = (layer_bytes.len(), weights.len());
    if stages > n_layers {
        return Err(PlanError::TooFewLayers { layers: n_layers, stages });
    }
    let layers_total: f64 = layer_bytes.iter().sum();
    if layers_total <= 0.0 {
        return pipeline_layers(n_layers, weights);
    }
    // prefix[k]: bytes of layers 0..k.
    let prefix: Vec<f64> = std::iter::once(0.0)
        .chain(layer_bytes.iter().scan(0.0, |acc, b| {
            *acc += b;
            Some(*acc)
        }))
        .collect();
    let total_w: f64 = weights.iter().sum();
    let total_bytes = layers_total + head_bytes;
    let mut bounds = vec![0usize];
    let mut cum = 0.0;
    for i in 0..stages - 1 {
        cum += total_bytes * weights[i] / total_w;
        let (min, max) = (bounds[i] + 1, n_layers - (stages - 1 - i));
        let mut best = min;
        for k in min..=max {
            // Relative slack keeps float noise from breaking exact ties.
            if (prefix[k] - cum).abs() <= (prefix[best] - cum).abs() * (1.0 + 1e-12) {
                best = k;
            }
        }
        bounds.push(best);
    }
    bounds.push(n_layers);
    Ok(bounds.windows(2).map(|w| w[0]..w[1]).collect())
}

/// The tensor-parallel slice of rank `rank` among `weights.len()` ranks.
#[allow(clippy::too_many_arguments)]
pub fn tp_slice(
    n_heads: usize,
    n_kv: usize,
    ffn: usize,
    vocab: usize,
    ffn_block: usize,
    weights: &[f64],
    rank: usize,
) -> Result<TpSlice, PlanError> {
    let tp = weights.len();
    let mut q_heads_all = Vec::with_capacity(tp);
    let mut kv_all = Vec::with_capacity(tp);
    for r in 0..tp {
        let (q, kv) = heads_of(n_heads, n_kv, weights, r)?;
        q_heads_all.push(q);
        kv_all.push(kv);
    }
    if ffn / ffn_block < tp {
        return Err(PlanError::TooNarrow { ffn, ranks: tp, block: ffn_block });
    }
    let ffn_all = proportional_ranges(ffn, weights, ffn_block);
    let vocab_all = proportional_ranges(vocab, weights, 1);
    Ok(TpSlice {
        q_heads: q_heads_all[rank].clone(),
        kv_heads: kv_all[rank].clone(),
        ffn: ffn_all[rank].clone(),
        vocab: vocab_all[rank].clone(),
        vocab_all,
        q_heads_all,
        ffn_all,
        exact: false,
        hidden: 0..0,
        hidden_all: vec![],
        weights: weights.to_vec(),
        rank,
        block: ffn_block,
        experts: None,
    })
}

impl TpSlice {
    /// Switches MoE blocks to expert parallelism: this rank holds a contiguous
    /// run of whole experts, as many as its weight's share (all experts have
    /// the same bytes, so this balances bytes), at least one each.
    pub fn expert_parallel(mut self, n_experts: usize) -> Result<TpSlice, PlanError> {
        let ranks = self.weights.len();
        if n_experts < ranks {
            return Err(PlanError::TooFewExperts { experts: n_experts, ranks });
        }
        self.experts = Some(proportional_ranges(n_experts, &self.weights, 1)[self.rank].clone());
        Ok(self)
    }

    /// This rank's part of another intermediate width (an expert's, a shared
    /// expert's), cut like the MLP columns: weighted, in whole quant blocks.
    pub fn part_of(&self, width: usize) -> Result<Range<usize>, PlanError> {
        let ranks = self.weights.len();
        if width / self.block < ranks {
            return Err(PlanError::TooNarrow { ffn: width, ranks, block: self.block });
        }
        Ok(proportional_ranges(width, &self.weights, self.block)[self.rank].clone())
    }

    /// Switches to exact mode, splitting the `hidden` output rows of o and down.
    pub fn exact(mut self, hidden: usize, weights: &[f64], rank: usize) -> TpSlice {
        self.hidden_all = proportional_ranges(hidden, weights, 1);
        self.hidden = self.hidden_all[rank].clone();
        self.exact = true;
        self
    }
}

/// Query and KV heads of rank `rank` (see the module rules).
fn heads_of(
    n_heads: usize,
    n_kv: usize,
    weights: &[f64],
    rank: usize,
) -> Result<(Range<usize>, Range<usize>), PlanError> {
    let tp = weights.len();
    if n_heads < tp {
        return Err(PlanError::TooFewHeads { heads: n_heads, ranks: tp });
    }
    let group = n_heads / n_kv;
    if tp <= n_kv {
        let kv = proportional_ranges(n_kv, weights, 1)[rank].clone();
        return Ok((kv.start * group..kv.end * group, kv));
    }
    // Ranks are dealt to KV heads; those sharing a KV head split its query heads.
    let kv_of = |r: usize| r * n_kv / tp;
    let kv = kv_of(rank);
    let sharing: Vec<usize> = (0..tp).filter(|&r| kv_of(r) == kv).collect();
    if sharing.len() > group {
        return Err(PlanError::TooFewHeads { heads: n_heads, ranks: tp });
    }
    let idx = sharing.iter().position(|&r| r == rank).unwrap();
    let sub = proportional_ranges(group, &vec![1.0; sharing.len()], 1)[idx].clone();
    Ok((kv * group + sub.start..kv * group + sub.end, kv..kv + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipeline_covers_every_layer_once() {
        for n in 1..40 {
            for stages in 1..=n.min(5) {
                for w in [vec![1.0; stages], (1..=stages).map(|i| i as f64).collect()] {
                    let r = pipeline_layers(n, &w).unwrap();
                    assert_eq!(r.len(), stages);
                    assert_eq!(r[0].start, 0);
                    assert_eq!(r.last().unwrap().end, n);
                    for p in r.windows(2) {
                        assert_eq!(p[0].end, p[1].start);
                    }
                    assert!(r.iter().all(|x| !x.is_empty()), "{n} {w:?} {r:?}");
                }
            }
        }
        assert_eq!(pipeline_layers(30, &[1.0, 2.0]).unwrap(), vec![0..10, 10..30]);
        assert!(pipeline_layers(2, &[1.0; 3]).is_err());
    }

    #[test]
    fn byte_balanced_split_gives_the_head_stage_fewer_layers() {
        // SmolLM2: ~2.3 MB per layer, 28 MB tied embedding/lm_head on the last stage.
        let r = pipeline_layers_by_bytes(30, 2.3e6, 28e6, &[1.0, 1.0]).unwrap();
        assert_eq!(r, vec![0..21, 21..30]);
        for n in 2..20 {
            for head in [0.0, 1e6, 1e9] {
                let r = pipeline_layers_by_bytes(n, 1e5, head, &[1.0, 2.0]).unwrap();
                assert_eq!((r[0].start, r[1].end, r[0].end), (0, n, r[1].start));
                assert!(r.iter().all(|x| !x.is_empty()));
            }
        }
    }

    #[test]
    fn smollm2_heads_over_two_and_four_ranks() {
        // 9 query heads, 3 KV heads (groups of 3), ffn 1536 in blocks of 32.
        let a = tp_slice(9, 3, 1536, 49152, 32, &[1.0, 1.0], 0).unwrap();
        let b = tp_slice(9, 3, 1536, 49152, 32, &[1.0, 1.0], 1).unwrap();
        assert_eq!((a.kv_heads.clone(), b.kv_heads.clone()), (0..2, 2..3));
        assert_eq!((a.q_heads, b.q_heads), (0..6, 6..9));
        assert_eq!((a.ffn.clone(), b.ffn.clone()), (0..768, 768..1536));
        assert_eq!(a.vocab.end, b.vocab.start);
        // 4 ranks > 3 KV heads: KV head 0 is shared by ranks 0 and 1.
        let s: Vec<TpSlice> = (0..4).map(|r| tp_slice(9, 3, 1536, 49152, 32, &[1.0; 4], r).unwrap()).collect();
        assert_eq!(s[0].kv_heads, 0..1);
        assert_eq!(s[1].kv_heads, 0..1);
        assert_eq!(s[0].q_heads.len() + s[1].q_heads.len(), 3);
        let mut q: Vec<usize> = s.iter().flat_map(|x| x.q_heads.clone()).collect();
        q.sort();
        assert_eq!(q, (0..9).collect::<Vec<_>>());
    }

    #[test]
    fn weighted_widths() {
        let s = tp_slice(8, 8, 1024, 100, 32, &[3.0, 1.0], 0).unwrap();
        assert_eq!(s.kv_heads, 0..6);
        assert_eq!(s.ffn, 0..768);
        assert!(tp_slice(2, 2, 1024, 100, 32, &[1.0; 3], 0).is_err());
    }

    #[test]
    fn expert_widths_follow_the_mlp_rule() {
        let parts: Vec<Range<usize>> =
            (0..2).map(|r| tp_slice(8, 8, 1024, 100, 32, &[3.0, 1.0], r).unwrap().part_of(256).unwrap()).collect();
        assert_eq!(parts, vec![0..192, 192..256]);
        let s = tp_slice(8, 8, 1024, 100, 32, &[1.0; 4], 3).unwrap();
        assert_eq!(s.part_of(128).unwrap(), 96..128);
        assert!(matches!(s.part_of(64), Err(PlanError::TooNarrow { ffn: 64, ranks: 4, block: 32 })));
    }

    #[test]
    fn experts_are_placed_whole_by_weight() {
        let held = |w: &[f64], r| tp_slice(8, 8, 1024, 100, 32, w, r).unwrap().expert_parallel(8).unwrap().experts;
        assert_eq!((held(&[1.0; 2], 0), held(&[1.0; 2], 1)), (Some(0..4), Some(4..8)));
        assert_eq!((held(&[3.0, 1.0], 0), held(&[3.0, 1.0], 1)), (Some(0..6), Some(6..8)));
        let s = tp_slice(8, 8, 1024, 100, 32, &[1.0; 4], 0).unwrap();
        assert!(matches!(s.expert_parallel(3), Err(PlanError::TooFewExperts { experts: 3, ranks: 4 })));
    }

    #[test]
    fn uneven_layers_split_by_their_own_bytes() {
        // Three small dense layers, then five MoE layers four times their size.
        let bytes = [1.0, 1.0, 1.0, 4.0, 4.0, 4.0, 4.0, 4.0];
        let r = pipeline_layers_by_layer_bytes(&bytes, 0.0, &[1.0, 1.0]).unwrap();
        // 23 bytes in all: half is 11.5, reached after layer 5 (3 + 8 = 11).
        assert_eq!(r, vec![0..5, 5..8]);
        // Equal layers split as before.
        let even = pipeline_layers_by_layer_bytes(&[2.0; 10], 4.0, &[1.0, 1.0, 1.0]).unwrap();
        assert_eq!(even, pipeline_layers_by_bytes(10, 2.0, 4.0, &[1.0, 1.0, 1.0]).unwrap());
    }
}
