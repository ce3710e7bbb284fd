"""A server whose rank 1 runs on another "host": two network namespaces
(scripts/netns/setup.sh, two veth cables on subnets of their own), the
cluster started by `shardlm launch --hostfile` inside host 1, with rank 1
reached over the launcher's ssh channel (scripts/netns/ssh.sh, an ssh that
runs the command in the host's namespace and fails like ssh while the host has
no carrier).

- Every cable of rank 1 down for 20 s during a stream, then back: the server
  stays up, /health says degraded naming rank 1, a new request succeeds
  within 30 s of the cables coming back, and the stream continues with the
  text of an uninterrupted greedy run (pipeline and tensor).
- One cable down for 20 s (the one the heartbeats' main address is on): the
  connections go on over the other cable; no rank is lost or restarted.
- kill -9 of the remote rank mid-stream: the launcher restarts it over ssh,
  it rejoins, and the stream continues with the same text.

Needs root and `ip netns` with veth devices; skipped with the reason otherwise.
"""

import contextlib
import ctypes
import json
import os
import subprocess
import threading
import time
import uuid

import httpx
import pytest

from conftest import API_KEY, MODEL, ROOT, _free_port
# The same request, stream reader and /health probe as the single-machine tests.
from test_reliability import BODY, H, health, stream_text

pytestmark = pytest.mark.skipif(bool(os.environ.get("SHARDLM_SERVE_ARGS")),
                                reason="starts its own clusters; runs in the single-process pass")

SETUP = os.path.join(ROOT, "scripts", "netns", "setup.sh")
TEARDOWN = os.path.join(ROOT, "scripts", "netns", "teardown.sh")
SSH = os.path.join(ROOT, "scripts", "netns", "ssh.sh")
CLONE_NEWNET = 0x40000000
OUTAGE = 20.0


