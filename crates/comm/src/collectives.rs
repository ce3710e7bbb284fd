//! Reductions: all-reduce and reduce-scatter, plus the ring building blocks.
//!
//! Paths, chosen identically on every rank from the payload size:
//! - **direct** (small payload, ≤ `direct_max_ranks`): one exchange in which
//!   every rank sends its vector to every other; one network latency.
//! - **recursive doubling** (small payload, more ranks): log2(n) exchanges.
//! - **ring** (large payload, or a ring topology): reduce-scatter then
//!   all-gather, moving 2(n-1)/n of the data per rank. The buffer is cut in two
//!   halves that circle in opposite directions at once, so both directions of
//!   every full-duplex link carry data (MLX's trick).
//!
//! Determinism: every rank must end with bit-identical sums. The direct path
//! sums contributions in rank order on every rank; recursive doubling combines
//! identical pairs of partials (IEEE addition is commutative); the ring
//! computes each final chunk once and copies it. With [`Wire::Q8`] each rank
//! first replaces its own contribution by the decoded form of what it sends,
//! so everybody adds the same numbers.

use crate::error::{CommError, Result};
use crate::group::Group;
use crate::wire::Wire;
use std::ops::Range;

/// The `i`-th of `parts` near-equal contiguous pieces of `0..len` (the first
/// `len % parts` pieces are one longer). Used to cut vectors across ranks.
pub fn chunk_range(len: usize, parts: usize, i: usize) -> Range<usize> {
    let (base, rem) = (len / parts, len % parts);
    let start = i * base + i.min(rem);
    start..start + base + usize::from(i < rem)
}

/// One ring pass over a set of chunks, circling in direction `dir` (±1).
/// After reduce-scatter, rank `r` owns chunk `(r + dir + shift) mod n`.
pub(crate) struct Lane {
    pub chunks: Vec<Range<usize>>,
    pub dir: isize,
    pub shift: usize,
}

impl Lane {
    fn at(&self, g: &Group, k: isize) -> Range<usize> {
        let n = g.size() as isize;
        let i = (g.rank() as isize + k + self.shift as isize).rem_euclid(n) as usize;
        self.chunks[i].clone()
    }
}

/// Splits `buf` into the (pairwise disjoint) `ranges`, returned in input order.
fn disjoint_mut<'a>(buf: &'a mut [u8], ranges: &[Range<usize>]) -> Vec<&'a mut [u8]> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));
    let mut out: Vec<Option<&'a mut [u8]>> = (0..ranges.len()).map(|_| None).collect();
    let (mut rest, mut base) = (buf, 0);
    for i in order {
        let r = &ranges[i];
        if r.is_empty() {
            out[i] = Some(&mut []);
            continue;
        }
        assert!(r.start >= base, "overlapping ranges");
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - base);
        let (mine, tail) = tail.split_at_mut(r.len());
        out[i] = Some(mine);
        rest = tail;
        base = r.end;
    }
    out.into_iter().map(|s| s.expect("every range assigned")).collect()
}

fn encode(wire: Wire, values: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; wire.encoded_len(values.len())];
    wire.encode(values, &mut out);
    out
}

