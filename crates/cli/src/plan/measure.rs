//! Measuring this machine and its links for the planner with the real parts:
//! the decode and prefill kernels on weights of the model's storage type, and
//! all-reduces over the real transports between real processes
//! (`shardlm launch … -- plan-probe`).

use super::hardware::{Link, Machine, Profile};
use anyhow::{bail, Context, Result};
use clap::Args;
use kernels::{DType, MatRef, MatmulScratch, ThreadPool};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `f` until `min` has passed (at least twice, after one warm-up) and
/// returns the best seconds per call.
fn best_time(min: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut calls = 0;
    while calls < 2 || start.elapsed() < min {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        calls += 1;
    }
    best
}

/// A `rows × cols` weight of `dtype` with random-ish codes and sane scales, in
/// the layout the model uses (packed where packable).
fn weight(dtype: DType, rows: usize, cols: usize) -> (Vec<u8>, bool) {
    let rb = dtype.bytes_for(cols).expect("whole blocks");
    let mut row: Vec<u8> = (0..rb).map(|i| (i * 7919 % 251) as u8).collect();
    if dtype.is_quantized() {
        // Codes as they come; every block's leading f16 scale(s) set sane.
        let scale = half::f16::from_f32(0.01).to_bits().to_le_bytes();
        for blk in row.chunks_exact_mut(dtype.block_bytes()) {
            blk[..2].copy_from_slice(&scale);
            if dtype == DType::Q4_1 {
                blk[2..4].copy_from_slice(&scale);
            }
        }
    } else {
        let vals: Vec<f32> = (0..cols).map(|i| ((i * 7919 % 997) as f32 / 997.0 - 0.5) * 0.1).collect();
        kernels::quant::quantize_row(dtype, &vals, &mut row).expect("float formats always encode");
    }
    let mut data = Vec::with_capacity(rows * rb);
    for _ in 0..rows {
        data.extend_from_slice(&row);
    }
    if kernels::packed::packable(dtype, rows, cols) && kernels::packed::worth_packing(dtype, kernels::isa::active()) {
        (kernels::packed::pack(dtype, rows, cols, &data), true)
    } else {
        (data, false)
    }
}

fn mat(dtype: DType, rows: usize, cols: usize, data: &[u8], packed: bool) -> MatRef<'_> {
    if packed {
        MatRef::new_packed(dtype, rows, cols, data).expect("packable")
    } else {
        MatRef::new(dtype, rows, cols, data).expect("shape")
    }
}

/// The storage type measured for `quant` (types without kernels of their own
/// here are measured as the closest one).
fn measured_dtype(quant: &str) -> DType {
    match quant {
        "q4_0" | "nvfp4" | "mxfp4" | "q4_k" => DType::Q4_0,
        "q4_1" | "q5_0" | "q5_1" | "q5_k" => DType::Q4_1,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        _ => DType::Q8_0,
    }
}

fn mem_available() -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib * 1024.0)
}

/// This machine at `threads` threads for weights stored as `quant`.
pub fn local_machine_for(threads: usize, quant: &str) -> Result<Machine> {
    let pool = ThreadPool::new(threads);
    let dtype = measured_dtype(quant);
    let mut scratch = MatmulScratch::default();
    // Decode: a 64 MiB weight (far past the caches) times one row.
    let cols = 4096;
    let rows = ((64usize << 20) / dtype.bytes_for(cols).expect("blocks")).next_multiple_of(4);
    let (w, packed) = weight(dtype, rows, cols);
    let m = mat(dtype, rows, cols, &w, packed);
    let x: Vec<f32> = (0..cols * 256).map(|i| (i % 13) as f32 * 0.01 - 0.06).collect();
    let mut y = vec![0f32; rows * 256];
    let t = best_time(Duration::from_millis(400), || {
        kernels::matmul(&pool, m, &x[..cols], 1, &mut y[..rows], &mut scratch)
    });
    let decode_bytes_per_s = w.len() as f64 / t;
    // Prefill: 256 rows against a 2048 × 4096 weight (what a prompt chunk does).
    let prow = 2048;
    let (pw, ppacked) = weight(dtype, prow, cols);
    let pm = mat(dtype, prow, cols, &pw, ppacked);
    let t = best_time(Duration::from_millis(400), || {
        kernels::matmul(&pool, pm, &x, 256, &mut y[..prow * 256], &mut scratch)
    });
    let prefill_flops = 2.0 * (256 * prow * cols) as f64 / t;
    // Attention reads f16 K/V and multiplies in f32: an f16 weight at 64 rows.
    let (aw, _) = weight(DType::F16, 1024, cols);
    let am = MatRef::new(DType::F16, 1024, cols, &aw).expect("shape");
    let t = best_time(Duration::from_millis(200), || {
        kernels::matmul(&pool, am, &x[..64 * cols], 64, &mut y[..64 * 1024], &mut scratch)
    });
    let attn_flops = 2.0 * (64 * 1024 * cols) as f64 / t;
    // Per layer a decode step runs about 10 small ops (norms, rope, attention,
    // activations) and hands work to the pool about 8 times: time a small op.
    let (sw, sp) = weight(dtype, 64, 512);
    let sm = mat(dtype, 64, 512, &sw, sp);
    let t = best_time(Duration::from_millis(100), || {
        for _ in 0..100 {
            kernels::matmul(&pool, sm, &x[..512], 1, &mut y[..64], &mut scratch)
        }
    });
    let layer_overhead_s = 10.0 * t / 100.0;
    Ok(Machine {
        name: format!("local ({threads} threads, {quant} kernels)"),
        mem_bytes: mem_available(),
        decode_bytes_per_s,
        prefill_flops,
        attn_flops,
        layer_overhead_s,
    })
}