def _why_no_netns():
    """None when this machine can make namespaces with veth cables, else why not."""
    if os.geteuid() != 0:
        return "needs root for `ip netns`"
    ns = f"shardlm-probe-{os.getpid()}"
    try:
        r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
        if r.returncode != 0:
            return f"`ip netns add` said: {r.stderr.strip()}"
        r = subprocess.run(["ip", "-n", ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return f"no veth devices: {r.stderr.strip()}"
    except FileNotFoundError:
        return "`ip` is not installed (iproute2)"
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return None


WHY = _why_no_netns()
if WHY:
    pytestmark = [pytestmark, pytest.mark.skip(reason=f"netns tests skipped: {WHY}")]

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


@contextlib.contextmanager
def inside(ns):
    """Runs the block (and the threads and processes it starts) in namespace `ns`."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
        yield
    finally:
        if _libc.setns(own, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back to the test's own namespace")
        os.close(own)
        os.close(target)


class Hosts:
    """Two namespaces {prefix}1, {prefix}2 joined by two cables (`--links 2 --plain`)."""

    def __init__(self):
        self.prefix = f"slm{uuid.uuid4().hex[:6]}-"
        r = subprocess.run(["bash", SETUP, "--prefix", self.prefix, "--links", "2", "--plain", "2"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.close()
            raise RuntimeError(f"scripts/netns/setup.sh failed: {r.stdout}{r.stderr}")
        self.ns = [f"{self.prefix}1", f"{self.prefix}2"]

    def hostfile(self, path):
        hosts = [{"name": self.ns[i], "addr": f"10.78.18.{i + 1}",
                  "links": [{"addrs": [f"10.78.18.{i + 1}"]}, {"addrs": [f"10.79.18.{i + 1}"]}]}
                 for i in range(2)]
        with open(path, "w") as f:
            json.dump({"hosts": hosts}, f)

    def cables(self, up, which=(1, 2)):
        """Takes rank 1's end of cables `which` down (or up)."""
        for k in which:
            r = subprocess.run(["ip", "-n", self.ns[1], "link", "set", f"l{k}h1", "up" if up else "down"],
                               capture_output=True, text=True)
            assert r.returncode == 0, f"ip link set l{k}h1: {r.stderr}"

    def close(self):
        subprocess.run(["bash", TEARDOWN, "--prefix", self.prefix, "--quiet"], capture_output=True)


@pytest.fixture
def hosts():
    h = Hosts()
    try:
        yield h
    finally:
        h.close()


class Cluster:
    def __init__(self, proc, port, log, hosts):
        self.proc, self.port, self.log, self.hosts = proc, port, log, hosts
        self.base = f"http://127.0.0.1:{port}"

    def text(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()


def start_cluster(hosts, strategy, tmp_path):
    """`shardlm launch --hostfile … -- serve …` in host 1 (call inside `inside(ns1)`)."""
    binary = os.environ.get("SHARDLM_BIN", os.path.join(ROOT, "target", "release", "shardlm"))
    hf = tmp_path / "hosts.json"
    hosts.hostfile(hf)
    port = _free_port()
    args = [binary, "launch", "--hostfile", str(hf), "--ssh", SSH, "--port", "7000", "--",
            "serve", "--port", str(port), "--api-key", API_KEY, "--served-model-name", MODEL,
            "--sse-keepalive-ms", "100", "--strategy", strategy, "--threads", "1"]
    log = open(os.path.join(ROOT, "target", f"netns-test-{port}.log"), "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    c = Cluster(proc, port, log, hosts)
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"shardlm launch exited with {proc.returncode}: {c.text()[-3000:]}")
        try:
            if httpx.get(c.base + "/health", timeout=2).status_code == 200:
                return c
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            stop_cluster(c)
            raise RuntimeError(f"the cluster did not become healthy in 180 s: {c.text()[-3000:]}")
        time.sleep(0.2)


def stop_cluster(c):
    c.proc.terminate()
    try:
        c.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        c.proc.kill()
        c.proc.wait()
    c.log.close()


def remote_rank_pid(c):
    """The pid of rank 1 (a shardlm process in host 2 with SHARDLM_RANK=1), or None."""
    out = subprocess.run(["ip", "netns", "pids", c.hosts.ns[1]], capture_output=True, text=True).stdout
    for pid in out.split():
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if b"SHARDLM_RANK=1" in env and os.path.basename(exe).startswith("shardlm"):
            return int(pid)
    return None


def watch_health(c, seen, seconds):
    """Records the first non-200 /health answer within `seconds` (in a thread)."""
    def run():
        end = time.time() + seconds
        while time.time() < end:
            try:
                code, h = health(c)
            except httpx.HTTPError:  # the cluster was stopped meanwhile
                return
            if code != 200:
                seen.append((code, h))
                return
            time.sleep(0.05)
    threading.Thread(target=run, daemon=True).start()


def wait_ready(c, limit):
    deadline = time.time() + limit
    h = {}
    while time.time() < deadline:
        code, h = health(c)
        if code == 200:
            return h
        time.sleep(0.1)
    raise AssertionError(f"not ready within {limit} s: {h}\n{c.text()[-3000:]}")


def a_new_request(c):
    return httpx.post(c.base + "/v1/chat/completions", headers=H, timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0})


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_every_cable_down_for_20_s_then_back(hosts, strategy, tmp_path):
    with inside(hosts.ns[0]):
        c = start_cluster(hosts, strategy, tmp_path)
        try:
            expected = stream_text(c)
            seen, back = [], []

            def cut():
                hosts.cables(up=False)
                watch_health(c, seen, OUTAGE)

                def restore():
                    time.sleep(OUTAGE)
                    hosts.cables(up=True)
                    back.append(time.time())
                threading.Thread(target=restore, daemon=True).start()

            got = stream_text(c, kill_after=15, on_kill=cut)
            assert back, "the stream ended before the cables came back"
            assert got == expected
            wait_ready(c, 30 - (time.time() - back[0]))
            assert seen and seen[0][0] == 503 and seen[0][1]["status"] == "degraded", seen
            assert "rank 1" in seen[0][1]["reason"] or "peer 1" in seen[0][1]["reason"], seen
            r = a_new_request(c)
            assert r.status_code == 200 and time.time() - back[0] < 30, (r.text, time.time() - back[0])
            h = health(c)[1]
            assert h["rank_losses"] >= 1 and h["cluster_reforms"] >= 1, h
            assert c.proc.poll() is None
        finally:
            stop_cluster(c)


def test_one_cable_down_for_20_s_is_not_a_lost_rank(hosts, tmp_path):
    """Cable 1 carries the hosts' main addresses (heartbeats and, here, the
    small messages); with it down the connections continue over cable 2 and
    the heartbeats still arrive there, so no rank is called hung."""
    with inside(hosts.ns[0]):
        c = start_cluster(hosts, "tensor", tmp_path)
        try:
            expected = stream_text(c)
            pid = remote_rank_pid(c)
            seen = []

            def cut():
                hosts.cables(up=False, which=(1,))
                watch_health(c, seen, OUTAGE)
            t0 = time.time()
            got = stream_text(c, kill_after=15, on_kill=cut)
            assert got == expected
            time.sleep(max(0.0, OUTAGE - (time.time() - t0)))
            hosts.cables(up=True, which=(1,))
            assert not seen, f"degraded with one cable left: {seen}"
            h = health(c)[1]
            assert h["status"] == "ready" and h["rank_losses"] == 0, h
            assert remote_rank_pid(c) == pid, "rank 1 was restarted"
            assert "is hung" not in c.text(), c.text()[-3000:]
            assert a_new_request(c).status_code == 200
        finally:
            stop_cluster(c)


def test_a_killed_remote_rank_is_restarted_over_ssh(hosts, tmp_path):
    with inside(hosts.ns[0]):
        c = start_cluster(hosts, "pipeline", tmp_path)
        try:
            expected = stream_text(c)
            old = remote_rank_pid(c)
            assert old, "no rank 1 in host 2"
            killed = []

            def kill():
                os.kill(old, 9)
                killed.append(time.time())
            got = stream_text(c, kill_after=15, on_kill=kill)
            assert got == expected
            wait_ready(c, 30 - (time.time() - killed[0]))
            r = a_new_request(c)
            assert r.status_code == 200 and time.time() - killed[0] < 30
            new = remote_rank_pid(c)
            assert new and new != old, (old, new)
            log = c.text()
            assert f"ssh {hosts.ns[1]}) exited with status 137; restarting it" in log, log[-3000:]
            assert f"ssh {hosts.ns[1]}) started again" in log, log[-3000:]
            assert "cluster re-formed" in log, log[-3000:]
            assert health(c)[1]["cluster_reforms"] >= 1
        finally:
            stop_cluster(c)
