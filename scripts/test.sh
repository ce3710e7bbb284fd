#!/usr/bin/env bash
# The test command (README): fetches what the tests need, then runs every test
# in release mode, and the kernel and golden tests once more per lower ISA level.
set -euo pipefail
cd "$(dirname "$0")/.."

# The default model (SmolLM2-135M-Instruct Q4_1) is fetched into the cache on first use.
cargo build --release --workspace --all-targets
./target/release/shardlm inspect >/dev/null
# Gemma 3 270M (the gemma3-270m alias; crates/engine/tests/gemma3_llamacpp.rs).
./target/release/shardlm inspect gemma3-270m >/dev/null

cargo test --release --workspace
for isa in avx2 scalar; do
  echo "== SHARDLM_ISA=$isa"
  SHARDLM_ISA=$isa cargo test --release -p shardlm-kernels -p shardlm-model
done

# HTTP APIs through the official openai and anthropic SDKs against `shardlm serve`
# (pip deps: openai anthropic pytest jsonschema httpx; .ci/run installs them):
# the whole suite on one process and on 2 pipeline ranks, a smoke subset on
# tensor 2. The heavy runs (16×10 concurrency, the KV-pressure second server of
# test_serving.py) go once, on the single process.
echo "== HTTP API tests (tests/server)"
python3 -m pytest -q tests/server
SHARDLM_SKIP_HEAVY=1 SHARDLM_SERVE_ARGS="--ranks 2 --strategy pipeline" python3 -m pytest -q tests/server
SHARDLM_SERVE_ARGS="--ranks 2 --strategy tensor" python3 -m pytest -q -m smoke tests/server

# The page at / in headless Chromium (apt: chromium chromium-driver; pip:
# selenium) against serve --ranks 2; skips, saying why, without them.
echo "== web page tests (tests/web)"
python3 -m pytest -q tests/web
