#!/usr/bin/env bash
# Same-machine A/B of two shardlm binaries (OLD, NEW) with `shardlm bench`:
# prefill and decode, alternating OLD NEW per model and round, medians and
# the NEW/OLD ratio, and whether the two generated the same greedy tokens.
# For changes that must not cost speed (the compute seam's 2% bar).
#
# Usage: OLD=/path/to/old/shardlm [NEW=target/release/shardlm] \
#        scripts/bench-ab.sh [--rounds N] [--threads N] [-p N] [-g N] MODEL ...
# MODEL: anything `shardlm bench --model` takes (GGUF file, HF directory, alias).
#
# --instructions: instead of timing, count each binary's instructions for one
# short run (`-p 32 -g 4` unless given, one thread, the AVX2 kernels, under
# valgrind's callgrind, which has no AVX-512): deterministic where wall-clock
# drifts ±25%, so a 2% bar can be checked on a noisy VM. Needs valgrind.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
NEW="${NEW:-$REPO/target/release/shardlm}"
OLD="${OLD:?set OLD to the shardlm binary to compare against}"
ROUNDS=4
NT=2
PP=256
TG=32
COUNT=0
while [ $# -gt 0 ]; do
    case "$1" in
    --instructions) COUNT=1; PP=32; TG=4; shift ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --threads) NT="$2"; shift 2 ;;
    -p) PP="$2"; shift 2 ;;
    -g) TG="$2"; shift 2 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: OLD=... $0 [--rounds N] [--threads N] [-p N] [-g N] MODEL ..." >&2; exit 2; }
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
if [ "$COUNT" = 1 ]; then
    echo "# instructions (callgrind, SHARDLM_ISA=avx2, 1 thread, pp$PP tg$TG, load and all), $(date -u +%FT%TZ)"
    echo "| model | old | new | new/old | same tokens |"
    echo "|---|---|---|---|---|"
    for m in "$@"; do
        for e in old new; do
            bin="$OLD"; [ "$e" = new ] && bin="$NEW"
            SHARDLM_ISA=avx2 valgrind --tool=callgrind --callgrind-out-file="$OUT.$e.cg" "$bin" bench --model "$m" \
                -p "$PP" -g "$TG" -n 1 --warmup 0 --threads 1 --json > "$OUT.$e.json" 2>/dev/null &
        done
        wait
        python3 - "$OUT" "$m" <<'EOF2'
import json, sys
out, m = sys.argv[1], sys.argv[2]
ir = {e: int(next(l for l in open(f"{out}.{e}.cg") if l.startswith("summary:")).split()[1]) for e in ("old", "new")}
ids = {e: json.load(open(f"{out}.{e}.json"))["trials"][0]["output_ids"] for e in ("old", "new")}
name = m.rstrip("/").split("/")[-1]
same = "yes" if ids["old"] == ids["new"] else "NO"
print(f"| {name} | {ir['old']:,} | {ir['new']:,} | {ir['new'] / ir['old']:.5f} | {same} |")
EOF2
        rm -f "$OUT".*.cg "$OUT".*.json
    done
    exit 0
fi
echo "# $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ), $NT threads, pp$PP tg$TG, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
    for m in "$@"; do
        for e in old new; do
            bin="$OLD"; [ "$e" = new ] && bin="$NEW"
            "$bin" bench --model "$m" -p "$PP" -g "$TG" -n 2 --threads "$NT" --json 2>/dev/null \
                | python3 -c "import json,sys; d=json.load(sys.stdin); \
print('$e', '$m', d['avg']['prompt_tps'], d['avg']['generation_tps'], ','.join(map(str, d['trials'][0]['output_ids'])))" >> "$OUT"
        done
    done
done
python3 - "$OUT" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
models = list(dict.fromkeys(r[1] for r in rows))
print(f"| model | prefill old | new | ratio | decode old | new | ratio | same tokens |")
print("|---|---|---|---|---|---|---|---|")
for m in models:
    get = lambda e, i: [float(r[i]) for r in rows if r[0] == e and r[1] == m]
    ids = {r[0]: r[4] for r in rows if r[1] == m}
    po, pn, do, dn = (statistics.median(get(e, i)) for i, e in [(2, "old"), (2, "new"), (3, "old"), (3, "new")])
    name = m.rstrip("/").split("/")[-1]
    same = "yes" if len({r[4] for r in rows if r[1] == m}) == 1 else "NO"
    print(f"| {name} | {po:.1f} | {pn:.1f} | {pn/po:.3f} | {do:.2f} | {dn:.2f} | {dn/do:.3f} | {same} |")
    for e in ("old", "new"):
        pp, tg = " ".join(f"{v:.0f}" for v in get(e, 2)), " ".join(f"{v:.1f}" for v in get(e, 3))
        print(f"  {name} {e}: prefill {pp} / decode {tg}", file=sys.stderr)
EOF
