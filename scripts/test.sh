#!/usr/bin/env bash
# The test command (README): fetches what the tests need, then runs every test
# in release mode, and the kernel and golden tests once more per lower ISA level.
set -euo pipefail
cd "$(dirname "$0")/.."

# The default model (SmolLM2-135M-Instruct Q4_1) is fetched into the cache on first use.
cargo build --release --workspace --all-targets
./target/release/shardlm inspect >/dev/null

cargo test --release --workspace
for isa in avx2 scalar; do
  echo "== SHARDLM_ISA=$isa"
  SHARDLM_ISA=$isa cargo test --release -p shardlm-kernels -p shardlm-model
done
