//! Machines and links for the planner: published presets (sources in
//! docs/PLANNER.md), this machine measured with the real kernels
//! (`--machines local`), or a saved profile (JSON, as `--calibrate` writes).

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

/// One machine as the cost model sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub name: String,
    /// Memory the model may use, bytes.
    pub mem_bytes: f64,
    /// Bytes/s at which batch-1 decode streams weights: the published memory
    /// bandwidth times an achieved fraction for presets, or the measured
    /// speed of the real matrix-vector kernels for `local`.
    pub decode_bytes_per_s: f64,
    /// FLOP/s of the prefill matmuls (large batches of rows).
    pub prefill_flops: f64,
    /// FLOP/s of attention (f16 KV widened to f32).
    pub attn_flops: f64,
    /// Fixed cost per layer of a decode step (thread hand-offs, small ops), s.
    pub layer_overhead_s: f64,
}

/// One link between two machines.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Link {
    pub name: String,
    /// One-way latency of a small message, s.
    pub latency_s: f64,
    /// Bytes/s of one cable, one direction.
    pub bytes_per_s: f64,
    /// Cables per pair (large messages stripe over them).
    pub cables: usize,
    /// Extra cost of a hand-off to a rank that waited longer than the
    /// transport's spin and parked (futex or poll wake-up, and on a VM the
    /// idle vCPU's wake), s. A pipeline pays it at every stage boundary of a
    /// decode step. Measured by `--machines local`; 0 in the presets.
    #[serde(default)]
    pub handoff_s: f64,
}

impl Link {
    /// Time to move `bytes` one way between two ranks.
    pub fn send(&self, bytes: f64) -> f64 {
        self.latency_s + bytes / (self.bytes_per_s * self.cables.max(1) as f64)
    }

    /// All-reduce of `bytes` over `n` ranks, the cheaper of a direct exchange
    /// (everyone sends everything to everyone: latency-optimal) and a ring
    /// reduce-scatter + all-gather (bandwidth-optimal), as the tcp/shm
    /// transports choose by size.
    pub fn all_reduce(&self, bytes: f64, n: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let bw = self.bytes_per_s * self.cables.max(1) as f64;
        let k = (n - 1) as f64;
        let direct = self.latency_s + k * bytes / bw;
        let ring = 2.0 * k * self.latency_s + 2.0 * k / n as f64 * bytes / bw;
        direct.min(ring)
    }
}

const GB: f64 = 1e9;
const TB: f64 = 1e12;

/// Published machine specs. The decode fraction of peak bandwidth (0.8 for
/// Apple silicon under MLX, 0.7 for CPUs, 0.8 for HBM GPUs) and prefill at
/// half of peak compute are our assumptions, stated in docs/PLANNER.md.
pub fn machine_preset(name: &str) -> Option<Machine> {
    let m = |name: &str, mem_gb: f64, bw_gbs: f64, frac: f64, tflops: f64, overhead_us: f64| Machine {
        name: name.into(),
        // Usable by the model: Metal's default working-set limit on Apple
        // silicon is about 75% of RAM; elsewhere keep 8% for the OS.
        mem_bytes: mem_gb * GB * if name.starts_with('m') { 0.75 } else { 0.92 },
        decode_bytes_per_s: bw_gbs * GB * frac,
        prefill_flops: tflops * TB * 0.5,
        attn_flops: tflops * TB * 0.3,
        layer_overhead_s: overhead_us * 1e-6,
    };
    Some(match name {
        // Apple: 512 GB unified memory, 819 GB/s; 80-core GPU ≈ 28 TFLOPS fp16/32.
        "m3-ultra-512" | "mac-studio-m3-ultra" => m("m3-ultra-512", 512.0, 819.0, 0.8, 28.0, 40.0),
        // Apple: 128 GB, 546 GB/s; 40-core GPU ≈ 17 TFLOPS.
        "m4-max-128" => m("m4-max-128", 128.0, 546.0, 0.8, 17.0, 40.0),
        // Two-socket x86 (2 × EPYC 9654): 12 × DDR5-4800 per socket = 2 × 460.8 GB/s,
        // 1.5 TB; 192 cores × 2.4 GHz × 32 f32 FLOP/cycle ≈ 14.7 TFLOPS.
        "x86-2s" => m("x86-2s", 1536.0, 921.6, 0.7, 14.7, 10.0),
        // NVIDIA H100 SXM: 80 GB HBM3 at 3.35 TB/s, 989 TFLOPS dense bf16.
        "h100" => m("h100", 80.0, 3350.0, 0.8, 989.0, 15.0),
        // NVIDIA H200 SXM: 141 GB HBM3e at 4.8 TB/s, 989 TFLOPS dense bf16.
        "h200" => m("h200", 141.0, 4800.0, 0.8, 989.0, 15.0),
        _ => return None,
    })
}

