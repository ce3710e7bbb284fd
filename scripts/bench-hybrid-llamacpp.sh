#!/usr/bin/env bash
# shardlm against llama.cpp on a hybrid linear-attention model in the same
# GGUF files: a random Qwen3-Next-shaped ~1.2B model
# (`scripts/make_hybrid_model.py --1b`: 24 layers 3:1 Gated DeltaNet / gated
# attention, 64 experts of 192 top-8 + a shared expert of 384, vocab 32000),
# written as GGUF (Q4_0 and Q8_0 by default) with `shardlm quantize` (arch
# `qwen3next`, which llama.cpp b11434 loads). Per type, ROUNDS rounds of
# `shardlm bench -p P -g G -n 1 --threads T` then `llama-bench -p P -n G -t T
# -r 1` (A B A B); prints each run and the medians with the load average.
# Run it on a quiet machine.
#
# Usage: scripts/bench-hybrid-llamacpp.sh [TYPES (default "q4_0 q8_0")]
# Environment: ROUNDS (3), P (512), G (64), T (2), SHARDLM, LLAMA_BENCH
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
SHARDLM="${SHARDLM:-target/release/shardlm}"
LLAMA_BENCH="${LLAMA_BENCH:-$(ls "$CACHE"/llama.cpp-b11434/build-*/bin/llama-bench | head -1)}"
ROUNDS="${ROUNDS:-3}" P="${P:-512}" G="${G:-64}" T="${T:-2}"
HF="$CACHE/test-hybrid/qwen3-next-1b-hf"
python3 scripts/make_hybrid_model.py --1b --out "$HF"
# llama.cpp loads no GGUF without a vocabulary: a placeholder BPE one (`<unk>
# <s> </s> t3 t4 …`, no merges; the benchmarks feed token ids), as
# scripts/hf-gguf-llamacpp.sh gives the fixtures.
[[ -f "$HF/tokenizer.json" ]] || python3 - "$HF" <<'PY'
import json, sys
d = sys.argv[1]
n = json.load(open(f"{d}/config.json"))["vocab_size"]
toks = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, n)]
json.dump({"version": "1.0",
           "added_tokens": [{"id": i, "content": toks[i], "special": True, "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False} for i in range(3)],
           "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(toks)}, "merges": []}},
          open(f"{d}/tokenizer.json", "w"))
PY
echo "commit $(git rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for ty in ${1:-q4_0 q8_0}; do
  M="$CACHE/test-hybrid/qwen3-next-1b-$ty.gguf"
  [[ -f "$M" ]] || "$SHARDLM" quantize "$HF" "$M" --to "$ty"
  sh_pp=(); sh_tg=(); ll_pp=(); ll_tg=()
  for r in $(seq "$ROUNDS"); do
    echo "== $ty round $r, load $(cut -d' ' -f1-3 /proc/loadavg)"
    out=$("$SHARDLM" bench --model "$M" -p "$P" -g "$G" -n 1 --threads "$T" --json 2>/dev/null)
    read -r pp tg < <(python3 -c "import json,sys; d=json.loads(sys.argv[1]); a=d['avg']; print(a['prompt_tps'], a['generation_tps'])" "$out")
    echo "shardlm   pp$P $pp tok/s, tg$G $tg tok/s"
    sh_pp+=("$pp"); sh_tg+=("$tg")
    out=$("$LLAMA_BENCH" -m "$M" -p "$P" -n "$G" -t "$T" -r 1 -o json 2>"$M.llama-bench.log") || { echo "llama-bench failed: $(tail -3 "$M.llama-bench.log")"; exit 1; }
    read -r pp tg < <(python3 -c "
import json, sys
runs = json.loads(sys.argv[1])
pp = next(r['avg_ts'] for r in runs if r['n_prompt'] > 0)
tg = next(r['avg_ts'] for r in runs if r['n_gen'] > 0)
print(pp, tg)" "$out")
    echo "llama.cpp pp$P $pp tok/s, tg$G $tg tok/s"
    ll_pp+=("$pp"); ll_tg+=("$tg")
  done
  python3 - "$ty" "${sh_pp[*]}" "${sh_tg[*]}" "${ll_pp[*]}" "${ll_tg[*]}" <<'PY'
import statistics as st, sys
ty, *cols = sys.argv[1:]
sp, stg, lp, ltg = ([float(x) for x in c.split()] for c in cols)
m = st.median
print(f"| {ty} | pp | {m(sp):.1f} | {m(lp):.1f} | {m(sp) / m(lp):.2f} |")
print(f"| {ty} | tg | {m(stg):.2f} | {m(ltg):.2f} | {m(stg) / m(ltg):.2f} |")
PY
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
