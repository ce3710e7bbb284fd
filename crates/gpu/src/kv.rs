//! The element types of the device KV pool and the shader code that stores
//! and loads them: f32, f16 (two values a word), and the GGUF blocks Q8_0
//! (an f16 scale and 32 int8 codes, 34 bytes) and Q4_0 (an f16 scale and 16
//! bytes of nibbles, 18 bytes), in exactly the host pool's byte layout
//! (`model::KvPool`), so a block moves between the two (the disk tier) as
//! the same bytes.
//!
//! A quantized row (`kv_heads × head_dim` values, whole blocks) must start
//! on a word: an even number of blocks a row. Stores then run one
//! invocation per pair of blocks (17 or 9 whole words), so no two
//! invocations write one word. They quantize as the host does: Q8_0
//! `d = amax/127`, `q = round_half_even(x · 127/amax)` (llama.cpp's x86
//! `quantize_row_q8_0`); Q4_0 `d = max/−8` with `max` the value of largest
//! magnitude, `q = min(15, trunc(x/d + 8.5))` (`quantize_row_q4_0_ref`).
//! Loads widen one value, `q · d`, as the host's do.

/// What one value of the device KV pool is stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvElem {
    F32,
    F16,
    Q8_0,
    Q4_0,
}

impl KvElem {
    /// Bytes of `values` stored values (whole blocks for the quantized types).
    pub fn bytes_for(self, values: usize) -> usize {
        match self {
            KvElem::F32 => 4 * values,
            KvElem::F16 => 2 * values,
            KvElem::Q8_0 => values.div_ceil(32) * 34,
            KvElem::Q4_0 => values.div_ceil(32) * 18,
        }
    }

    /// Whether rows of `values` can be stored: f16 needs an even width, the
    /// quantized types an even number of whole blocks (rows start on a word).
    pub fn fits_row(self, values: usize) -> bool {
        match self {
            KvElem::F32 => true,
            KvElem::F16 => values.is_multiple_of(2),
            KvElem::Q8_0 | KvElem::Q4_0 => values.is_multiple_of(64),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvElem::F32 => "f32",
            KvElem::F16 => "f16",
            KvElem::Q8_0 => "q8_0",
            KvElem::Q4_0 => "q4_0",
        }
    }

    /// Bytes of one block (the scale and the codes), for the quantized types.
    fn block_bytes(self) -> u32 {
        match self {
            KvElem::Q4_0 => 18,
            _ => 34,
        }
    }
}

/// A quantized pool's load of value `i` (`pool`'s rows of `kv_heads ·
/// head_dim` values, attention.wgsl's `p`): its block's f16 scale times its code.
fn quant_load(f: &str, pool: &str, kv: KvElem) -> String {
    let code = match kv {
        KvElem::Q4_0 => {
            "let qo = o + 2u + (j % 16u);\n\
             let by = (POOL[qo >> 2u] >> ((qo & 3u) * 8u)) & 0xffu;\n\
             let nib = select(by & 15u, by >> 4u, j >= 16u);\n\
             return d * (f32(nib) - 8.0);"
        }
        _ => {
            "let qo = o + 2u + j;\n\
             let by = (POOL[qo >> 2u] >> ((qo & 3u) * 8u)) & 0xffu;\n\
             return d * f32(bitcast<i32>(by << 24u) >> 24u);"
        }
    };
    format!(
        "fn {f}(i: u32) -> f32 {{\n\
         let rl = p.kv_heads * p.head_dim;\n\
         let e = i % rl;\n\
         let o = ((i / rl) * (rl / 32u) + e / 32u) * {bb}u;\n\
         let j = e % 32u;\n\
         let h = unpack2x16float(POOL[o >> 2u]);\n\
         let d = select(h.x, h.y, (o & 2u) == 2u);\n\
         {code}\n}}\n",
        bb = kv.block_bytes()
    )
    .replace("POOL", pool)
}

/// The pool bindings and loads of attention.wgsl.
pub(crate) fn attention_pools(kv: KvElem) -> String {
    match kv {
        KvElem::F32 => "@group(0) @binding(2) var<storage, read> kpool: array<f32>;\n\
             @group(0) @binding(3) var<storage, read> vpool: array<f32>;\n\
             fn kload(i: u32) -> f32 { return kpool[i]; }\n\
             fn vload(i: u32) -> f32 { return vpool[i]; }"
            .into(),
        KvElem::F16 => "@group(0) @binding(2) var<storage, read> kpool: array<u32>;\n\
             @group(0) @binding(3) var<storage, read> vpool: array<u32>;\n\
             fn kload(i: u32) -> f32 { let h = unpack2x16float(kpool[i >> 1u]); return select(h.x, h.y, (i & 1u) == 1u); }\n\
             fn vload(i: u32) -> f32 { let h = unpack2x16float(vpool[i >> 1u]); return select(h.x, h.y, (i & 1u) == 1u); }"
            .into(),
        KvElem::Q8_0 | KvElem::Q4_0 => format!(
            "@group(0) @binding(2) var<storage, read> kpool: array<u32>;\n\
             @group(0) @binding(3) var<storage, read> vpool: array<u32>;\n{}{}",
            quant_load("kload", "kpool", kv),
            quant_load("vload", "vpool", kv)
        ),
    }
}

/// The pool binding and store of kv_store.wgsl, and the invocations it needs
/// for `t` rows of `row` values.
pub(crate) fn kv_store_source(kv: KvElem) -> String {
    let (pool, store) = match kv {
        KvElem::F32 => (
            "@group(0) @binding(3) var<storage, read_write> pool: array<f32>;",
            "if (i >= p.row * p.t) { return; }\n\
             let j = i / p.row;\n\
             let e = i % p.row;\n\
             pool[slots[j] * p.row + e] = src[p.src_off + j * p.src_stride + e];",
        ),
        KvElem::F16 => (
            "@group(0) @binding(3) var<storage, read_write> pool: array<u32>;",
            "let half = p.row / 2u;\n\
             if (i >= half * p.t) { return; }\n\
             let j = i / half;\n\
             let e = 2u * (i % half);\n\
             let at = p.src_off + j * p.src_stride + e;\n\
             pool[slots[j] * half + e / 2u] = pack2x16float(vec2<f32>(src[at], src[at + 1u]));",
        ),
        KvElem::Q8_0 | KvElem::Q4_0 => {
            let q4 = kv == KvElem::Q4_0;
            let src = include_str!("shaders/kv_store_q.wgsl")
                .replace("BLOCK_BYTESu", &format!("{}u", kv.block_bytes()))
                .replace("Q4u", if q4 { "1u" } else { "0u" });
            return src;
        }
    };
    include_str!("shaders/kv_store.wgsl").replace("//POOL", pool).replace("//STORE", store)
}

/// Invocations of a store of `t` rows of `row` values.
pub(crate) fn kv_store_invocations(kv: KvElem, t: usize, row: usize) -> usize {
    match kv {
        KvElem::F32 => t * row,
        KvElem::F16 => t * row / 2,
        KvElem::Q8_0 | KvElem::Q4_0 => t * row / 64,
    }
}
