#!/usr/bin/env bash
# Distributed benchmarks: collectives, striping over two cables, and tensor and
# pipeline parallel generation on SmolLM2-135M (Q4_1).
#
# Every comparison alternates its variants A B A B ... (--rounds each, default 3)
# so slow drift of a shared machine hits both alike; the table shows medians.
#
# Cases:
#   a  all-reduce latency, 2 ranks, 4 KiB / 8 KiB / 16 KiB / 1 MiB, shm vs tcp
#      loopback (crates/comm example allreduce_bench; its median over iterations)
#   b  all-reduce bandwidth between two network namespaces joined by two veth
#      cables on two subnets (setup.sh --plain: nothing but the addresses, no
#      nft marks, no policy routing), each direction of each cable limited by
#      `tc tbf` (--rate, default 200mbit), 1 vs 2 TCP connections per peer,
#      connection k dialing cable k (SHARDLM_LINKS; target: 2 >= 1.8x 1). The
#      ranks are allreduce_bench --worker processes started by hand; the time is
#      rank 0's median all-reduce (50 timed), bytes are the tbf counters of
#      rank 0's cables.
#   g  unequal cables: as b with cable 1 at --rate and cable 2 at half of it
#      (--slow-rate); the faster cable alone (1 connection) vs both cables with
#      equal stripes (SHARDLM_CALIBRATE_BYTES=0) vs both with stripes weighted
#      by measured throughput (target: weighted >= 1.3x the faster cable alone)
#   c  decode tok/s, --strategy tensor --ranks 2 (1 thread per rank) over shm
#      and tcp (and tcp with --wire q8 where the flag exists) vs one process
#      with 2 threads; 128 tokens, --ignore-eos
#   d  decode tok/s, pipeline --ranks 2 (1 thread per rank) vs one process, 1 thread
#   e  prefill tok/s of a 2048-token prompt, pipeline --ranks 2 (1 thread per
#      rank, --prefill-chunk 256) with and without --no-prefill-overlap, and one
#      process with 1 thread for reference
#   f  bytes on the wire per decoded token, tensor parallel, greedy, 2 ranks in
#      two namespaces over one veth cable: /proc/net/dev of rank 0's device
#      around runs of 16 and 144 tokens (difference / 128), next to the figure
#      computed from the model's shape; f32 and (where --wire exists) q8
#
# Usage: scripts/bench-dist.sh [--rounds N] [--cases abcdefg] [--json PATH]
#                              [--rate R] [--slow-rate R] [--bw-bytes B] [--model GGUF]
# Environment:
#   SHARDLM          an existing shardlm binary (default: cargo build --release)
#   ALLREDUCE_BENCH  an existing allreduce_bench binary (default: cargo build)
# Cases b, f and g need root and network namespaces (scripts/netns/setup.sh);
# they are skipped with the reason otherwise. The binaries are copied to
# a temporary directory first, so rebuilds during the run don't change them.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=3
CASES=abcdefg
JSON_OUT=""
RATE=200mbit
SLOW_RATE=100mbit
BW_BYTES=4194304
MODEL="${SHARDLM_CACHE:-$HOME/.cache/shardlm}/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"
PREFIX=shardlm-bench

die() { echo "bench-dist: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS="$2"; shift ;;
    --cases) CASES="$2"; shift ;;
    --json) JSON_OUT="$2"; shift ;;
    --rate) RATE="$2"; shift ;;
    --slow-rate) SLOW_RATE="$2"; shift ;;
    --bw-bytes) BW_BYTES="$2"; shift ;;
    --model) MODEL="$2"; shift ;;
    -h | --help) usage 0 ;;
    *) echo "bench-dist: unknown argument $1" >&2; usage 2 ;;
    esac
    shift
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "--rounds needs a positive number"
has() { [[ "$CASES" == *"$1"* ]]; }

