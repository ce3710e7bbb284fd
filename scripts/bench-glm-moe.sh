#!/usr/bin/env bash
# A GLM-4.5-shaped random MoE (scripts/make_glm_moe_model.py: 2.5B total, 0.4B
# active; sigmoid routing with a correction bias, a shared expert, the first
# layer dense, rotary on half of each head) written as a Q4_0 GGUF by `shardlm
# quantize`, against llama.cpp on the same file (issue 25).
#
# Cases, through scripts/bench-vs-llamacpp.sh (A B A B, medians, peak RSS):
#   glm-q4_0-t1, glm-q4_0-t2    pp512, then tg128 at depth 512
#
# Usage: scripts/bench-glm-moe.sh [--cases glm-q4_0-t1,glm-q4_0-t2] [-- bench-vs-llamacpp args]
# Environment as for bench-vs-llamacpp.sh (SHARDLM, LLAMA_BENCH, SHARDLM_CACHE).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
CASES="glm-q4_0-t1,glm-q4_0-t2"
PASS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --cases) CASES="$2"; shift 2 ;;
        --) shift; PASS=("$@"); break ;;
        *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
SHARDLM="${SHARDLM:-$REPO/target/release/shardlm}"
[ -x "$SHARDLM" ] || (cd "$REPO" && cargo build --release -p shardlm >&2)
HF="$CACHE/test-glm/glm4moe-2.5b-hf"
M="$CACHE/test-glm/glm4moe-2.5b-q4_0.gguf"
python3 "$REPO/scripts/make_glm_moe_model.py" --out "$HF"
if [ ! -f "$M" ]; then
    "$SHARDLM" quantize "$HF" "${M%.gguf}.part.gguf" --to q4_0 >&2
    mv "${M%.gguf}.part.gguf" "$M"
fi
EXTRA="$(mktemp /tmp/bench-glm-cases.XXXXXX)"
trap 'rm -f "$EXTRA"' EXIT
for th in 1 2; do
    echo "glm-q4_0-t$th|$M|$th|512|128|-p 512 -n 0;-p 0 -n 128 -d 512|pp512=pp:512:0 tg128=tg:128:512"
done >"$EXTRA"
SHARDLM="$SHARDLM" EXTRA_CASES="$EXTRA" "$REPO/scripts/bench-vs-llamacpp.sh" --cases "$CASES" "${PASS[@]}"
