//! Wire encodings of `f32` payloads for all-reduce.
//!
//! [`Wire::Q8`] is the distributed-llama trick: blocks of 32 values, each an
//! `f16` scale followed by 32 `i8` (34 bytes for 128), about 3.8× fewer bytes
//! than `f32`. Every rank replaces its own contribution by the decoded value of
//! what it sends, so all ranks still sum identical numbers and agree bit for bit.

use half::f16;

/// How `f32` values of an all-reduce travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wire {
    /// Exact `f32` (4 bytes per value).
    #[default]
    F32,
    /// Block-quantised int8 with one `f16` scale per 32 values (1.0625 bytes per value).
    Q8,
}

/// Values per Q8 block.
pub const Q8_BLOCK: usize = 32;
/// Bytes per Q8 block: an `f16` scale and 32 `i8`.
pub const Q8_BLOCK_BYTES: usize = 2 + Q8_BLOCK;

impl Wire {
    /// Bytes needed to carry `n` values.
    pub fn encoded_len(self, n: usize) -> usize {
        match self {
            Wire::F32 => 4 * n,
            Wire::Q8 => n.div_ceil(Q8_BLOCK) * Q8_BLOCK_BYTES,
        }
    }

    /// Encodes `values` into `out` (of [`Wire::encoded_len`] bytes).
    pub fn encode(self, values: &[f32], out: &mut [u8]) {
        debug_assert_eq!(out.len(), self.encoded_len(values.len()));
        match self {
            Wire::F32 => out.copy_from_slice(bytemuck::cast_slice(values)),
            Wire::Q8 => {
                for (block, dst) in values.chunks(Q8_BLOCK).zip(out.chunks_mut(Q8_BLOCK_BYTES)) {
                    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let scale = f16::from_f32(amax / 127.0);
                    let d = scale.to_f32();
                    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                    dst[..2].copy_from_slice(&scale.to_bits().to_le_bytes());
                    for (q, &v) in dst[2..].iter_mut().zip(block.iter().chain(std::iter::repeat(&0.0))) {
                        *q = (v * inv).round().clamp(-127.0, 127.0) as i8 as u8;
                    }
                }
            }
        }
    }

    /// Decodes `bytes` into `out`, overwriting it.
    pub fn decode(self, bytes: &[u8], out: &mut [f32]) {
        self.decode_with(bytes, out, |o, v| *o = v)
    }

    /// Decodes `bytes` and adds them to `acc`.
    pub fn decode_add(self, bytes: &[u8], acc: &mut [f32]) {
        self.decode_with(bytes, acc, |o, v| *o += v)
    }

    fn decode_with(self, bytes: &[u8], out: &mut [f32], f: impl Fn(&mut f32, f32)) {
        debug_assert_eq!(bytes.len(), self.encoded_len(out.len()));
        match self {
            Wire::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    f(o, f32::from_le_bytes(b.try_into().unwrap()));
                }
            }
            Wire::Q8 => {
                for (block, src) in out.chunks_mut(Q8_BLOCK).zip(bytes.chunks(Q8_BLOCK_BYTES)) {
                    let d = f16::from_bits(u16::from_le_bytes([src[0], src[1]])).to_f32();
                    for (o, &q) in block.iter_mut().zip(&src[2..]) {
                        f(o, q as i8 as f32 * d);
                    }
                }
            }
        }
    }

    /// Replaces `values` by what the other side would decode (a no-op for `F32`).
    pub fn round_trip(self, values: &mut [f32], scratch: &mut Vec<u8>) {
        if self == Wire::Q8 {
            scratch.resize(self.encoded_len(values.len()), 0);
            self.encode(values, scratch);
            self.decode(scratch, values);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_round_trip_is_close_and_idempotent() {
        let v: Vec<f32> = (0..70).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37).collect();
        let mut bytes = vec![0; Wire::Q8.encoded_len(v.len())];
        assert_eq!(bytes.len(), 3 * Q8_BLOCK_BYTES);
        Wire::Q8.encode(&v, &mut bytes);
        let mut back = vec![0.0; v.len()];
        Wire::Q8.decode(&bytes, &mut back);
        for (a, b) in v.iter().zip(&back) {
            assert!((a - b).abs() <= 4.1 / 127.0 * 1.01, "{a} vs {b}");
        }
        let mut again = back.clone();
        Wire::Q8.round_trip(&mut again, &mut Vec::new());
        assert_eq!(again, back, "decoding what we decoded must be exact");
    }

    #[test]
    fn f32_is_exact() {
        let v = [1.5f32, -0.0, f32::MAX, 1e-30];
        let mut bytes = vec![0; 16];
        Wire::F32.encode(&v, &mut bytes);
        let mut acc = [1.0f32; 4];
        Wire::F32.decode_add(&bytes, &mut acc);
        assert_eq!(acc, [2.5, 1.0, f32::MAX, 1.0]);
    }
}