/// All-reduce between two local ranks over shared memory or TCP loopback,
/// measured with `shardlm launch --local 2 … -- plan-probe --links-only`.
pub fn local_link(shm: bool) -> Result<Link> {
    let exe = std::env::current_exe().context("finding the shardlm executable")?;
    let backend = if shm { "shm" } else { "tcp" };
    let out = Command::new(exe)
        .args(["launch", "--local", "2", "--backend", backend, "--", "plan-probe", "--links-only"])
        .output()
        .context("starting plan-probe")?;
    if !out.status.success() {
        bail!("measuring the {backend} link failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let p: Profile = serde_json::from_slice(&out.stdout).context("plan-probe output")?;
    let mut link = p.link.context("plan-probe measured no link")?;
    link.name = format!("local-{backend}");
    Ok(link)
}

/// `shardlm plan-probe` (hidden): run as every rank of a launched world, it
/// measures this rank's machine and the all-reduce between the ranks; rank 0
/// prints a profile (JSON) on stdout.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Threads for the kernel measurements.
    #[arg(long)]
    threads: Option<usize>,
    /// Storage type whose kernels are measured.
    #[arg(long, default_value = "q8_0")]
    quant: String,
    /// Only measure the link.
    #[arg(long)]
    links_only: bool,
}

pub fn probe(a: ProbeArgs) -> Result<()> {
    let threads = a.threads.unwrap_or_else(crate::run::default_threads);
    // The transports spin as the engine's ranks would (`dist_args::rank_spin`).
    let spin = crate::dist_args::rank_spin(threads, a.threads.is_some());
    let group = comm::Group::from_env_spinning(0x91a7, spin).context("joining the world")?;
    // A host whose ranks run on a GPU (the hostfile's "device") is measured there.
    let device = std::env::var("SHARDLM_DEVICE").ok().and_then(|d| model::Device::parse(d.trim()).ok());
    let me = match (a.links_only, device) {
        (true, _) => None,
        (false, Some(model::Device::Gpu(index))) => Some(super::measure_gpu::gpu_machine(index, &a.quant)?),
        (false, _) => Some(local_machine_for(threads, &a.quant)?),
    };
    // Gather every rank's machine as fixed-size JSON records.
    const REC: usize = 1024;
    let mut rec = vec![b' '; REC];
    let js = serde_json::to_vec(&me)?;
    rec[..js.len().min(REC)].copy_from_slice(&js[..js.len().min(REC)]);
    let mut all = vec![0u8; REC * group.size()];
    group.all_gather(&rec, &mut all)?;
    let machines: Vec<Machine> =
        all.chunks(REC).filter_map(|c| serde_json::from_slice::<Option<Machine>>(c).ok().flatten()).collect();
    let link = if group.size() > 1 {
        // The median of many back-to-back all-reduces, each timed alone
        // (each waits for the peers' data of the same round, as in a decode
        // step): a mean swings with every descheduling on a shared machine,
        // the median does not.
        let time = |floats: usize, iters: usize| -> Result<f64> {
            let mut buf = vec![1f32; floats];
            let mut ts = Vec::with_capacity(iters);
            group.barrier()?;
            for _ in 0..iters {
                let start = Instant::now();
                group.all_reduce_sum_f32(&mut buf)?;
                ts.push(start.elapsed().as_secs_f64());
            }
            ts.sort_by(f64::total_cmp);
            Ok(ts[ts.len() / 2])
        };
        time(1024, 50)?;
        let small = time(1024, 1000)?; // 4 KiB
        let large = time(1 << 20, 40)?; // 4 MiB
                                        // Solve the all-reduce model of Link for α and β with n ranks.
        let n = group.size();
        let k = (n - 1) as f64;
        let latency = small.max(1e-7);
        let per_byte = ((large - 2.0 * k * latency) / (2.0 * k / n as f64 * 4.0 * (1 << 20) as f64)).max(1e-12);
        let handoff = (parked_all_reduce(&group, 40)? - small).max(0.0);
        Some(Link {
            name: "measured".into(),
            latency_s: latency,
            bytes_per_s: 1.0 / per_byte,
            cables: 1,
            handoff_s: handoff,
        })
    } else {
        None
    };
    if group.rank() == 0 {
        println!("{}", serde_json::to_string_pretty(&Profile { machines, link })?);
    }
    Ok(())
}

/// Median time of a small all-reduce that a rank joins last, after computing
/// for 2 ms while its peers waited: with the short spin of oversubscribed
/// hosts (200 µs) they parked, so the exchange includes their wake-up, as a
/// pipeline stage's hand-off does; ranks with cores of their own spin 10 ms
/// and are still awake. Ranks take turns being late; the median over all ranks' late rounds.
fn parked_all_reduce(group: &comm::Group, rounds: usize) -> Result<f64> {
    let n = group.size();
    let mut buf = vec![1f32; 1024];
    let mut mine = Vec::with_capacity(rounds);
    group.barrier()?;
    for i in 0..rounds * n {
        if i % n == group.rank() {
            let busy = Instant::now();
            while busy.elapsed() < Duration::from_millis(2) {
                std::hint::spin_loop();
            }
            let start = Instant::now();
            group.all_reduce_sum_f32(&mut buf)?;
            mine.push(start.elapsed().as_secs_f64());
        } else {
            group.all_reduce_sum_f32(&mut buf)?;
        }
    }
    mine.sort_by(f64::total_cmp);
    // Every rank's median, averaged (all ranks then hold the same figure).
    let mut med = vec![mine[mine.len() / 2] as f32];
    group.all_reduce_sum_f32(&mut med)?;
    Ok(med[0] as f64 / n as f64)
}
