#!/usr/bin/env bash
# Benchmarks shardlm against llama.cpp on the K-quant (and I-quant) GGUF files
# people download, written by llama.cpp's own llama-quantize (issue 23).
#
# Files (made once, in $SHARDLM_CACHE/test-1b and $SHARDLM_CACHE/smollm2-135m):
#   1b-T     the random 1.1B llama of scripts/make_test_model.py, re-encoded from
#            its Q8_0 GGUF by `llama-quantize --allow-requantize` to type T
#   smol-T   SmolLM2-135M re-encoded from its Q4_1 GGUF the same way (its width
#            576 is no multiple of 256, so llama-quantize falls back to Q5_0/Q8_0
#            for most tensors: a "Q4_K_M" SmolLM2 is mostly Q5_0)
# with T in --types (default q4_k_m,q5_k_m,q6_k,q3_k_m,q2_k,iq4_xs; IQ3_XXS, IQ2_*
# and IQ1_* get a uniform importance matrix, scripts/uniform_imatrix.py). A file
# this shardlm cannot run yet (a type it does not read) is skipped with the
# error it gives.
#
# Cases, at each thread count of --threads (default "1 2"):
#   kq-M-T-tN-pp256   pp256, and tg32 after it (llama-bench -p 256; -n 32 -d 256)
#   kq-M-T-tN-pp512   pp512
# They run through scripts/bench-vs-llamacpp.sh (its EXTRA_CASES), which
# alternates shardlm and llama-bench A B A B (--rounds per engine, default 2
# here), waits for a quiet machine before each run and reports medians, ratios
# (shardlm ÷ llama.cpp) and decode as a share of the bandwidth ceiling.
#
# Usage: scripts/bench-kquants.sh [--types a,b] [--models 1b,smol] [--threads "1 2"]
#                                 [--rounds N] [--make-only] [-- bench-vs-llamacpp args]
# Environment: LLAMA_QUANTIZE (default: next to LLAMA_BENCH, else the llama.cpp
# build in $SHARDLM_CACHE/llama.cpp-b11434/build-*/bin), SHARDLM, LLAMA_BENCH,
# SHARDLM_CACHE as for bench-vs-llamacpp.sh. AVX2 against AVX2 on an AVX-512
# machine: SHARDLM_ISA=avx2, and LLAMA_BENCH from a llama.cpp built with
# -DGGML_AVX512=OFF (docs/PERFORMANCE.md, "AVX2 against llama.cpp's AVX2
# build", has the cmake line).
set -euo pipefail

TYPES="q4_k_m,q5_k_m,q6_k,q3_k_m,q2_k,iq4_xs"
MODELS="1b,smol"
THREADS="1 2"
ROUNDS=2
MAKE_ONLY=0
PASS=()

die() { echo "bench-kquants: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --types) TYPES="$2"; shift ;;
        --models) MODELS="$2"; shift ;;
        --threads) THREADS="$2"; shift ;;
        --rounds) ROUNDS="$2"; shift ;;
        --make-only) MAKE_ONLY=1 ;;
        --) shift; PASS=("$@"); break ;;
        -h|--help) usage 0 ;;
        *) echo "unknown argument: $1" >&2; usage 2 ;;
    esac
    shift
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
SMOL_SRC="$CACHE/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"
M1B_SRC="$CACHE/test-1b/llama-1b-q8_0.gguf"

if [ -z "${LLAMA_QUANTIZE:-}" ]; then
    if [ -n "${LLAMA_BENCH:-}" ] && [ -x "$(dirname "$LLAMA_BENCH")/llama-quantize" ]; then
        LLAMA_QUANTIZE="$(dirname "$LLAMA_BENCH")/llama-quantize"
    else
        LLAMA_QUANTIZE="$(ls "$CACHE"/llama.cpp-b11434/build-*/bin/llama-quantize 2>/dev/null | head -1 || true)"
    fi
fi
[ -x "${LLAMA_QUANTIZE:-}" ] || die "llama-quantize not found (set LLAMA_QUANTIZE, or build llama.cpp: scripts/bench-vs-llamacpp.sh builds llama-bench next to it)"

