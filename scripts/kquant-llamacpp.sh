#!/usr/bin/env bash
# K-quant and I-quant GGUF files written by llama.cpp's own llama-quantize:
# do they load and decode in shardlm, and is the greedy text llama.cpp's?
# For each type, re-encodes SOURCE (default: SmolLM2-135M Q4_1 from
# ~/.cache/shardlm; pass the 1.1B test model's GGUF for the 256-wide types)
# with `llama-quantize --allow-requantize`. No importance matrix is used, except
# for the types llama-quantize refuses without one (IQ3_XXS, IQ2_*, IQ1_*):
# those get a uniform one (scripts/uniform_imatrix.py: all ones, in the legacy
# .dat format), which is what "no importance" means to the quantizer. Then it compares
# N greedy tokens after a fixed prompt (tokenized by llama-server, the same
# ids fed to both): llama-server b11434 `/completion` (top_k 1, -fa off)
# against `shardlm run --prompt-ids`. Prints the tensor types of each file.
# Exit status 1 if shardlm fails to load or decode a file llama.cpp wrote.
# Not in CI (needs llama.cpp built; see scripts/bench-vs-llamacpp.sh).
#
# With QUANTIZER=shardlm the files are written by `shardlm quantize --to
# <type in lower case>` instead (Q2_K Q3_K Q5_K Q6_K and the mixes Q3_K_M
# Q4_K_M Q5_K_M): does llama.cpp load what we write, and decode it as we do?
#
# Usage: scripts/kquant-llamacpp.sh [SOURCE.gguf] [TYPE ...]
# Environment: SHARDLM (default target/release/shardlm), LLAMA_BIN (dir with
#   llama-quantize, llama-server), OUT (where the files go, kept; default a
#   temporary dir), N (tokens, default 24), THREADS (default 2), QUANTIZER
#   (llama, the default, or shardlm).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARDLM="${SHARDLM:-target/release/shardlm}"
LLAMA_BIN="${LLAMA_BIN:-$(dirname "$(ls "$HOME"/.cache/shardlm/llama.cpp-b11434/build-*/bin/llama-server 2>/dev/null | head -1)")}"
SRC="${1:-$HOME/.cache/shardlm/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf}"
shift || true
TYPES="${*:-Q2_K Q3_K_M IQ4_XS IQ4_NL IQ3_XXS IQ3_S IQ2_XXS IQ2_XS IQ2_S IQ1_S IQ1_M}"
N="${N:-24}"
THREADS="${THREADS:-2}"
QUANTIZER="${QUANTIZER:-llama}"
if [ -z "${OUT:-}" ]; then
  OUT=$(mktemp -d)
  trap 'rm -rf "$OUT"' EXIT
fi
mkdir -p "$OUT"
PROMPT="The capital of France is Paris. The largest planet in the solar system is"
status=0
base=$(basename "$SRC" .gguf)
# A uniform legacy imatrix (scripts/uniform_imatrix.py).
python3 scripts/uniform_imatrix.py "$SRC" "$OUT/uniform.imatrix"
for t in $TYPES; do
  f="$OUT/$base.$t.$QUANTIZER.gguf"
  if [ "$QUANTIZER" = shardlm ]; then
    if [ ! -s "$f" ] && ! "$SHARDLM" quantize "$SRC" "$OUT/part.gguf" --to "${t,,}" >"$OUT/$t.quantize.log" 2>&1; then
      echo "$t: shardlm quantize failed: $(tail -1 "$OUT/$t.quantize.log")"
      status=1
      continue
    fi
    [ -f "$OUT/part.gguf" ] && mv "$OUT/part.gguf" "$f"
  fi
  imx=()
  case "$t" in IQ3_XXS | IQ2_* | IQ1_*) imx=(--imatrix "$OUT/uniform.imatrix") ;; esac
  if [ "$QUANTIZER" = llama ] && [ ! -s "$f" ] && ! "$LLAMA_BIN/llama-quantize" --allow-requantize "${imx[@]}" "$SRC" "$f.part" "$t" "$THREADS" >"$OUT/$t.quantize.log" 2>&1; then
    echo "$t: llama-quantize refused: $(grep -iE 'error|imatrix|importance' "$OUT/$t.quantize.log" | head -1)"
    rm -f "$f.part"
    continue
  fi
  [ -f "$f.part" ] && mv "$f.part" "$f"
  types=$(python3 -c "
import collections, sys
from gguf import GGUFReader
print(dict(collections.Counter(t.tensor_type.name for t in GGUFReader(sys.argv[1]).tensors)))" "$f")
  port=$((19000 + RANDOM % 1000))
  "$LLAMA_BIN/llama-server" -m "$f" -c 512 -t "$THREADS" -fa off --port "$port" -np 1 --no-warmup >"$OUT/$t.server.log" 2>&1 &
  spid=$!
  res=$(python3 - "$port" "$PROMPT" "$N" <<'PY'
import json, sys, time, urllib.request
base, prompt, n = f"http://127.0.0.1:{sys.argv[1]}", sys.argv[2], int(sys.argv[3])
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=900))
for _ in range(240):
    try:
        if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
            break
    except Exception:
        time.sleep(0.5)
