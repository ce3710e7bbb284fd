"""Starts one `shardlm serve` for the session and hands out SDK clients.

Environment:
  SHARDLM_BIN         the binary (default: target/release/shardlm)
  SHARDLM_SERVE_ARGS  extra flags, e.g. "--ranks 2 --strategy tensor"
"""

import os
import shlex
import socket
import subprocess
import time

import anthropic
import httpx
import openai
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
API_KEY = "test-key-4f1c"
MODEL = "smollm2-test"
BODY_LIMIT = 2_000_000


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, port, proc, log=None):
        self.port = port
        self.proc = proc
        self.log = log
        self.base = f"http://127.0.0.1:{port}"

    def metrics(self):
        """`/metrics` as {name: value} for unlabelled samples."""
        text = httpx.get(self.base + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.split()
                out[name] = float(value)
        return out


def start_server(*extra):
    """Starts `shardlm serve` with the test flags, SHARDLM_SERVE_ARGS, then `extra`
    (later flags win), and waits for /health."""
    binary = os.environ.get("SHARDLM_BIN", os.path.join(ROOT, "target", "release", "shardlm"))
    port = _free_port()
    args = [binary, "serve", "--port", str(port), "--api-key", API_KEY,
            "--served-model-name", MODEL, "--sse-keepalive-ms", "100",
            "--max-body-bytes", str(BODY_LIMIT)]
    args += shlex.split(os.environ.get("SHARDLM_SERVE_ARGS", ""))
    args += list(extra)
    log = open(os.path.join(ROOT, "target", f"serve-test-{port}.log"), "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    srv = Server(port, proc, log)
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None:
            log.close()
            raise RuntimeError(f"shardlm serve exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(srv.base + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            proc.kill()
            log.close()
            raise RuntimeError("shardlm serve did not become healthy in 180 s")
        time.sleep(0.2)
    return srv


def stop_server(srv):
    srv.proc.terminate()
    try:
        srv.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
    srv.log.close()


@pytest.fixture(scope="session")
def server():
    srv = start_server()
    yield srv
    stop_server(srv)


@pytest.fixture
def spawn_server():
    """Starts extra servers with their own flags (`spawn_server("--max-concurrency", "4")`);
    they stop when the test ends."""
    started = []

    def spawn(*extra):
        srv = start_server(*extra)
        started.append(srv)
        return srv

    yield spawn
    for srv in started:
        stop_server(srv)


@pytest.fixture(scope="session")
def oai(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def claude(server):
    return anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=120)
