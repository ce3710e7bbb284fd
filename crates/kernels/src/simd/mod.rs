//! x86-64 SIMD kernels. Each function is `#[target_feature]`-gated and only
//! reachable through the dispatch table ([`crate::dispatch::TABLE`]) after
//! [`crate::isa`] confirmed the CPU supports it. These files define kernels;
//! which type runs which is decided there only.

/// Runs a P·V row kernel `$kernel::<NR>(p, p_stride, args…, o)` over `rows`
/// output rows: runs of 4, then one run of the 3, 2 or 1 left (`p` and `o`
/// advanced by `r·p_stride` and `r·d` for the run starting at row `r`). The
/// attention P·V kernels share it: their register tiles are const-generic in
/// the rows, which a function cannot pass on.
macro_rules! by_row_runs {
    ($kernel:ident, $rows:expr, $d:expr, $p:expr, $p_stride:expr, ($($arg:expr),*), $o:expr) => {{
        let (rows, d, p, p_stride, o) = ($rows, $d, $p, $p_stride, $o);
        let mut r = 0;
        while r + 4 <= rows {
            $kernel::<4>(p.add(r * p_stride), p_stride, $($arg,)* o.add(r * d));
            r += 4;
        }
        let (p, o) = (p.add(r * p_stride), o.add(r * d));
        match rows - r {
            3 => $kernel::<3>(p, p_stride, $($arg,)* o),
            2 => $kernel::<2>(p, p_stride, $($arg,)* o),
            1 => $kernel::<1>(p, p_stride, $($arg,)* o),
            _ => {}
        }
    }};
}
pub(crate) use by_row_runs;

pub mod avx2;
pub mod avx2_attn;
pub mod avx2_fp;
pub mod avx2_gemm_32;
pub mod avx2_gemm_k;
pub mod avx2_grid_loads;
pub mod avx2_iq4nl;
pub mod avx2_k;
pub mod avx2_k45_rows;
pub mod avx2_kq4;
pub mod avx2_lowk;
pub mod avx2_ops;
pub mod avx2_packed;
pub mod avx2_q3k_recode;
pub mod avx2_q3k_rows;
pub mod avx2_q6k_rows;
pub mod avx2_rows;
pub mod avx2_rows16_k;
pub mod avx2_rows16_nl;
pub mod avx2_rows16_q2k;
pub mod avx2_rows16_q5;
pub mod avx2_tile;
pub mod avx512;
pub mod avx512_attn;
pub mod avx512_direct;
pub mod avx512_fp;
pub mod avx512_fp4;
pub mod avx512_fp4_vbmi;
pub mod avx512_fp8_bf16;
pub mod avx512_gemm;
pub mod avx512_gemm_k;
pub mod avx512_iq;
pub mod avx512_iq2_vbmi;
pub mod avx512_iq3_vbmi;
pub mod avx512_iq3s_recode;
pub mod avx512_iq3s_vbmi;
pub mod avx512_k;
pub mod avx512_lanes;
pub mod avx512_lowk;
pub mod avx512_packed;
pub mod avx512_rows16;
pub mod avx512_rows16_dec;
pub mod avx512_rows16_k;
pub mod avx512_rows16_nl;
pub mod avx512_rows16_q3k;
pub mod avx512_rows16_q5;
pub mod avx512_rows16_xs;
pub mod avx512_unpack16;
mod gemm_lowk;
mod iq1_tables;
pub mod kvq;
pub mod kvq_dot;
mod lane_gemm;
mod prepared_rows;
pub mod selftest;

/// Reproducible random bytes for the kernel tests (xorshift64).
#[cfg(test)]
pub(crate) struct XorShift(pub u64);

#[cfg(test)]
impl XorShift {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
