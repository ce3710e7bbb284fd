#!/usr/bin/env bash
# pp512 of two shardlm binaries (OLD, NEW) and llama-bench, alternating per
# model and round, then medians: how a prefill change compares with what was
# there and with llama.cpp on the same files.
#
# Usage: OLD=/path/to/old/shardlm [NEW=target/release/shardlm] [LLAMA_BENCH=...] \
#        scripts/bench-prefill-ab.sh [--rounds N] [--threads N] [MODEL.gguf ...]
# Default models: the 1.1B Q4_0, Q8_0 and MXFP4 files and the qwen3moe Q4_0
# and Q8_0 files of bench-vs-llamacpp.sh (made there on first use).
# LLAMA_BENCH defaults to the build bench-vs-llamacpp.sh makes under
# $SHARDLM_CACHE/llama.cpp-b11434/build-*/bin/.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
NEW="${NEW:-$REPO/target/release/shardlm}"
OLD="${OLD:?set OLD to the shardlm binary to compare against}"
LLAMA_BENCH="${LLAMA_BENCH:-$(ls "$CACHE"/llama.cpp-b11434/build-*/bin/llama-bench 2>/dev/null | head -1)}"
ROUNDS=3
NT=2
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --threads) NT="$2"; shift 2 ;;
    *) break ;;
    esac
done
MODELS=("$@")
if [ ${#MODELS[@]} -eq 0 ]; then
    MODELS=("$CACHE/test-1b/llama-1b-q4_0.gguf" "$CACHE/test-1b/llama-1b-q8_0.gguf"
        "$CACHE/test-1b/llama-1b-mxfp4.gguf" "$CACHE/test-moe/qwen3moe-2.6b-q4_0.gguf"
        "$CACHE/test-moe/qwen3moe-2.6b-q8_0.gguf")
fi
for m in "${MODELS[@]}"; do [ -f "$m" ] || { echo "missing $m (bench-vs-llamacpp.sh makes it)" >&2; exit 1; }; done

OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
echo "# $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ), $NT threads, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
    for m in "${MODELS[@]}"; do
        for e in old new llama; do
            case "$e" in
            old | new)
                b="$OLD"; [ "$e" = new ] && b="$NEW"
                v="$("$b" bench --model "$m" -p 512 -g 1 -n 1 --threads "$NT" --json 2>/dev/null |
                    python3 -c 'import json,sys; print(json.load(sys.stdin)["avg"]["prompt_tps"])')" ;;
            llama)
                [ -x "$LLAMA_BENCH" ] || continue
                v="$("$LLAMA_BENCH" -m "$m" -p 512 -n 0 -t "$NT" -r 1 -o json 2>/dev/null |
                    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')" ;;
            esac
            echo "$r $(basename "$m" .gguf) $e $v" | tee -a "$OUT"
        done
    done
done
python3 - "$OUT" <<'EOF'
import statistics, sys
d = {}
for line in open(sys.argv[1]):
    _, m, e, v = line.split()
    d.setdefault(m, {}).setdefault(e, []).append(float(v))
print("\n| model | before tok/s | after tok/s | after ÷ before | llama.cpp tok/s | shardlm ÷ llama.cpp |")
print("|---|---|---|---|---|---|")
for m, e in d.items():
    o, n = statistics.median(e["old"]), statistics.median(e["new"])
    if "llama" in e:
        ll = statistics.median(e["llama"])
        print(f"| {m} | {o:.1f} | {n:.1f} | {n / o:.2f} | {ll:.1f} | {o / ll:.2f} → **{n / ll:.2f}** |")
    else:
        print(f"| {m} | {o:.1f} | {n:.1f} | {n / o:.2f} | – | – |")
EOF