work="$(mktemp -d /tmp/bench-dist.XXXXXX)"
cleanup() {
    if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
        scripts/netns/teardown.sh --prefix "$PREFIX" --quiet || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
RESULTS="$work/results.tsv"
: >"$RESULTS"

if [ -z "${SHARDLM:-}" ] || [ -z "${ALLREDUCE_BENCH:-}" ]; then
    echo "== cargo build --release -p shardlm -p shardlm-comm --example allreduce_bench" >&2
    cargo build --release -q -p shardlm -p shardlm-comm --example allreduce_bench
fi
cp "${SHARDLM:-target/release/shardlm}" "$work/shardlm"
cp "${ALLREDUCE_BENCH:-target/release/examples/allreduce_bench}" "$work/allreduce_bench"
BIN="$work/shardlm"
ARB="$work/allreduce_bench"
if has c || has d || has e || has f; then
    [ -f "$MODEL" ] || die "model not found: $MODEL (run 'shardlm inspect' once to fetch it, or --model)"
fi
WIRE=0
if "$BIN" run --help | grep -q -- '--wire'; then WIRE=1; fi

load() { cut -d' ' -f1-3 /proc/loadavg; }
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$RESULTS"; }
note() { printf '%s\t%s\t%s\n' "note" "$1" "$2" >>"$RESULTS"; }
say() { echo "bench-dist: $*" >&2; }
jfield() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }

note start_load "$(load)"
note commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown) ($(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) modified files in the work tree)"
note cpu "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
note wire_flag "$WIRE"

netns_ok() { # prints why not, returns 1, when namespaces can't be used
    if [ "$(id -u)" != 0 ]; then echo "not root"; return 1; fi
    command -v ip >/dev/null || { echo "ip (iproute2) not installed"; return 1; }
    local why
    if ! why="$(ip netns add "${PREFIX}probe" 2>&1)"; then echo "ip netns add refused: $why"; return 1; fi
    ip netns del "${PREFIX}probe"
}

# shardlm run on SmolLM2 with the given flags; prints the JSON object.
smol() { timeout 600 "$BIN" run --model "$MODEL" --json --ignore-eos "$@"; }
DECODE_PROMPT="$(seq -s, 100 115)"
LONG_PROMPT="$(seq -s, 100 2147)"

# ---- a: all-reduce latency ------------------------------------------------
if has a; then
    say "a: all-reduce latency, shm vs tcp loopback ($ROUNDS rounds)"
    for r in $(seq 1 "$ROUNDS"); do
        for t in shm tcp; do
            out="$(timeout 600 "$ARB" --transports "$t" --sizes 4096,8192,16384,1048576 --json)"
            echo "$out" | python3 -c '
import json, sys
for x in json.load(sys.stdin)["results"]:
    print("a\t%s %d\t%.3f" % (x["transport"], x["bytes"], x["median_us"]))' >>"$RESULTS"
        done
    done
fi

# ---- b, g: two cables -----------------------------------------------------------
# One all-reduce run over the cables of hosts ${PREFIX}1 and ${PREFIX}2 (setup.sh
# --plain); $1 = case, $2 = label, then env assignments for both ranks.
# Records rank 0's median all-reduce time and each cable's share of the bytes.
cables_run() {
    local case="$1" label="$2"
    shift 2
    sent() { # bytes rank 0 (host 1) sent on cable $1
        tc -n "${PREFIX}1" -s qdisc show dev "l${1}h2" | awk '/Sent/ {print $2; exit}'
    }
    local peers=10.78.18.1:7100,10.78.18.2:7100 links="10.78.18.1,10.79.18.1;10.78.18.2,10.79.18.2"
    local s1 s2 w out
    s1="$(sent 1)" s2="$(sent 2)"
    ip netns exec "${PREFIX}2" env SHARDLM_RANK=1 SHARDLM_SIZE=2 SHARDLM_PEERS=$peers SHARDLM_LINKS="$links" \
        SHARDLM_SECRET=bench "$@" timeout 600 "$ARB" --worker --sizes "$BW_BYTES" --iters 1 &
    w=$!
    out="$(ip netns exec "${PREFIX}1" env SHARDLM_RANK=0 SHARDLM_SIZE=2 SHARDLM_PEERS=$peers \
        SHARDLM_LINKS="$links" SHARDLM_SECRET=bench "$@" \
        timeout 600 "$ARB" --worker --sizes "$BW_BYTES" --iters 1 --json 2>"$work/cables.err")"
    wait "$w"
    local e1=$(($(sent 1) - s1)) e2=$(($(sent 2) - s2))
    local ms
    ms="$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["results"][0]["median_us"] / 1e3)')"
    record "$case" "$label ms" "$ms"
    record "$case" "$label MBps" "$(python3 -c "print($BW_BYTES / 1e3 / $ms)")"
    record "$case" "$label cable1_share" "$(python3 -c "print($e1 / max(1, $e1 + $e2))")"
    [ -s "$work/cables.err" ] && note "${case}_cables $label" "$(tr '\n' '|' <"$work/cables.err")"
    return 0
}

