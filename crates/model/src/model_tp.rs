//! Exact tensor parallelism (`--tp-exact`): the column slices each rank
//! computed, all-gathered so every rank holds the whole matrix.

use crate::shard::AllReduce;
use crate::workspace::{grow, Workspace};
use crate::ModelError;

/// Where [`gather_columns`] writes.
pub(super) enum Dest {
    FullIn,
    O,
}

/// All-gathers column slices: rank `r` holds columns `all[r]` (in units of `unit`
/// values) of an `n`-row matrix; every rank ends with the whole matrix. Slices are
/// padded to the widest for the all-gather.
pub(super) fn gather_columns(
    comm: &dyn AllReduce,
    local: &[f32],
    n: usize,
    all: &[std::ops::Range<usize>],
    unit: usize,
    ws: &mut Workspace,
    dest: Dest,
) -> Result<(), ModelError> {
    let width = all.iter().map(|r| r.len()).max().unwrap_or(0) * unit;
    let total: usize = all.iter().map(|r| r.len()).sum::<usize>() * unit;
    let mine = local.len() / n.max(1);
    grow(&mut ws.padded, n * width);
    for t in 0..n {
        ws.padded[t * width..t * width + mine].copy_from_slice(&local[t * mine..(t + 1) * mine]);
    }
    grow(&mut ws.gather, all.len() * n * width);
    comm.all_gather(&ws.padded[..n * width], &mut ws.gather[..all.len() * n * width])?;
    let out = match dest {
        Dest::FullIn => &mut ws.full_in,
        Dest::O => &mut ws.o,
    };
    for (r, range) in all.iter().enumerate() {
        let len = range.len() * unit;
        for t in 0..n {
            let src = &ws.gather[(r * n + t) * width..][..len];
            out[t * total + range.start * unit..][..len].copy_from_slice(src);
        }
    }
    Ok(())
}
