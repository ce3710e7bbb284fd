#!/usr/bin/env bash
# Speculative decoding (issue 28): greedy decode tok/s of `run --chat` with
# `--draft ngram` (B) against without (A), alternating A B A B, on the
# code-editing prompts of bench/spec/ (a 55-line file in Python, Rust and
# JavaScript and an instruction to rename one thing, answered with the
# whole file) and a short story; single process and a pipeline of 2 ranks ×
# 1 thread. Prints per prompt and split the median tok/s of each, the
# speedup, the acceptance rate, and whether every output was identical.
#
#   scripts/bench-spec.sh [REPS=3] [MAX_TOKENS=700] [PROSE_TOKENS=150]
#
# The story stops at 150 tokens: SmolLM2-135M's greedy story falls into a
# loop ("1782, 1782, …") after about 200, which n-gram drafting then
# speeds up; the first 150 are prose.
set -euo pipefail
BIN=${SHARDLM:-${CARGO_TARGET_DIR:-target}/release/shardlm}
REPS=${1:-3}
MAX=${2:-700}
PROSE=${3:-150}
DIR=$(cd "$(dirname "$0")/.." && pwd)/bench/spec
OUT=$(mktemp -d)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for split in "single:--threads 2" "pipeline2:--ranks 2 --strategy pipeline --threads 1"; do
  name=${split%%:*}
  flags=${split#*:}
  for p in edit_python edit_rust edit_js prose; do
    for r in $(seq 1 "$REPS"); do
      n=$MAX
      [ "$p" = prose ] && n=$PROSE
      for mode in none ngram; do
        # shellcheck disable=SC2086
        "$BIN" run --chat --prompt "$(cat "$DIR/$p.txt")" --max-tokens "$n" --draft "$mode" \
          $flags --json >"$OUT/$name.$p.$mode.$r.json" 2>/dev/null
      done
    done
    python3 - "$OUT" "$name" "$p" "$REPS" <<'PY'
import json, statistics, sys
out, name, p, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
load = lambda m, r: json.load(open(f"{out}/{name}.{p}.{m}.{r}.json"))
a = [load("none", r) for r in range(1, reps + 1)]
b = [load("ngram", r) for r in range(1, reps + 1)]
ta = statistics.median(x["decode_tok_s"] for x in a)
tb = statistics.median(x["decode_tok_s"] for x in b)
same = all(x["output_ids"] == a[0]["output_ids"] for x in a + b)
d = sum(x["drafted_tokens"] for x in b)
acc = sum(x["accepted_tokens"] for x in b)
print(f"{name:9} {p:12} tokens {len(a[0]['output_ids']):4}  none {ta:7.1f} tok/s  ngram {tb:7.1f} tok/s  "
      f"speedup {tb / ta:5.2f}x  acceptance {acc / max(d, 1):.2f} ({acc}/{d})  identical {same}")
PY
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