impl Group {
    /// Sums `buf` element-wise across the group; every rank gets the same bits.
    /// Uses the group's [`Wire`] encoding.
    pub fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.all_reduce_sum_f32_wire(buf, self.wire)
    }

    /// [`Group::all_reduce_sum_f32`] with an explicit wire encoding.
    pub fn all_reduce_sum_f32_wire(&self, buf: &mut [f32], wire: Wire) -> Result<()> {
        let n = self.size();
        if n == 1 || buf.is_empty() {
            return Ok(());
        }
        if self.small(wire.encoded_len(buf.len())) {
            return if n <= self.tuning.direct_max_ranks {
                self.all_reduce_direct(buf, wire)
            } else {
                self.all_reduce_doubling(buf, wire)
            };
        }
        let len = buf.len();
        let lanes = if len >= 2 * n * crate::wire::Q8_BLOCK {
            let half = (len / 2).next_multiple_of(crate::wire::Q8_BLOCK);
            vec![
                Lane { chunks: (0..n).map(|i| chunk_range(half, n, i)).collect(), dir: 1, shift: 0 },
                Lane {
                    chunks: (0..n)
                        .map(|i| chunk_range(len - half, n, i))
                        .map(|r| r.start + half..r.end + half)
                        .collect(),
                    dir: -1,
                    shift: 0,
                },
            ]
        } else {
            vec![Lane { chunks: (0..n).map(|i| chunk_range(len, n, i)).collect(), dir: 1, shift: 0 }]
        };
        self.ring_reduce_scatter(buf, &lanes, wire)?;
        self.ring_all_gather_f32(buf, &lanes, wire)
    }

    /// Sums `input` across the group and leaves chunk `rank` of the sum in
    /// `output`. Chunks are [`chunk_range`]`(input.len(), size, rank)`.
    pub fn reduce_scatter_sum_f32(&self, input: &[f32], output: &mut [f32]) -> Result<()> {
        let (n, len) = (self.size(), input.len());
        let chunks: Vec<Range<usize>> = (0..n).map(|i| chunk_range(len, n, i)).collect();
        let mine = chunks[self.rank].clone();
        if output.len() != mine.len() {
            return Err(CommError::invalid(format!(
                "reduce_scatter: output of {} values, rank {} owns {} of {len}",
                output.len(),
                self.rank,
                mine.len()
            )));
        }
        if n == 1 {
            output.copy_from_slice(input);
            return Ok(());
        }
        let wire = self.wire;
        if self.small(wire.encoded_len(len)) {
            let encoded: Vec<Vec<u8>> = chunks.iter().map(|c| encode(wire, &input[c.clone()])).collect();
            let mut got: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; wire.encoded_len(mine.len())]).collect();
            let sends: Vec<(usize, &[u8])> = (0..n).filter(|&p| p != self.rank).map(|p| (p, &encoded[p][..])).collect();
            let mut recvs: Vec<(usize, &mut [u8])> =
                got.iter_mut().enumerate().filter(|(p, _)| *p != self.rank).map(|(p, b)| (p, &mut b[..])).collect();
            self.xchg(&sends, &mut recvs)?;
            got[self.rank] = encoded[self.rank].clone();
            wire.decode(&got[0], output);
            for bytes in &got[1..] {
                wire.decode_add(bytes, output);
            }
            return Ok(());
        }
        let mut work = input.to_vec();
        let lane = Lane { chunks, dir: 1, shift: n - 1 };
        self.ring_reduce_scatter(&mut work, std::slice::from_ref(&lane), wire)?;
        output.copy_from_slice(&work[mine]);
        Ok(())
    }

    /// One exchange: everyone sends its (encoded) vector to everyone, and
    /// every rank adds the n contributions in rank order.
    fn all_reduce_direct(&self, buf: &mut [f32], wire: Wire) -> Result<()> {
        if wire == Wire::F32 {
            return self.all_reduce_direct_f32(buf);
        }
        let n = self.size();
        let mine = encode(wire, buf);
        let mut got: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; mine.len()]).collect();
        let sends: Vec<(usize, &[u8])> = (0..n).filter(|&p| p != self.rank).map(|p| (p, &mine[..])).collect();
        let mut recvs: Vec<(usize, &mut [u8])> =
            got.iter_mut().enumerate().filter(|(p, _)| *p != self.rank).map(|(p, b)| (p, &mut b[..])).collect();
        self.xchg(&sends, &mut recvs)?;
        got[self.rank] = mine;
        wire.decode(&got[0], buf);
        for bytes in &got[1..] {
            wire.decode_add(bytes, buf);
        }
        Ok(())
    }

    /// The direct path without encoding: send straight from `buf`, receive into
    /// one scratch block, then add block by block in rank order (in place).
    fn all_reduce_direct_f32(&self, buf: &mut [f32]) -> Result<()> {
        const BLOCK: usize = 512;
        let (n, me, len) = (self.size(), self.rank, buf.len());
        let mut scratch = vec![0f32; (n - 1) * len];
        {
            let mine: &[u8] = bytemuck::cast_slice(buf);
            let sends: Vec<(usize, &[u8])> = (0..n).filter(|&p| p != me).map(|p| (p, mine)).collect();
            let mut recvs: Vec<(usize, &mut [u8])> = (0..n)
                .filter(|&p| p != me)
                .zip(scratch.chunks_mut(len))
                .map(|(p, s)| (p, bytemuck::cast_slice_mut(s)))
                .collect();
            self.xchg(&sends, &mut recvs)?;
        }
        let slot = |j: usize| if j < me { j } else { j - 1 } * len;
        let mut acc = [0f32; BLOCK];
        for start in (0..len).step_by(BLOCK) {
            let end = (start + BLOCK).min(len);
            let acc = &mut acc[..end - start];
            for j in 0..n {
                let x = if j == me { &buf[start..end] } else { &scratch[slot(j) + start..slot(j) + end] };
                if j == 0 {
                    acc.copy_from_slice(x);
                } else {
                    acc.iter_mut().zip(x).for_each(|(a, v)| *a += v);
                }
            }
            buf[start..end].copy_from_slice(acc);
        }
        Ok(())
    }

    /// Recursive doubling over the largest power of two `p ≤ n`; ranks `p..n`
    /// first fold into ranks `0..n-p` and get the exact result back at the end.
    fn all_reduce_doubling(&self, buf: &mut [f32], wire: Wire) -> Result<()> {
        let (n, r) = (self.size(), self.rank);
        let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let extra = n - p;
        let exact = bytemuck::cast_slice_mut::<f32, u8>;
        if r >= p {
            self.xchg(&[(r - p, &encode(wire, buf))], &mut [])?;
            return self.xchg(&[], &mut [(r - p, exact(buf))]);
        }
        let mut mine = encode(wire, buf);
        let mut theirs = vec![0u8; mine.len()];
        if r < extra {
            self.xchg(&[], &mut [(r + p, &mut theirs)])?;
            wire.decode(&mine, buf);
            wire.decode_add(&theirs, buf);
            wire.encode(buf, &mut mine);
        }
        let mut mask = 1;
        while mask < p {
            let partner = r ^ mask;
            self.xchg(&[(partner, &mine)], &mut [(partner, &mut theirs)])?;
            let (lo, hi) = if r < partner { (&mine, &theirs) } else { (&theirs, &mine) };
            wire.decode(lo, buf);
            wire.decode_add(hi, buf);
            mask *= 2;
            if mask < p {
                wire.encode(buf, &mut mine);
            }
        }
        if r < extra {
            self.xchg(&[(r + p, bytemuck::cast_slice(buf))], &mut [])?;
        }
        Ok(())
    }

    /// Ring reduce-scatter over `lanes` (all lanes progress in the same exchanges).
    pub(crate) fn ring_reduce_scatter(&self, buf: &mut [f32], lanes: &[Lane], wire: Wire) -> Result<()> {
        let n = self.size() as isize;
        // Scratch sized for the largest chunk of each lane, reused by every step
        // (fresh large allocations would cost page faults on each step).
        let max_chunk = |l: &Lane| wire.encoded_len(l.chunks.iter().map(|c| c.len()).max().unwrap_or(0));
        let mut outgoing: Vec<Vec<u8>> = match wire {
            Wire::F32 => Vec::new(),
            Wire::Q8 => lanes.iter().map(|l| vec![0u8; max_chunk(l)]).collect(),
        };
        let mut incoming: Vec<Vec<u8>> = lanes.iter().map(|l| vec![0u8; max_chunk(l)]).collect();
        for s in 0..n - 1 {
            for (l, out) in lanes.iter().zip(outgoing.iter_mut()) {
                let c = l.at(self, -l.dir * s);
                wire.encode(&buf[c.clone()], &mut out[..wire.encoded_len(c.len())]);
            }
            {
                let sends: Vec<(usize, &[u8])> = lanes
                    .iter()
                    .enumerate()
                    .map(|(i, l)| {
                        let c = l.at(self, -l.dir * s);
                        let data: &[u8] = match wire {
                            Wire::F32 => bytemuck::cast_slice(&buf[c]),
                            Wire::Q8 => &outgoing[i][..wire.encoded_len(c.len())],
                        };
                        (self.rel(l.dir), data)
                    })
                    .collect();
                let mut recvs: Vec<(usize, &mut [u8])> = lanes
                    .iter()
                    .zip(incoming.iter_mut())
                    .map(|(l, b)| (self.rel(-l.dir), &mut b[..wire.encoded_len(l.at(self, -l.dir * (s + 1)).len())]))
                    .collect();
                self.xchg(&sends, &mut recvs)?;
            }
            for (l, bytes) in lanes.iter().zip(&incoming) {
                let c = l.at(self, -l.dir * (s + 1));
                wire.decode_add(&bytes[..wire.encoded_len(c.len())], &mut buf[c]);
            }
        }
        Ok(())
    }

    /// Ring all-gather of the chunks each rank owns after [`Group::ring_reduce_scatter`].
    pub(crate) fn ring_all_gather_f32(&self, buf: &mut [f32], lanes: &[Lane], wire: Wire) -> Result<()> {
        if wire == Wire::F32 {
            let bytes: Vec<Lane> = lanes
                .iter()
                .map(|l| Lane {
                    chunks: l.chunks.iter().map(|c| 4 * c.start..4 * c.end).collect(),
                    dir: l.dir,
                    shift: l.shift,
                })
                .collect();
            return self.ring_all_gather_bytes(bytemuck::cast_slice_mut(buf), &bytes);
        }
        let n = self.size() as isize;
        // Forward the exact bytes we received, so every rank decodes the same thing.
        let mut forward: Vec<Vec<u8>> = lanes
            .iter()
            .map(|l| {
                let own = l.at(self, l.dir);
                let enc = encode(wire, &buf[own.clone()]);
                wire.decode(&enc, &mut buf[own]);
                enc
            })
            .collect();
        for s in 0..n - 1 {
            let mut incoming: Vec<Vec<u8>> =
                lanes.iter().map(|l| vec![0u8; wire.encoded_len(l.at(self, -l.dir * s).len())]).collect();
            let sends: Vec<(usize, &[u8])> =
                lanes.iter().zip(&forward).map(|(l, f)| (self.rel(l.dir), &f[..])).collect();
            let mut recvs: Vec<(usize, &mut [u8])> =
                lanes.iter().zip(incoming.iter_mut()).map(|(l, b)| (self.rel(-l.dir), &mut b[..])).collect();
            self.xchg(&sends, &mut recvs)?;
            for (l, bytes) in lanes.iter().zip(&incoming) {
                wire.decode(bytes, &mut buf[l.at(self, -l.dir * s)]);
            }
            forward = incoming;
        }
        Ok(())
    }

    /// Ring all-gather of byte chunks: rank `r` starts owning chunk
    /// `(r + dir + shift) mod n` of each lane and ends with all of them.
    pub(crate) fn ring_all_gather_bytes(&self, buf: &mut [u8], lanes: &[Lane]) -> Result<()> {
        let n = self.size() as isize;
        for s in 0..n - 1 {
            let mut ranges: Vec<Range<usize>> = lanes.iter().map(|l| l.at(self, l.dir - l.dir * s)).collect();
            ranges.extend(lanes.iter().map(|l| l.at(self, -l.dir * s)));
            let mut parts = disjoint_mut(buf, &ranges);
            let recv_parts = parts.split_off(lanes.len());
            let sends: Vec<(usize, &[u8])> = lanes.iter().zip(&parts).map(|(l, p)| (self.rel(l.dir), &p[..])).collect();
            let mut recvs: Vec<(usize, &mut [u8])> =
                lanes.iter().zip(recv_parts).map(|(l, p)| (self.rel(-l.dir), p)).collect();
            self.xchg(&sends, &mut recvs)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_exactly() {
        for len in [0, 1, 5, 7, 64, 100] {
            for parts in 1..6 {
                let mut next = 0;
                for i in 0..parts {
                    let r = chunk_range(len, parts, i);
                    assert_eq!(r.start, next);
                    assert!(r.len() == len / parts || r.len() == len / parts + 1);
                    next = r.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn disjoint_slices_in_input_order() {
        let mut buf: Vec<u8> = (0..10).collect();
        let parts = disjoint_mut(&mut buf, &[6..8, 0..2, 3..3, 2..5]);
        assert_eq!(
            parts.iter().map(|p| p.to_vec()).collect::<Vec<_>>(),
            vec![vec![6, 7], vec![0, 1], vec![], vec![2, 3, 4]]
        );
    }
}
