//! Lookup tables of the IQ1_S and IQ1_M decode dots (AVX2 and AVX-512):
//! grid rows made unsigned, so `vpmaddubsw`/`vpdpbusd` take a gathered row
//! as it is. Built once, from [`IQ1S_GRID`].

use crate::quant::iq_grids::IQ1S_GRID;
use std::sync::OnceLock;

/// [`IQ1S_GRID`] with 1 added to every value (bytes 0, 1, 2): unsigned, so
/// `vpdpbusd` takes the looked-up rows as they are, where ternary codes
/// needed an absolute value, a sign mask and a masked negation (three of the
/// kernel's ~25 vector µops a chunk). The `+1` comes back out with the
/// sub-blocks' activation sums, beside the shift term (`iq1_s_terms` in the kernels).
pub(super) fn iq1s_grid_plus_one() -> &'static [u64; 2048] {
    static T: OnceLock<Box<[u64; 2048]>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Box::new([0u64; 2048]);
        for (o, &g) in t.iter_mut().zip(IQ1S_GRID.iter()) {
            *o = u64::from_le_bytes(g.to_le_bytes().map(|b| (b as i8 + 1) as u8));
        }
        t
    })
}

/// IQ1_M's codes `8·grid ± 1` plus 9 (bytes 0, 2, 8, 10, 16, 18: unsigned for
/// `vpdpbusd`) for the 12-bit index `grid index | minus << 11` (the group's
/// nibble bit 3, the shift's sign, lands on bit 11): the sign folds into the
/// lookup, where signed codes needed an absolute value, a sign mask and a
/// masked negation. The `+9` leaves as `9·Σ ls·bsums` (in the kernels). 32 KiB.
pub(super) fn iq1m_codes_plus_nine() -> &'static [u64; 4096] {
    static T: OnceLock<Box<[u64; 4096]>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Box::new([0u64; 4096]);
        for (i, o) in t.iter_mut().enumerate() {
            let sign: i8 = if i >> 11 == 1 { -1 } else { 1 };
            let g = IQ1S_GRID[i & 2047].to_le_bytes();
            *o = u64::from_le_bytes(g.map(|b| (8 * b as i8 + sign + 9) as u8));
        }
        t
    })
}