ids = post("/tokenize", {"content": prompt, "add_special": False})["tokens"]
out = post("/completion", {"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1, "cache_prompt": False,
                           "ignore_eos": True, "return_tokens": True})
print(",".join(map(str, ids)) + " " + json.dumps(out["tokens"]))
PY
  ) || res="FAILED (llama-server: $(tail -1 "$OUT/$t.server.log"))"
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  case "$res" in
    FAILED*) echo "$t: $types | llama.cpp $res"; continue ;;
  esac
  ids=${res%% *}
  llama=${res#* }
  if ! ours=$("$SHARDLM" run --model "$f" --prompt-ids "$ids" --max-tokens "$N" --ignore-eos --threads "$THREADS" --json 2>"$OUT/$t.shardlm.log" \
    | python3 -c "import json,sys; print(json.load(sys.stdin)['output_ids'])"); then
    echo "$t: $types | shardlm FAILED: $(tail -1 "$OUT/$t.shardlm.log")"
    status=1
    continue
  fi
  verdict=$(python3 -c "
import ast, sys
a, b = ast.literal_eval(sys.argv[1]), ast.literal_eval(sys.argv[2])
k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
print('same' if k == len(a) else f'the first {k} of {len(a)} the same')" "$llama" "$ours")
  # Teacher-forced: shardlm's logits over llama.cpp's continuation; where its
  # top-1 differs from llama.cpp's token, how far below the top that token is
  # (a near-tie flips greedy decoding and everything after it).
  forced="$ids,$(python3 -c "import ast,sys; print(','.join(map(str, ast.literal_eval(sys.argv[1])[:-1])))" "$llama")"
  tf="(teacher-forced check failed)"
  if "$SHARDLM" run --model "$f" --prompt-ids "$forced" --max-tokens 1 --threads "$THREADS" --dump-logits "$OUT/$t.logits.safetensors" >/dev/null 2>&1; then
    tf=$(python3 - "$OUT/$t.logits.safetensors" "$ids" "$llama" <<'PY'
import ast, json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
name = next(k for k in hdr if k != "__metadata__")
info = hdr[name]
a, b = info["data_offsets"]
x = np.frombuffer(raw[8 + n + a:8 + n + b], dtype={"F32": np.float32}[info["dtype"]]).reshape(info["shape"][-2:])
p0, want = len(sys.argv[2].split(",")), ast.literal_eval(sys.argv[3])
rows = x[p0 - 1:p0 - 1 + len(want)]
same = sum(int(r.argmax() == w) for r, w in zip(rows, want))
gaps = [float(r.max() - r[w]) for r, w in zip(rows, want) if r.argmax() != w]
print(f"teacher-forced top-1 = llama.cpp's at {same}/{len(want)}" + (f", misses {max(gaps):.3f} below the top at most" if gaps else ""))
PY
    ) || true
  fi
  echo "$t: $types | llama.cpp $llama | shardlm $ours | $verdict | $tf"
done
exit $status
