#!/usr/bin/env bash
# Same model, same bytes, two containers or two formats: A/B runs of
# `shardlm bench` on pairs of files written by `shardlm quantize` from ONE HF
# checkpoint (the ~1.1B random llama of scripts/make_test_model_hf.py), so
# both sides keep exactly the same tensors in 16 bits (embeddings, lm_head,
# norms) and differ only where the pair says (issue 8):
#
#   fp8      FP8 safetensors (DeepSeek block layout)  vs  Q8_0 GGUF     decode, 1 and N threads
#            (1.0625 bytes per weight each: "decode >= 0.9x Q8_0")
#   st-mxfp4 MXFP4 safetensors (compressed-tensors)   vs  MXFP4 GGUF    pp512 and decode, N threads
#   st-nvfp4 NVFP4 safetensors (ModelOpt)             vs  NVFP4 GGUF    pp512 and decode, N threads
#            ("the same formats as safetensors: within 5% of the GGUF speed")
#
# (bench-vs-llamacpp.sh's 1b-q8_0 and 1b-st-* cases compare against GGUFs
# made from the Q8_0 GGUF, whose lm_head is Q8_0: 0.1 GB less per token than
# the bf16 head the publishers' safetensors keep.)
#
# Usage: scripts/bench-same-bytes.sh [--rounds N] [--threads N] [--pairs fp8,st-mxfp4,st-nvfp4]
# Env: SHARDLM (binary, default target/release/shardlm), SHARDLM_CACHE.
# Prints one line per run, then a table of medians (markdown).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
SHARDLM="${SHARDLM:-$REPO/target/release/shardlm}"
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
D="$CACHE/test-1b"
ROUNDS=3
NT="$(nproc)"
PAIRS="fp8,st-mxfp4,st-nvfp4"
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --threads) NT="$2"; shift 2 ;;
    --pairs) PAIRS="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[ -x "$SHARDLM" ] || { echo "no shardlm binary at $SHARDLM (cargo build --release -p shardlm)" >&2; exit 1; }

HF="$D/llama-1b-hf"
[ -f "$HF/model.safetensors" ] || python3 "$REPO/scripts/make_test_model_hf.py" >&2
make() { # make OUT FORMAT
    if [ ! -e "$1" ]; then "$SHARDLM" quantize "$HF" "$1" --to "$2" >&2; fi
}

# pair -> "A-file B-file thread-list prompt"
runs=()
for p in ${PAIRS//,/ }; do
    case "$p" in
    fp8) make "$D/llama-1b-hfg-q8_0.gguf" q8_0; make "$D/llama-1b-st-fp8" fp8
        runs+=("fp8|$D/llama-1b-st-fp8|$D/llama-1b-hfg-q8_0.gguf|1 $NT|16") ;;
    st-mxfp4 | st-nvfp4)
        t="${p#st-}"; make "$D/llama-1b-hfg-$t.gguf" "$t"; make "$D/llama-1b-st-$t" "$t"
        runs+=("$p|$D/llama-1b-st-$t|$D/llama-1b-hfg-$t.gguf|$NT|512") ;;
    *) echo "unknown pair: $p" >&2; exit 2 ;;
    esac
done

one() { # one MODEL THREADS PROMPT -> "prompt_tps generation_tps"
    "$SHARDLM" bench --model "$1" -p "$3" -g 64 -n 1 --threads "$2" --json 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin)["avg"]; print(d["prompt_tps"], d["generation_tps"])'
}

OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
echo "# $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
    for spec in "${runs[@]}"; do
        IFS='|' read -r name a b threads prompt <<<"$spec"
        for t in $threads; do
            for side in a b; do
                m="$a"; [ "$side" = b ] && m="$b"
                res="$(one "$m" "$t" "$prompt")"
                echo "$r $name t$t $side $res" | tee -a "$OUT"
            done
        done
    done
done
python3 - "$OUT" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r, name, t, side, pp, tg = line.split()
    rows.setdefault((name, t), {}).setdefault(side, []).append((float(pp), float(tg)))
what = {"fp8": ("FP8 safetensors", "Q8_0 GGUF"), "st-mxfp4": ("MXFP4 safetensors", "MXFP4 GGUF"),
        "st-nvfp4": ("NVFP4 safetensors", "NVFP4 GGUF")}
print("\n| pair | threads | metric | A | B | A tok/s | B tok/s | A ÷ B | spread A/B % |")
print("|---|---|---|---|---|---|---|---|---|")
for (name, t), sides in rows.items():
    for k, metric in ((0, "prefill"), (1, "decode")):
        if name == "fp8" and k == 0:
            continue
        a = [v[k] for v in sides["a"]]; b = [v[k] for v in sides["b"]]
        ma, mb = statistics.median(a), statistics.median(b)
        spread = lambda v, m: 100 * (max(v) - min(v)) / m
        print(f"| {name} | {t[1:]} | {metric} | {what[name][0]} | {what[name][1]} | {ma:.1f} | {mb:.1f} | "
              f"**{ma / mb:.2f}** | {spread(a, ma):.0f} / {spread(b, mb):.0f} |")
EOF
