#!/usr/bin/env bash
# Compares `shardlm plan`'s predictions with `shardlm bench` on this machine:
# TTFT and decode for prompts of 512 and 2048 tokens (128 decoded), one
# process, and 2 ranks over shm and over tcp (pipeline and tensor). Prints a
# markdown table (kept in docs/PLANNER.md) and, with --json PATH, the raw rows.
# Each case runs plan and bench alternately --rounds times (default 3) and
# compares the medians: on a 2-core VM one bench of a 2-rank tensor run
# decodes anywhere between 99 and 149 tok/s (four runs in a row, quiet, 2026-12-01).
#
#   scripts/plan-check.sh [--model M] [--threads N] [--rounds R] [--json PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=smollm2-135m
THREADS=2
JSON=""
ROUNDS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL="$2"; shift ;;
        --threads) THREADS="$2"; shift ;;
        --json) JSON="$2"; shift ;;
        --rounds) ROUNDS="$2"; shift ;;
        *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
    shift
done
SHARDLM="${SHARDLM:-${CARGO_TARGET_DIR:-target}/release/shardlm}"
[ -x "$SHARDLM" ] || cargo build --release -p shardlm >&2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

rows=()
for p in 512 2048; do
    for case in "single||" "pipeline|shm|--ranks 2 --strategy pipeline --backend shm" \
                "tensor|shm|--ranks 2 --strategy tensor --backend shm" \
                "pipeline|tcp|--ranks 2 --strategy pipeline --backend tcp" \
                "tensor|tcp|--ranks 2 --strategy tensor --backend tcp"; do
        IFS='|' read -r strategy link flags <<<"$case"
        if [ "$strategy" = single ]; then
            machines="local"; threads=$THREADS; ranks=1; links=""
        else
            machines="2xlocal"; threads=1; ranks=2; links="--links local-$link"
        fi
        echo "p=$p $strategy ${link:-} ..." >&2
        for r in $(seq "$ROUNDS"); do
            # shellcheck disable=SC2086
            "$SHARDLM" plan --model "$MODEL" --machines "$machines" --threads "$threads" $links \
                --context "$p" --json >"$TMP/plan-$r.json"
            # shellcheck disable=SC2086
            "$SHARDLM" bench --model "$MODEL" -p "$p" -g 128 -n 1 --threads "$threads" $flags --json \
                >"$TMP/bench-$r.json" 2>/dev/null
        done
        rows+=("$(python3 - "$TMP" "$ROUNDS" "$strategy" "$ranks" "$p" "${link:-}" <<'PY'
import json, statistics, sys
tmp, rounds, strategy, ranks, p, link = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
preds, meas = [], []
for r in range(1, rounds + 1):
    plan = json.load(open(f"{tmp}/plan-{r}.json"))
    preds.append(next(x for x in plan["predictions"] if x["strategy"] == strategy and x["ranks"] == ranks))
    meas.append(json.load(open(f"{tmp}/bench-{r}.json"))["avg"])
med = statistics.median
print(json.dumps({"prompt": int(p), "strategy": strategy, "link": link or "-", "rounds": rounds,
    "ttft_pred": med(x["ttft_s"] for x in preds), "ttft_meas": med(x["ttft_s"] for x in meas),
    "decode_pred": med(x["decode_tok_s"] for x in preds), "decode_meas": med(x["generation_tps"] for x in meas),
    "decode_pred_all": [x["decode_tok_s"] for x in preds], "decode_meas_all": [x["generation_tps"] for x in meas]}))
PY
)")
    done
done
printf '%s\n' "${rows[@]}" >"$TMP/rows.jsonl"
if [ -n "$JSON" ]; then cp "$TMP/rows.jsonl" "$JSON"; fi
python3 - "$TMP/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| prompt | strategy | link | TTFT predicted | TTFT measured | error | decode predicted | decode measured | error |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    e1 = r["ttft_pred"] / r["ttft_meas"] - 1
    e2 = r["decode_pred"] / r["decode_meas"] - 1
    print("| %d | %s | %s | %.2f s | %.2f s | %+.0f%% | %.1f | %.1f | %+.0f%% |" % (
        r["prompt"], r["strategy"], r["link"], r["ttft_pred"], r["ttft_meas"], e1 * 100,
        r["decode_pred"], r["decode_meas"], e2 * 100))
PY
