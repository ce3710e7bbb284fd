#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ (GGUF, safetensors, HF config.json, chat
# templates, JSON schemas, tool-call parsers), each for SECONDS (default 600),
# on nightly Rust with libFuzzer, growing the checked-in corpus fuzz/corpus/<target>.
# Not part of CI (an hour of CPU). A crash leaves its input in
# fuzz/artifacts/<target>/ and fails the script.
#
# Usage: scripts/fuzz.sh [--seconds N] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=600
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) secs="$2"; shift 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=(gguf safetensors hf_config chat_template json_schema tool_calls)
rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo +nightly install cargo-fuzz --locked
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    echo "== fuzzing $t for $secs s"
    # -rss_limit_mb: a size field must never make us allocate what the input lacks.
    (cd fuzz && cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10)
done
echo "fuzz: no crash in ${targets[*]}"
