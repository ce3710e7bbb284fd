#!/usr/bin/env bash
# GPU check (issue 32): `shardlm --device gpu` on whatever Vulkan/Metal GPU
# this machine has, then decode as a share of the weights' bytes per second.
# Correctness first (the tiny fixtures' greedy tokens against the goldens),
# then `bench` on a random llama of the 1.1B shape in bf16, Q8_0 and Q4_0
# (and the CPU on Q4_0 for scale); then a Qwen3-Next-shaped hybrid MoE on the
# GPU and the CPU. Needs python3 with torch, safetensors and numpy.
#   scripts/bench-gpu.sh [SHARDLM_BINARY] [OUT_DIR]
set -u
B=${1:-target/release/shardlm}
OUT=${2:-${OUT:-/tmp/bench-gpu}}
mkdir -p "$OUT"
for m in llama qwen3 gemma3; do
  g=tests/fixtures/tiny/$m/golden.json
  ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$g'))['input_ids'])))")
  want=$(python3 -c "import json;print(json.load(open('$g'))['greedy_ids'])")
  got=$(timeout 60 "$B" run --model tests/fixtures/tiny/$m --prompt-ids "$ids" --max-tokens 12 --ignore-eos --json --device gpu 2>/dev/null \
    | python3 -c "import sys,json;print(json.load(sys.stdin)['output_ids'])")
  [ "$got" = "$want" ] && echo "$m: greedy tokens equal the goldens" || echo "$m: MISMATCH golden $want gpu $got"
done | tee "$OUT/correct.txt"
M=/tmp/bench-gpu-1b
[ -d $M ] || timeout 300 python3 "$(dirname "$0")/make_random_hf_llama.py" $M
for q in q8_0 q4_0; do [ -f $M-$q.gguf ] || timeout 300 "$B" quantize $M $M-$q.gguf --to $q >/dev/null; done
for run in "$M gpu" "$M-q8_0.gguf gpu" "$M-q4_0.gguf gpu" "$M-q4_0.gguf cpu"; do
  set -- $run
  name=$(basename "$1")-$2
  timeout 300 "$B" bench --model "$1" --device "$2" -p 256 -g 64 -n 2 --warmup 1 --json >"$OUT/$name.json" 2>"$OUT/$name.err"
  python3 - "$OUT/$name.json" "$name" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
j = json.load(open(sys.argv[1])); a = j["avg"]; w = j["weight_bytes_per_token"]
print(f"{sys.argv[2]}: prefill {a['prompt_tps']:.1f} tok/s, decode {a['generation_tps']:.1f} tok/s, "
      f"{w / 1e9:.2f} GB of weights a token -> {w * a['generation_tps'] / 1e9:.0f} GB/s")
PY
done
# A Qwen3-Next-shaped hybrid (~1.2B total: Gated DeltaNet with its state
# slots on the device, gated attention, 64 experts top-8 grouped by expert in
# prefill), bf16, on the GPU and the CPU. Needs numpy.
HY=/tmp/bench-gpu-hybrid
[ -d $HY ] || timeout 600 python3 "$(dirname "$0")/make_hybrid_model.py" --1b --out $HY >/dev/null
for dev in gpu cpu; do
  [ -d $HY ] || break
  name=hybrid-1b-$dev
  timeout 600 "$B" bench --model $HY --device $dev -p 256 -g 64 -n 2 --warmup 1 --json >"$OUT/$name.json" 2>"$OUT/$name.err"
  python3 - "$OUT/$name.json" "$name" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
j = json.load(open(sys.argv[1])); a = j["avg"]
print(f"{sys.argv[2]}: prefill {a['prompt_tps']:.1f} tok/s, decode {a['generation_tps']:.1f} tok/s")
PY
done
