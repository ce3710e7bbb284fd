#!/usr/bin/env bash
# Real coding agents against `shardlm serve` on the default model, on a scratch
# git repository: the model is tiny, so this judges the protocol, not the edit.
#
#   scripts/agent-smoke.sh [--chat-template FILE|FAMILY] [aider] [codex]      (default: aider)
#
# --chat-template serves the model with another template (`shardlm serve
# --chat-template`), a file or a family of tests/fixtures/templates (e.g.
# qwen3_coder: Qwen3-Coder's XML tool calls), so the agents meet that family's
# prompt and tool-call format.
#
# aider (`aider-chat` from PyPI, in its own venv so its pinned `openai` does not
# meet the test suite's) speaks /v1/chat/completions; Codex CLI (`@openai/codex`
# from npm) speaks /v1/responses with a ~10K-token system prompt, so it gets a
# server with --context 32768 --rope-scaling yarn and takes minutes to prefill
# on two cores. Each passes when the agent exits 0, prints no API or protocol
# error, and the server counted its requests with none failed. Needs network
# to the package registries the first time ($SHARDLM_CACHE/agents keeps them).
# AGENT_LOG_DIR=DIR keeps the agent's output, the server log and its /metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARDLM="${SHARDLM:-${CARGO_TARGET_DIR:-target}/release/shardlm}"
[ -x "$SHARDLM" ] || cargo build --release -p shardlm >&2
CACHE="${SHARDLM_CACHE:-$HOME/.cache/shardlm}/agents"
SERVE_EXTRA=()
AGENTS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --chat-template)
            t=${2:?--chat-template needs a file or a family name}
            [ -f "$t" ] || t="tests/fixtures/templates/$t.jinja"
            [ -f "$t" ] || { echo "no template $2 (a file, or one of tests/fixtures/templates)" >&2; exit 2; }
            SERVE_EXTRA=(--chat-template "$t")
            shift 2 ;;
        *) AGENTS+=("$1"); shift ;;
    esac
done
[ ${#AGENTS[@]} -gt 0 ] || AGENTS=(aider)
WORK=$(mktemp -d)
SERVER_PID=""
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_server ARGS...: a server on a free port; sets PORT and SERVER_PID.
start_server() {
    PORT=$(free_port)
    "$SHARDLM" serve --port "$PORT" ${SERVE_EXTRA[@]+"${SERVE_EXTRA[@]}"} "$@" >"$WORK/serve.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
        sleep 0.2
    done
    cat "$WORK/serve.log" >&2
    echo "FAIL: the server did not come up" >&2
    exit 1
}

stop_server() { kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""; }

metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }

scratch_repo() {
    rm -rf "$WORK/repo" && mkdir "$WORK/repo"
    (cd "$WORK/repo" && git init -q && printf 'def add(a, b):\n    return a + b\n' >calc.py \
        && git add . && git -c user.email=ci@example.invalid -c user.name=ci commit -qm init)
}

# check NAME LOG RC: exit status, no protocol error in the agent's output, and
# the server saw requests and failed none.
check() {
    local name=$1 log=$2 rc=$3 total failed
    total=$(metric shardlm_requests_total)
    failed=$(metric shardlm_requests_failed_total)
    echo "$name: exit $rc, server requests $total, failed $failed" >&2
    if [ -n "${AGENT_LOG_DIR:-}" ]; then
        mkdir -p "$AGENT_LOG_DIR" && cp "$log" "$WORK/serve.log" "$AGENT_LOG_DIR/" \
            && curl -s "http://127.0.0.1:$PORT/metrics" >"$AGENT_LOG_DIR/metrics.txt"
    fi
    if [ "$rc" -ne 0 ] || [ "${total:-0}" -lt 1 ] || [ "${failed:-1}" -ne 0 ] \
        || grep -Eiq 'APIError|APIConnectionError|BadRequestError|InternalServerError|stream disconnected|Traceback' "$log"; then
        tail -40 "$log" >&2
        echo "FAIL: $name against shardlm serve" >&2
        exit 1
    fi
    echo "ok: $name finished against shardlm serve without a protocol error" >&2
}

run_aider() {
    if [ ! -x "$CACHE/aider-venv/bin/aider" ]; then
        python3 -m venv "$CACHE/aider-venv"
        "$CACHE/aider-venv/bin/pip" install -q aider-chat
    fi
    start_server --max-tokens-default 200
    scratch_repo
    local rc=0
    (cd "$WORK/repo" && timeout 600 "$CACHE/aider-venv/bin/aider" --model openai/smollm2-135m \
        --openai-api-base "http://127.0.0.1:$PORT/v1" --openai-api-key sk-none --yes-always \
        --no-show-model-warnings --no-check-update --no-analytics --no-auto-commits --no-pretty --no-stream \
        --edit-format whole --map-tokens 0 --message "Add a function sub(a, b) that returns a - b." calc.py) \
        </dev/null >"$WORK/aider.log" 2>&1 || rc=$?
    check aider "$WORK/aider.log" "$rc"
    stop_server
}

run_codex() {
    if [ ! -x "$CACHE/npm/node_modules/.bin/codex" ]; then
        mkdir -p "$CACHE/npm"
        (cd "$CACHE/npm" && npm install --silent @openai/codex)
    fi
    start_server --context 32768 --rope-scaling yarn --max-tokens-default 128
    scratch_repo
    mkdir -p "$WORK/codex-home"
    cat >"$WORK/codex-home/config.toml" <<TOML
model = "smollm2-135m"
model_provider = "shardlm"

[model_providers.shardlm]
name = "shardlm"
base_url = "http://127.0.0.1:$PORT/v1"
env_key = "SHARDLM_API_KEY"
wire_api = "responses"
TOML
    local rc=0
    (cd "$WORK/repo" && CODEX_HOME="$WORK/codex-home" SHARDLM_API_KEY=none timeout 1500 \
        "$CACHE/npm/node_modules/.bin/codex" exec --skip-git-repo-check \
        "Add a function sub(a, b) to calc.py that returns a - b.") </dev/null >"$WORK/codex.log" 2>&1 || rc=$?
    check codex "$WORK/codex.log" "$rc"
    stop_server
}

for agent in "${AGENTS[@]}"; do
    case "$agent" in
        aider) run_aider ;;
        codex) run_codex ;;
        *) echo "unknown agent $agent (aider or codex)" >&2; exit 2 ;;
    esac
done