if [ -z "${SHARDLM:-}" ]; then
    echo "building shardlm (cargo build --release -p shardlm) ..." >&2
    (cd "$REPO" && cargo build --release -p shardlm >&2)
    SHARDLM="${CARGO_TARGET_DIR:-$REPO/target}/release/shardlm"
fi
[ -x "$SHARDLM" ] || die "shardlm binary not found at $SHARDLM"
export SHARDLM

# --- files ----------------------------------------------------------------------

if [[ ",$MODELS," == *",smol,"* ]] && [ ! -f "$SMOL_SRC" ]; then
    echo "fetching SmolLM2 ..." >&2
    "$SHARDLM" run --prompt-ids 1 --max-tokens 1 --json >/dev/null
fi
if [[ ",$MODELS," == *",1b,"* ]] && [ ! -f "$M1B_SRC" ]; then
    echo "writing the random 1.1B test model ..." >&2
    python3 "$REPO/scripts/make_test_model.py" >&2
fi

# Path of model M's file in type T.
model_file() {
    case "$1" in
        1b) echo "$CACHE/test-1b/llama-1b-$2.gguf" ;;
        smol) echo "$CACHE/smollm2-135m/SmolLM2-135M-Instruct.$2.gguf" ;;
    esac
}

EXTRA="$(mktemp /tmp/bench-kquants-cases.XXXXXX)"
NAMES=()
IFS=',' read -ra types <<<"$TYPES"
IFS=',' read -ra models <<<"$MODELS"
for m in "${models[@]}"; do
    src=$([ "$m" = 1b ] && echo "$M1B_SRC" || echo "$SMOL_SRC")
    for t in "${types[@]}"; do
        f="$(model_file "$m" "$t")"
        if [ ! -f "$f" ]; then
            echo "llama-quantize $m -> ${t^^} ..." >&2
            imx=()
            case "${t^^}" in
                IQ3_XXS | IQ2_* | IQ1_*)
                    # llama-quantize refuses these without an importance matrix:
                    # a uniform one (speed does not depend on it).
                    [ -s "$src.uniform.imatrix" ] || python3 "$REPO/scripts/uniform_imatrix.py" "$src" "$src.uniform.imatrix"
                    imx=(--imatrix "$src.uniform.imatrix") ;;
            esac
            "$LLAMA_QUANTIZE" --allow-requantize "${imx[@]}" "$src" "$f.part" "${t^^}" "$(nproc)" >"$f.log" 2>&1 \
                || { tail -3 "$f.log" >&2; die "llama-quantize failed for $m ${t^^} (log: $f.log)"; }
            mv "$f.part" "$f"
        fi
        # Can shardlm run it? (one token; the error names the type it lacks)
        if ! err="$("$SHARDLM" bench --model "$f" -p 1 -g 1 -n 1 --threads 1 --json 2>&1 >/dev/null)"; then
            echo "skipping $m ${t^^}: shardlm cannot run it yet: $(tail -1 <<<"$err")" >&2
            continue
        fi
        for th in $THREADS; do
            n="kq-$m-$t-t$th"
            echo "$n-pp256|$f|$th|256|32|-p 256 -n 0;-p 0 -n 32 -d 256|pp256=pp:256:0 tg32=tg:32:256" >>"$EXTRA"
            echo "$n-pp512|$f|$th|512|1|-p 512 -n 0|pp512=pp:512:0" >>"$EXTRA"
            NAMES+=("$n-pp256" "$n-pp512")
        done
    done
done
if [ "$MAKE_ONLY" = 1 ]; then
    echo "files made; cases:" >&2
    cut -d'|' -f1,2 "$EXTRA" >&2
    rm -f "$EXTRA"
    exit 0
fi
[ "${#NAMES[@]}" -gt 0 ] || die "no file shardlm can run among --types $TYPES"

CASES_ARG="$(IFS=,; echo "${NAMES[*]}")"
EXTRA_CASES="$EXTRA" "$REPO/scripts/bench-vs-llamacpp.sh" --rounds "$ROUNDS" --cases "$CASES_ARG" "${PASS[@]}"
rm -f "$EXTRA"
