#!/usr/bin/env bash
# Does llama.cpp load the GGUF files `shardlm quantize` writes from HF
# checkpoints, and decode them as shardlm does? For each tiny fixture named
# (default: the MoE ones llama.cpp's graphs accept, mixtral and qwen2_moe),
# this copies it with a placeholder BPE tokenizer.json (`<unk> <s> </s> t3 t4
# …`, no merges: the fixtures have none, and llama.cpp will not load a GGUF
# without a vocabulary), writes it as a Q8_0 GGUF with `shardlm quantize`
# (another type with TO=f16, q4_0, ...),
# and compares 12 greedy tokens after a fixed 10-token prompt: llama-server
# b11434 `/completion` (top_k 1) against `shardlm run --prompt-ids` on the
# same file (exit status 1 only if llama.cpp cannot load or run a file). Not
# in CI (llama.cpp takes minutes to build);
# `scripts/bench-vs-llamacpp.sh --llama-server` builds the server.
#
# Usage: scripts/hf-gguf-llamacpp.sh [FIXTURE ...]
# Environment: SHARDLM (default target/release/shardlm), LLAMA_SERVER, TO (default q8_0)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARDLM="${SHARDLM:-target/release/shardlm}"
LLAMA_SERVER="${LLAMA_SERVER:-$(scripts/bench-vs-llamacpp.sh --llama-server)}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
IDS=17,230,5,999,64,3,512,77,300,1
TO="${TO:-q8_0}"
status=0
for fx in "${@:-mixtral qwen2_moe}"; do
  for a in $fx; do
    cp -r "tests/fixtures/tiny/$a" "$TMP/$a"
    python3 - "$TMP/$a" <<'PY'
import json, sys
d = sys.argv[1]
n = json.load(open(f"{d}/config.json"))["vocab_size"]
toks = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, n)]
json.dump({"version": "1.0",
           "added_tokens": [{"id": i, "content": toks[i], "special": True} for i in range(3)],
           "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(toks)}, "merges": []}},
          open(f"{d}/tokenizer.json", "w"))
PY
    "$SHARDLM" quantize "$TMP/$a" "$TMP/$a.gguf" --to "$TO" 2>/dev/null
    port=$((19000 + RANDOM % 1000))
    "$LLAMA_SERVER" -m "$TMP/$a.gguf" -c 256 -t 1 --port "$port" -np 1 --no-warmup >"$TMP/$a.log" 2>&1 &
    spid=$!
    llama=$(python3 - "$port" "$IDS" <<'PY'
import json, sys, time, urllib.request
base, ids = f"http://127.0.0.1:{sys.argv[1]}", [int(x) for x in sys.argv[2].split(",")]
for _ in range(120):
    try:
        if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
            break
    except Exception:
        time.sleep(0.5)
body = {"prompt": ids, "n_predict": 12, "temperature": 0, "top_k": 1, "cache_prompt": False,
        "ignore_eos": True, "return_tokens": True}
req = urllib.request.Request(base + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=600))["tokens"])
PY
    ) || llama="(llama-server failed: $(tail -1 "$TMP/$a.log"))"
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    ours=$("$SHARDLM" run --model "$TMP/$a.gguf" --prompt-ids "$IDS" --max-tokens 12 --json 2>/dev/null \
      | python3 -c "import json,sys; print(json.load(sys.stdin)['output_ids'])")
    # Greedy tokens of a tiny random model can sit on near-ties (the fixtures'
    # goldens record last-logit margins of 0.01), where the two engines'
    # accumulation orders may pick differently: report the common prefix.
    verdict=$(python3 -c "
import ast, sys
a, b = sys.argv[1], sys.argv[2]
if not a.startswith('['):
    print('llama.cpp FAILED'); sys.exit()
a, b = ast.literal_eval(a), ast.literal_eval(b)
k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
print('same' if k == len(a) else f'the first {k} of {len(a)} the same')" "$llama" "$ours")
    case "$verdict" in *FAILED*) status=1 ;; esac
    echo "$a ($TO): llama.cpp $llama | shardlm $ours | $verdict"
  done
done
exit $status
