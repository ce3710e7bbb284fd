#!/usr/bin/env bash
# Long-context spot checks (docs/PERFORMANCE.md, "Long context"): shardlm against
# llama.cpp's llama-bench at an 8192-token context, shardlm alone at 65536, and
# distributed time to first token of an 8K prompt.
#
# Cases (--cases, comma-separated; default smol8k):
#   smol8k   SmolLM2-135M Q4_1, --threads T (default 2), alternating A B A B
#            (--rounds per engine, default 2):
#              shardlm bench -p 8160 -g 32 -n 1 --warmup 0   (TTFT and decode)
#              llama-bench -p 8192 -n 0 -r 1                 (prefill)
#              llama-bench -p 0 -n 32 -d 8160 -r 1           (decode at depth 8160)
#            SmolLM2's context is 8192 and shardlm refuses to go past it, so
#            its prompt is 8160 tokens and the 32 generated ones fill it up;
#            llama-bench decodes from the same depth (it would run past the
#            trained context, with a warning).
#   long64k  the SmolLM2-shaped random model with a 131072 context and llama3
#            rope (scripts/make_longctx_model.py), shardlm bench -p 65536 -g 32
#            -n 1 under /usr/bin/time -v: TTFT, decode, and peak RSS against the
#            prediction bench prints before the trial. Hours on two cores: the
#            prefill is quadratic in attention.
#   mem64k   bounded memory at 65536 in about a minute: the `kv` shape of
#            make_longctx_model.py (2 layers, 4 unshared KV heads: the KV cache
#            is most of the memory), shardlm bench -p 65536 -g 4: peak RSS
#            against the prediction (no buffer grows with p × vocab or p²;
#            the KV cache is the only thing that grows with p)
#   ctx32k   the SmolLM2-shaped long model (as long64k) at 32768, A B A B:
#              shardlm bench -p 32736 -g 32 -n 1 --warmup 0     (TTFT and decode)
#              llama-server -c 32768, one /completion of the same length
#              (32736 random prompt tokens, 32 generated, no prompt cache):
#              its reported prefill and decode rates. llama-bench would
#              prefill 32K twice (-p 32768, then -d 32736 for the decode).
#   dist8k   TTFT of an 8188-token prompt (+ 4 generated: the 8192 context) on
#            SmolLM2 Q4_1: 1 process × 1 thread, then --ranks 2 × 1 thread
#            with --strategy tensor and pipeline
#
# Usage: scripts/bench-longctx.sh [--cases a,b] [--rounds N] [--threads T] [--out DIR]
# Environment:
#   SHARDLM        an existing shardlm binary (default: cargo build --release -p shardlm)
#   LLAMA_BENCH    an existing llama-bench (default: the one scripts/bench-vs-llamacpp.sh
#                  builds under $SHARDLM_CACHE/llama.cpp-b11434/)
#   SHARDLM_CACHE  models and the llama.cpp build (default ~/.cache/shardlm)
# Raw outputs go to --out (default a fresh directory under /tmp); a summary is
# printed at the end. These are single runs on a shared machine: spot checks.
set -euo pipefail
cd "$(dirname "$0")/.."

CASES=smol8k
ROUNDS=2
NT=2
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cases) CASES="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --threads) NT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,43p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}"
SMOL="$CACHE/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"
LONG="$CACHE/longctx/longctx-smollm2-q8_0.gguf"
OUT="${OUT:-$(mktemp -d /tmp/bench-longctx.XXXXXX)}"
mkdir -p "$OUT"

if [ -z "${SHARDLM:-}" ]; then
  cargo build --release -p shardlm
  SHARDLM=target/release/shardlm
fi
[ -f "$SMOL" ] || "$SHARDLM" inspect >/dev/null # fetches the default model
if [ -z "${LLAMA_BENCH:-}" ]; then
  LLAMA_BENCH=$(ls "$CACHE"/llama.cpp-b11434/build-*/bin/llama-bench 2>/dev/null | head -1 || true)
fi
has_case() { [[ ",$CASES," == *",$1,"* ]]; }

# shardlm bench in text mode; keeps its stdout+stderr and /usr/bin/time -v output.
shardlm_bench() { # name args...
  local name=$1; shift
  echo "== $name: shardlm bench $*" >&2
  /usr/bin/time -v -o "$OUT/$name.time" "$SHARDLM" bench "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  grep -E "^(predicted|Trial|Peak)" "$OUT/$name.out" >&2 || { cat "$OUT/$name.err" >&2; return 1; }
}

# llama-bench, markdown table kept.
llama_bench() { # name args...
  local name=$1; shift
  echo "== $name: llama-bench $*" >&2
  /usr/bin/time -v -o "$OUT/$name.time" "$LLAMA_BENCH" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  grep -E "^\| llama" "$OUT/$name.out" >&2
  grep -E "Maximum resident" "$OUT/$name.time" >&2
}