/// Published link specs (one direction, one cable).
pub fn link_preset(name: &str) -> Option<Link> {
    let l = |name: &str, lat_us: f64, gbs: f64| Link {
        name: name.into(),
        latency_s: lat_us * 1e-6,
        bytes_per_s: gbs * GB,
        cables: 1,
        handoff_s: 0.0,
    };
    Some(match name {
        // MLX's JACCL RDMA over Thunderbolt 5: ≈25 µs at 4 KB, ≈8 GB/s peak.
        "tb5-rdma" => l("tb5-rdma", 25.0, 8.0),
        // TCP over a Thunderbolt bridge: ≈100 µs, ≈2.5 GB/s measured by users.
        "tb5-tcp" => l("tb5-tcp", 100.0, 2.5),
        "10gbe" => l("10gbe", 30.0, 1.25),
        "25gbe" => l("25gbe", 20.0, 3.125),
        "100gbe" => l("100gbe", 10.0, 12.5),
        // InfiniBand NDR 400 Gb/s.
        "ib-ndr" => l("ib-ndr", 2.0, 50.0),
        // NVLink 4 (H100/H200 in one node): 450 GB/s per direction.
        "nvlink" => l("nvlink", 3.0, 450.0),
        _ => return None,
    })
}

/// `--machines`: `local`, `N×PRESET` / `NxPRESET` / `PRESET` (comma-separated
/// for mixed sets), or a profile file. Returns every machine.
pub fn parse_machines(spec: &str, threads: usize, quant: &str) -> Result<(Vec<Machine>, Option<Link>)> {
    if spec.ends_with(".json") {
        let text = std::fs::read_to_string(spec).with_context(|| format!("reading profile {spec}"))?;
        let p: Profile = serde_json::from_str(&text).with_context(|| format!("{spec}: not a planner profile"))?;
        return Ok((p.machines, p.link));
    }
    let mut out = Vec::new();
    let mut local: Option<Machine> = None;
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (count, name) = match part.split_once(['x', '×', '*']) {
            Some((n, rest)) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => {
                (n.parse::<usize>().map_err(|_| anyhow!("bad machine count in '{part}'"))?, rest)
            }
            _ => (1, part),
        };
        let gpu_index = match name {
            "gpu" => Some(None),
            _ => name.strip_prefix("gpu:").map(|n| n.parse::<usize>().map(Some)).transpose()?,
        };
        let m = if name == "local" {
            match &local {
                Some(m) => m.clone(),
                None => local.insert(super::measure::local_machine_for(threads, quant)?).clone(),
            }
        } else if let Some(index) = gpu_index {
            super::measure_gpu::gpu_machine(index, quant)?
        } else {
            machine_preset(name).ok_or_else(|| {
                anyhow!("unknown machine '{name}' (presets: m3-ultra-512, m4-max-128, x86-2s, h100, h200; or local, gpu, gpu:N, or a profile .json)")
            })?
        };
        out.extend(std::iter::repeat_n(m, count));
    }
    if out.is_empty() {
        bail!("--machines names no machine");
    }
    Ok((out, None))
}

/// `--links`: `PRESET` or `K×PRESET` (K cables per pair), or `local-shm` /
/// `local-tcp` (measured here with the real transports).
pub fn parse_link(spec: &str) -> Result<Link> {
    let (cables, name) = match spec.split_once(['x', '×', '*']) {
        Some((n, rest)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => {
            (n.parse::<usize>().map_err(|_| anyhow!("bad cable count in '{spec}'"))?, rest)
        }
        _ => (1, spec),
    };
    let mut link = match name {
        "local-shm" => super::measure::local_link(true)?,
        "local-tcp" => super::measure::local_link(false)?,
        _ => link_preset(name).ok_or_else(|| {
            anyhow!("unknown link '{name}' (presets: tb5-rdma, tb5-tcp, 10gbe, 25gbe, 100gbe, ib-ndr, nvlink; or local-shm, local-tcp)")
        })?,
    };
    link.cables = cables.max(1);
    Ok(link)
}

/// What `--calibrate` saves and `--machines FILE.json` reads.
#[derive(Debug, Serialize, Deserialize)]
pub struct Profile {
    pub machines: Vec<Machine>,
    pub link: Option<Link>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_with_counts() {
        let (ms, _) = parse_machines("2xm3-ultra-512,h100", 1, "q8_0").unwrap();
        assert_eq!(ms.len(), 3);
        assert_eq!(ms[2].name, "h100");
        assert!(parse_machines("3xnothing", 1, "q8_0").is_err());
        let l = parse_link("2xtb5-rdma").unwrap();
        assert_eq!(l.cables, 2);
    }

    #[test]
    fn all_reduce_picks_the_cheaper_algorithm() {
        let l = link_preset("10gbe").unwrap();
        assert_eq!(l.all_reduce(1e3, 1), 0.0);
        // Small: one latency; large: the ring's 2(n−1)/n of the bytes.
        assert!((l.all_reduce(8.0, 4) - l.latency_s) / l.latency_s < 0.01);
        let big = 1e9;
        let ring = 6.0 * l.latency_s + 1.5 * big / l.bytes_per_s;
        assert!((l.all_reduce(big, 4) - ring).abs() / ring < 1e-9);
    }
}