if has b; then
    if why="$(netns_ok)"; then
        say "b: all-reduce of $BW_BYTES bytes over two cables of $RATE, 1 vs 2 connections ($ROUNDS rounds)"
        scripts/netns/setup.sh --prefix "$PREFIX" --links 2 --plain --rate "$RATE" 2 >/dev/null
        note b_setup "scripts/netns/setup.sh --prefix $PREFIX --links 2 --plain --rate $RATE 2"
        for r in $(seq 1 "$ROUNDS"); do
            cables_run b "conns 1" SHARDLM_CONNECTIONS=1
            cables_run b "conns 2" SHARDLM_CONNECTIONS=2
        done
        scripts/netns/teardown.sh --prefix "$PREFIX" --quiet
    else
        say "b: skipped: $why"
        note b_skipped "$why"
    fi
fi

if has g; then
    if why="$(netns_ok)"; then
        say "g: all-reduce of $BW_BYTES bytes over cables of $RATE and $SLOW_RATE ($ROUNDS rounds)"
        scripts/netns/setup.sh --prefix "$PREFIX" --links 2 --plain --rates "$RATE,$SLOW_RATE" 2 >/dev/null
        note g_setup "scripts/netns/setup.sh --prefix $PREFIX --links 2 --plain --rates $RATE,$SLOW_RATE 2"
        for r in $(seq 1 "$ROUNDS"); do
            cables_run g "fast cable alone" SHARDLM_CONNECTIONS=1
            cables_run g "both, equal stripes" SHARDLM_CONNECTIONS=2 SHARDLM_CALIBRATE_BYTES=0
            cables_run g "both, weighted" SHARDLM_CONNECTIONS=2
        done
        scripts/netns/teardown.sh --prefix "$PREFIX" --quiet
    else
        say "g: skipped: $why"
        note g_skipped "$why"
    fi
fi

# ---- c: tensor parallel decode ----------------------------------------------
if has c; then
    say "c: tensor parallel decode vs one process with 2 threads ($ROUNDS rounds)"
    for r in $(seq 1 "$ROUNDS"); do
        v="$(smol --prompt-ids "$DECODE_PROMPT" --max-tokens 128 --threads 2 | jfield decode_tok_s)"
        record c "single 2 threads" "$v"
        for b in shm tcp; do
            v="$(smol --prompt-ids "$DECODE_PROMPT" --max-tokens 128 --threads 1 --strategy tensor --ranks 2 \
                --backend "$b" | jfield decode_tok_s)"
            record c "tensor 2x1 $b" "$v"
        done
        if [ "$WIRE" = 1 ]; then
            v="$(smol --prompt-ids "$DECODE_PROMPT" --max-tokens 128 --threads 1 --strategy tensor --ranks 2 \
                --backend tcp --wire q8 | jfield decode_tok_s)"
            record c "tensor 2x1 tcp q8" "$v"
        fi
    done
fi

# ---- d: pipeline decode -----------------------------------------------------
if has d; then
    say "d: pipeline decode vs one process with 1 thread ($ROUNDS rounds)"
    for r in $(seq 1 "$ROUNDS"); do
        v="$(smol --prompt-ids "$DECODE_PROMPT" --max-tokens 128 --threads 1 | jfield decode_tok_s)"
        record d "single 1 thread" "$v"
        v="$(smol --prompt-ids "$DECODE_PROMPT" --max-tokens 128 --threads 1 --ranks 2 | jfield decode_tok_s)"
        record d "pipeline 2x1" "$v"
    done
fi

# ---- e: pipeline prefill overlap --------------------------------------------
if has e; then
    say "e: pipeline prefill of 2048 tokens, overlap vs none ($ROUNDS rounds)"
    for r in $(seq 1 "$ROUNDS"); do
        common=(--prompt-ids "$LONG_PROMPT" --max-tokens 1 --threads 1 --prefill-chunk 256)
        v="$(smol "${common[@]}" --ranks 2 | jfield prefill_tok_s)"
        record e "pipeline 2x1 overlap" "$v"
        v="$(smol "${common[@]}" --ranks 2 --no-prefill-overlap | jfield prefill_tok_s)"
        record e "pipeline 2x1 no overlap" "$v"
        v="$(smol "${common[@]}" | jfield prefill_tok_s)"
        record e "single 1 thread" "$v"
    done
