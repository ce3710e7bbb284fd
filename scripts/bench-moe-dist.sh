#!/usr/bin/env bash
# Decode of the random 2.6B-A0.4B qwen3moe (scripts/make_moe_model.py) split
# over 2 ranks on this machine — tensor, expert and pipeline — against one
# process, with the bytes every rank sent per decoded token (counted by the
# transport, `decode_wire_bytes_per_token` in `shardlm bench --json`).
#
# One process runs 2 threads; each of the 2 ranks runs 1, so all use the same
# cores. Runs alternate (single, tensor, expert, pipeline, single, …) for
# --rounds rounds; the table gives medians.
#
# Usage: scripts/bench-moe-dist.sh [--rounds N] [--model GGUF] [-p N] [-g N] [--backend shm|tcp]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
MODEL="$CACHE/test-moe/qwen3moe-2.6b-q4_0.gguf"
ROUNDS=3
P=128
G=64
BACKEND=shm
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift ;;
        --model) MODEL="$2"; shift ;;
        -p) P="$2"; shift ;;
        -g) G="$2"; shift ;;
        --backend) BACKEND="$2"; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
SHARDLM="${SHARDLM:-$REPO/target/release/shardlm}"
[ -x "$SHARDLM" ] || (cd "$REPO" && cargo build --release -p shardlm >&2)
[ -f "$MODEL" ] || python3 "$REPO/scripts/make_moe_model.py" >&2
OUT="$(mktemp -d /tmp/bench-moe-dist.XXXXXX)"
echo "model $MODEL, -p $P -g $G, $ROUNDS rounds, backend $BACKEND; raw json in $OUT" >&2
for r in $(seq "$ROUNDS"); do
    for c in single tensor expert pipeline; do
        echo "round $r/$ROUNDS: $c (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        if [ "$c" = single ]; then
            "$SHARDLM" bench --model "$MODEL" -p "$P" -g "$G" -n 1 --threads 2 --json >"$OUT/$c-$r.json" 2>/dev/null
        else
            "$SHARDLM" bench --model "$MODEL" -p "$P" -g "$G" -n 1 --threads 1 --ranks 2 --strategy "$c" \
                --backend "$BACKEND" --json >"$OUT/$c-$r.json" 2>/dev/null
        fi
    done
done
python3 - "$OUT" <<'EOF'
import glob, json, statistics, sys
out = sys.argv[1]
rows = {}
for c in ["single", "tensor", "expert", "pipeline"]:
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{c}-*.json"))]
    rows[c] = dict(
        tg=statistics.median(r["avg"]["generation_tps"] for r in runs),
        pp=statistics.median(r["avg"]["prompt_tps"] for r in runs),
        wire=runs[0].get("decode_wire_bytes_per_token"),
        rss=[round(b / 2**30, 3) for b in runs[0]["peak_rss_bytes_per_rank"]],
    )
base = rows["single"]
print("| split | decode tok/s | ÷ one process | prefill tok/s | ÷ one process | wire bytes / decoded token | peak RSS per rank GiB |")
print("|---|---|---|---|---|---|---|")
for c, r in rows.items():
    wire = "—" if r["wire"] is None else f"{r['wire']:.0f}"
    print(f"| {c} | {r['tg']:.2f} | {r['tg'] / base['tg']:.2f} | {r['pp']:.1f} | {r['pp'] / base['pp']:.2f} | {wire} | {r['rss']} |")
EOF
