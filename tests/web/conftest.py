"""Starts `shardlm serve` for the page tests and a headless Chromium driving it.

Environment:
  SHARDLM_BIN         the binary (default: target/release/shardlm)
  SHARDLM_WEB_ARGS    serve flags (default: "--ranks 2")
Skips, saying why, without chromium, chromedriver or selenium.
Screenshots of each step go to target/web-screenshots/.
"""

import os
import shlex
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHOTS = os.path.join(ROOT, "target", "web-screenshots")
API_KEY = "web-key-7d2e"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(base):
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Server:
    def __init__(self, base, proc, log):
        self.base, self.proc, self.log = base, proc, log


def start_server(*extra):
    binary = os.environ.get("SHARDLM_BIN", os.path.join(ROOT, "target", "release", "shardlm"))
    if not os.path.exists(binary):
        pytest.skip(f"{binary} is not built (cargo build --release -p shardlm)")
    port = _free_port()
    args = [binary, "serve", "--port", str(port), "--max-tokens-default", "24"]
    args += shlex.split(os.environ.get("SHARDLM_WEB_ARGS", "--ranks 2"))
    args += list(extra)
    os.makedirs(os.path.join(ROOT, "target"), exist_ok=True)
    log = open(os.path.join(ROOT, "target", f"web-test-{port}.log"), "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while not _healthy(base):
        if proc.poll() is not None:
            raise RuntimeError(f"shardlm serve exited with {proc.returncode}; see {log.name}")
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("shardlm serve did not become healthy in 180 s")
        time.sleep(0.2)
    return Server(base, proc, log)


def stop_server(srv):
    srv.proc.terminate()
    try:
        srv.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
    srv.log.close()


@pytest.fixture(scope="session")
def server():
    srv = start_server()
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def keyed_server():
    srv = start_server("--api-key", API_KEY)
    yield srv
    stop_server(srv)


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium)")
    chrome, driver_bin = _chromium(), shutil.which("chromedriver")
    if not chrome or not driver_bin:
        pytest.skip("headless Chromium is not here (apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,900"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(driver_bin), options=opts)
    d.set_script_timeout(30)
    yield d
    d.quit()


@pytest.fixture
def shot(browser, request):
    """shot("step") saves target/web-screenshots/<test>-<n>-<step>.png."""
    os.makedirs(SHOTS, exist_ok=True)
    n = [0]

    def take(step):
        n[0] += 1
        browser.save_screenshot(os.path.join(SHOTS, f"{request.node.name}-{n[0]}-{step}.png"))

    return take