if has_case smol8k; then
  [ -x "${LLAMA_BENCH:-}" ] || { echo "no llama-bench: set LLAMA_BENCH or run scripts/bench-vs-llamacpp.sh once" >&2; exit 1; }
  for r in $(seq 1 "$ROUNDS"); do
    shardlm_bench "smol8k-shardlm-$r" --model "$SMOL" -p 8160 -g 32 -n 1 --warmup 0 --threads "$NT"
    llama_bench "smol8k-llama-pp-$r" -m "$SMOL" -p 8192 -n 0 -r 1 -t "$NT" --no-warmup
    llama_bench "smol8k-llama-tg-$r" -m "$SMOL" -p 0 -n 32 -d 8160 -r 1 -t "$NT" --no-warmup
  done
fi

if has_case long64k; then
  [ -f "$LONG" ] || python3 scripts/make_longctx_model.py --shape smollm2
  shardlm_bench long64k --model "$LONG" -p 65536 -g 32 -n 1 --warmup 0 --threads "$NT"
  grep -E "Maximum resident|Elapsed" "$OUT/long64k.time" >&2
fi

if has_case ctx32k; then
  [ -f "$LONG" ] || python3 scripts/make_longctx_model.py --shape smollm2
  SERVER="$(dirname "${LLAMA_BENCH:-/nonexistent}")/llama-server"
  [ -x "$SERVER" ] || { echo "no llama-server next to $LLAMA_BENCH (scripts/bench-vs-llamacpp.sh --llama-server builds it)" >&2; exit 1; }
  for r in $(seq 1 "$ROUNDS"); do
    shardlm_bench "ctx32k-shardlm-$r" --model "$LONG" -p 32736 -g 32 -n 1 --warmup 0 --threads "$NT"
    echo "== ctx32k-llama-$r: llama-server /completion, 32736 prompt tokens + 32" >&2
    port=$((18000 + RANDOM % 1000))
    # Started directly (not under /usr/bin/time, which does not pass the kill
    # on): its peak RSS is read from /proc before it is stopped.
    "$SERVER" -m "$LONG" -c 32768 -t "$NT" -tb "$NT" \
      --port "$port" -np 1 --no-warmup >"$OUT/ctx32k-llama-$r.err" 2>&1 &
    spid=$!
    trap 'kill "$spid" 2>/dev/null || true' EXIT
    python3 - "$port" "$OUT/ctx32k-llama-$r.out" <<'PY'
import json, random, sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
            break
    except Exception:
        time.sleep(1)
rng = random.Random(7)
prompt = [rng.randrange(100, 49000) for _ in range(32736)]
body = {"prompt": prompt, "n_predict": 32, "cache_prompt": False, "ignore_eos": True, "temperature": 0}
req = urllib.request.Request(base + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
t = json.load(urllib.request.urlopen(req, timeout=7200))["timings"]
json.dump(t, open(out, "w"))
print(f"llama-server: prefill {t['prompt_per_second']:.1f} tok/s ({t['prompt_ms']/1000:.1f} s, {t['prompt_n']} tokens), "
      f"decode {t['predicted_per_second']:.1f} tok/s ({t['predicted_n']} tokens)", file=sys.stderr)
PY
    grep -E "VmHWM" "/proc/$spid/status" >&2 || true
    kill "$spid"; wait "$spid" 2>/dev/null || true
  done
fi

if has_case mem64k; then
  KVM="$CACHE/longctx/longctx-kv-q8_0.gguf"
  [ -f "$KVM" ] || python3 scripts/make_longctx_model.py --shape kv
  shardlm_bench mem64k --model "$KVM" -p 65536 -g 4 -n 1 --warmup 0 --threads "$NT"
  grep -E "Maximum resident|Elapsed" "$OUT/mem64k.time" >&2
fi

if has_case dist8k; then
  shardlm_bench dist8k-single --model "$SMOL" -p 8188 -g 4 -n 1 --warmup 0 --threads 1
  for s in tensor pipeline; do
    shardlm_bench "dist8k-$s" --model "$SMOL" -p 8188 -g 4 -n 1 --warmup 0 --threads 1 --ranks 2 --strategy "$s"
  done
fi

echo
echo "summary (raw outputs in $OUT):"
for f in "$OUT"/*.out; do
  n=$(basename "$f" .out)
  case "$n" in
    ctx32k-llama*) python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print(f\"$n: prefill {t['prompt_per_second']:.1f} tok/s, decode {t['predicted_per_second']:.1f} tok/s\")" "$f" ;;
    *llama*) sed -n 's/^| llama[^|]*|[^|]*|[^|]*|[^|]*|[^|]*| *\([a-z0-9 @]*\) *| *\([0-9.]*\).*/\1 \2 tok\/s/p' "$f" | sed "s/^/$n: /" ;;
    *)
      t=$(grep -E "^Trial 1:" "$f" | sed 's/^Trial 1: //')
      rss=$(grep -E "^Peak memory" "$f" || true)
      echo "$n: $t; $rss"
      ;;
  esac
done