fi

# ---- f: bytes on the wire per decoded token ---------------------------------
if has f; then
    if why="$(netns_ok)"; then
        say "f: bytes on the wire per decoded token, tensor parallel over a veth cable"
        scripts/netns/setup.sh --prefix "$PREFIX" 2 >/dev/null
        note f_setup "scripts/netns/setup.sh --prefix $PREFIX 2"
        shape="$("$BIN" inspect "$MODEL" --json)"
        for k in layers hidden_size vocab_size; do
            note "model_$k" "$(echo "$shape" | jfield "$k")"
        done
        counters() { # rx tx bytes of eth0 in host 1 (rank 0)
            ip netns exec "${PREFIX}1" cat /proc/net/dev | awk '$1 == "eth0:" {print $2, $10}'
        }
        peers=10.77.0.1:7000,10.77.0.2:7000
        wires=(f32)
        [ "$WIRE" = 0 ] || wires+=(q8)
        for wire in "${wires[@]}"; do
            wflag=()
            [ "$WIRE" = 0 ] || wflag=(--wire "$wire")
            for r in $(seq 1 "$ROUNDS"); do
                for n in 16 144; do
                    read -r rx0 tx0 < <(counters)
                    args=(run --model "$MODEL" --json --ignore-eos --prompt-ids "$DECODE_PROMPT" --max-tokens "$n"
                        --threads 1 --strategy tensor "${wflag[@]}")
                    ip netns exec "${PREFIX}2" env SHARDLM_RANK=1 SHARDLM_SIZE=2 SHARDLM_PEERS=$peers \
                        SHARDLM_SECRET=bench timeout 600 "$BIN" "${args[@]}" &
                    w=$!
                    ip netns exec "${PREFIX}1" env SHARDLM_RANK=0 SHARDLM_SIZE=2 SHARDLM_PEERS=$peers \
                        SHARDLM_SECRET=bench timeout 600 "$BIN" "${args[@]}" >"$work/f.json"
                    wait "$w"
                    read -r rx1 tx1 < <(counters)
                    eval "rx_$n=$((rx1 - rx0)) tx_$n=$((tx1 - tx0))"
                done
                record f "$wire rank0 sent B/token" "$(python3 -c "print(($tx_144 - $tx_16) / 128)")"
                record f "$wire rank0 received B/token" "$(python3 -c "print(($rx_144 - $rx_16) / 128)")"
            done
        done
        scripts/netns/teardown.sh --prefix "$PREFIX" --quiet
    else
        say "f: measurement skipped: $why"
        note f_skipped "$why"
        shape="$("$BIN" inspect "$MODEL" --json)"
        for k in layers hidden_size vocab_size; do
            note "model_$k" "$(echo "$shape" | jfield "$k")"
        done
    fi
fi

note end_load "$(load)"

# ---- report -------------------------------------------------------------------
python3 - "$RESULTS" "$JSON_OUT" <<'EOF'
import json, statistics, sys
from collections import defaultdict

rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
notes = {k: v for s, k, v in rows if s == "note"}
vals = defaultdict(list)
for s, k, v in rows:
    if s != "note":
        vals[(s, k)].append(float(v))
med = {k: statistics.median(v) for k, v in vals.items()}
out = {"notes": notes, "medians": {f"{s}: {k}": v for (s, k), v in med.items()},
       "samples": {f"{s}: {k}": v for (s, k), v in vals.items()}}

def get(s, k):
    return med.get((s, k))

def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"

print(f"commit {notes.get('commit')}; {notes.get('cpu')}")
print(f"load average at start {notes.get('start_load')}, at end {notes.get('end_load')}")

if any(s == "a" for s, _ in vals):
    print("\n(a) all-reduce, 2 ranks, median latency (µs)")
    print(f"{'bytes':>9} {'shm':>9} {'tcp':>9} {'tcp/shm':>8}")
    for b in (4096, 8192, 16384, 1048576):
        shm, tcp = get("a", f"shm {b}"), get("a", f"tcp {b}")
        if shm is not None and tcp is not None:
            print(f"{b:>9} {shm:>9.1f} {tcp:>9.1f} {ratio(tcp, shm):>8}")

