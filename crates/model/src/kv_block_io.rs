//! One block of a paged pool as bytes, out and back in: the disk tier of the
//! prefix cache (`engine::kv_disk`) stores full blocks this way.
//!
//! A block's bytes are, for every owned layer with K/V storage in the full
//! block group (in layer order): its K rows, then its V rows, each `block ×
//! row` elements of the pool's type, as they lie in memory. Sliding-window
//! layers keep their rows in the window group and are not part of a block.

use crate::kv_cache::{KvLayers, KvPool};

impl KvPool {
    /// Elements of one layer's K (or V, `v`) rows in one block.
    fn block_elems(&self, v: bool) -> usize {
        let w = if v { self.v_width } else { self.kv_width };
        self.block * w.div_ceil(self.kv_type().block_values())
    }

    /// Appends block `b`'s bytes ([`KvPool::block_bytes`] of them) to `out`.
    pub fn copy_block_out(&self, b: usize, out: &mut Vec<u8>) {
        let (nk, nv) = (self.block_elems(false), self.block_elems(true));
        let win = &self.window_layers;
        fn go<T: bytemuck::Pod>(
            l: &[(Vec<T>, Vec<T>)],
            win: &[bool],
            b: usize,
            nk: usize,
            nv: usize,
            out: &mut Vec<u8>,
        ) {
            for (i, (k, v)) in l.iter().enumerate() {
                if k.is_empty() || win.get(i).copied().unwrap_or(false) {
                    continue;
                }
                out.extend_from_slice(bytemuck::cast_slice(&k[b * nk..(b + 1) * nk]));
                if !v.is_empty() {
                    out.extend_from_slice(bytemuck::cast_slice(&v[b * nv..(b + 1) * nv]));
                }
            }
        }
        match &self.layers {
            KvLayers::F16(l) => go(l, win, b, nk, nv, out),
            KvLayers::F32(l) => go(l, win, b, nk, nv, out),
            KvLayers::Q8_0(l) => go(l, win, b, nk, nv, out),
            KvLayers::Q4_0(l) => go(l, win, b, nk, nv, out),
        }
    }

    /// Writes `data` (bytes from [`KvPool::copy_block_out`] of a pool of the
    /// same shape) into block `b`. False, with nothing written, when `data`
    /// is not exactly one block's bytes or `b` is out of range.
    pub fn copy_block_in(&mut self, b: usize, data: &[u8]) -> bool {
        if b >= self.n_blocks || data.len() != self.block_bytes() {
            return false;
        }
        let (nk, nv) = (self.block_elems(false), self.block_elems(true));
        let win = self.window_layers.clone();
        fn go<T: bytemuck::Pod>(l: &mut [(Vec<T>, Vec<T>)], win: &[bool], b: usize, nk: usize, nv: usize, data: &[u8]) {
            let mut at = 0;
            let mut take = |dst: &mut [T]| {
                let n = std::mem::size_of_val(dst);
                bytemuck::cast_slice_mut::<T, u8>(dst).copy_from_slice(&data[at..at + n]);
                at += n;
            };
            for (i, (k, v)) in l.iter_mut().enumerate() {
                if k.is_empty() || win.get(i).copied().unwrap_or(false) {
                    continue;
                }
                take(&mut k[b * nk..(b + 1) * nk]);
                if !v.is_empty() {
                    take(&mut v[b * nv..(b + 1) * nv]);
                }
            }
        }
        match &mut self.layers {
            KvLayers::F16(l) => go(l, &win, b, nk, nv, data),
            KvLayers::F32(l) => go(l, &win, b, nk, nv, data),
            KvLayers::Q8_0(l) => go(l, &win, b, nk, nv, data),
            KvLayers::Q4_0(l) => go(l, &win, b, nk, nv, data),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::kv_cache::{KvPool, KvType};

    #[test]
    fn a_block_goes_out_and_back_in_every_kv_type() {
        for ty in KvType::ALL {
            let mut a = KvPool::new(3, 64, 4, 5, ty);
            // Fill block 2 with a recognizable pattern through the byte view.
            let n = a.block_bytes();
            let pattern: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            assert!(a.copy_block_in(2, &pattern), "{ty:?}");
            let mut out = Vec::new();
            a.copy_block_out(2, &mut out);
            assert_eq!(out, pattern, "{ty:?}");
            // Other blocks are untouched.
            out.clear();
            a.copy_block_out(1, &mut out);
            assert!(out.iter().all(|&x| x == 0), "{ty:?}");
            assert!(!a.copy_block_in(2, &pattern[1..]), "a short buffer is refused");
            assert!(!a.copy_block_in(5, &pattern), "a block out of range is refused");
        }
    }
}
