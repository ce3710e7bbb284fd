#!/usr/bin/env bash
# Benchmarks a random Qwen3-Next-shaped model (scripts/make_hybrid_model.py:
# 3:1 Gated DeltaNet / gated attention, 64 experts top-8 + shared expert,
# ~2.0B total) with `shardlm bench`: pp512/tg128 at 1 and 2 threads, the
# long-context point (-p 8192 -g 128), and the recurrent state bytes per
# sequence next to the KV bytes per token. Run it on a quiet machine.
#
# Against llama.cpp on the same GGUF files (Q4_0/Q8_0 of a ~1.2B variant):
# scripts/bench-hybrid-llamacpp.sh.
#
# Usage: scripts/bench-hybrid.sh [--tiny]   (--tiny: a toy model, to check the script)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
if [[ "${1:-}" == "--tiny" ]]; then
  MODEL="$CACHE/test-hybrid/qwen3-next-tiny-hf"; EXTRA=(--tiny); P=128; G=16; LONG=512
else
  MODEL="$CACHE/test-hybrid/qwen3-next-2b-hf"; EXTRA=(); P=512; G=128; LONG=8192
fi
python3 scripts/make_hybrid_model.py --out "$MODEL" "${EXTRA[@]}"
BIN=target/release/shardlm
[[ -x "$BIN" ]] || cargo build --release -p shardlm
python3 - "$MODEL" <<'PY'
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
lin = sum(t == "linear_attention" for t in c["layer_types"])
full = len(c["layer_types"]) - lin
ch = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + c["linear_num_value_heads"] * c["linear_value_head_dim"]
state = lin * 4 * (ch * (c["linear_conv_kernel_dim"] - 1)
                   + c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"])
kv = full * 2 * c["num_key_value_heads"] * c["head_dim"] * 2
print(f"recurrent state per sequence: {state / 2**20:.2f} MiB (f32); f16 KV per token: {kv / 1024:.1f} KiB "
      f"(the state = {state / kv:.0f} tokens of KV)")
PY
for t in 1 2; do
  echo "== threads $t: pp$P / tg$G"
  "$BIN" bench --model "$MODEL" -p "$P" -g "$G" -n 2 --threads "$t"
done
echo "== threads 2: long context -p $LONG -g $G"
"$BIN" bench --model "$MODEL" -p "$LONG" -g "$G" -n 1 --warmup 0 --threads 2