def cables(case, title, labels, base, best, target):
    if not any(s == case for s, _ in vals):
        if f"{case}_skipped" in notes:
            print(f"\n({case}) skipped: {notes[case + '_skipped']}")
        return
    print(f"\n({case}) {title} ({notes.get(case + '_setup')})")
    print(f"{'variant':<22} {'median ms':>10} {'MB/s':>8} {'cable 1 share':>14} {'vs ' + base:>22}")
    for l in labels:
        ms, mb, sh = get(case, f"{l} ms"), get(case, f"{l} MBps"), get(case, f"{l} cable1_share")
        if ms is not None:
            print(f"{l:<22} {ms:>10.1f} {mb:>8.1f} {sh:>14.2f} {ratio(get(case, base + ' ms'), ms):>22}")
    r = get(case, base + " ms") / get(case, best + " ms")
    out[f"{case}_speedup"] = r
    print(f"{best} vs {base}: {r:.2f}x (target >= {target}x: {'met' if r >= target else 'NOT met'})")

cables("b", "all-reduce over two tbf-limited cables, 1 vs 2 connections", ["conns 1", "conns 2"],
       "conns 1", "conns 2", 1.8)
cables("g", "all-reduce over unequal cables", ["fast cable alone", "both, equal stripes", "both, weighted"],
       "fast cable alone", "both, weighted", 1.3)

def tokrows(s, title, base):
    keys = [k for (ss, k) in vals if ss == s]
    if not keys:
        return
    print(f"\n{title}")
    print(f"{'variant':<26} {'tok/s':>8} {'vs ' + base:>24}")
    b = get(s, base)
    for k in keys:
        print(f"{k:<26} {get(s, k):>8.1f} {ratio(get(s, k), b):>24}")

tokrows("c", "(c) decode, tensor parallel, SmolLM2 Q4_1, 128 tokens (median tok/s)", "single 2 threads")
tokrows("d", "(d) decode, pipeline, SmolLM2 Q4_1, 128 tokens (median tok/s)", "single 1 thread")
tokrows("e", "(e) prefill of 2048 tokens, chunk 256, SmolLM2 Q4_1 (median tok/s)", "pipeline 2x1 no overlap")

if "model_layers" in notes:
    L, H, V = int(notes["model_layers"]), int(notes["model_hidden_size"]), int(notes["model_vocab_size"])
    n = 2
    ar = 2 * L + 1                       # two per layer, one after the sharded embedding
    f32_ar = ar * H * 4 * (n - 1)        # direct exchange: each rank sends its whole vector once
    q8_ar = ar * ((H + 31) // 32) * 34 * (n - 1)
    argmax = 8                           # greedy: each rank's best (value, index) per row
    gather = (V // n) * 4                # sampling: each rank's vocabulary slice of the logits, f32
    print(f"\n(f) bytes each rank sends per decoded token, tensor parallel, 2 ranks "
          f"({L} layers, hidden {H}, vocab {V})")
    print(f"computed, payload only: {ar} all-reduces of {H} values (2 per layer + embedding): "
          f"f32 {f32_ar} B, q8 {q8_ar} B;")
    print(f"  plus the lm head: {argmax} B when greedy (distributed argmax, as here), "
          f"{gather} B when sampling (f32 logits all-gather)")
    print(f"  greedy totals: f32 {f32_ar + argmax} B, q8 {q8_ar + argmax} B "
          f"(the ring formula 2 x layers x hidden x 4 x 2(n-1)/n gives {2 * L * H * 4 * 2 * (n - 1) // n} B)")
    out["f_computed"] = {"f32_allreduce_B": f32_ar, "q8_allreduce_B": q8_ar, "argmax_B": argmax,
                         "logits_gather_B": gather}
    for w in ("f32", "q8"):
        s, rcv = get("f", f"{w} rank0 sent B/token"), get("f", f"{w} rank0 received B/token")
        if s is not None:
            print(f"measured on the veth ({w}, incl. TCP/IP headers and ACKs): rank 0 sent {s:.0f} B, "
                  f"received {rcv:.0f} B per token")
    if notes.get("wire_flag") == "0":
        print("shardlm run has no --wire flag here: the q8 figures are computed only")
    if "f_skipped" in notes:
        print(f"measurement skipped: {notes['f_skipped']}")

if sys.argv[2]:
    with open(sys.argv[2], "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"\nJSON written to {sys.argv[2]}")
EOF
