"""A rank that stays gone (issue 29): `serve --ranks 2 --replan-after 3`, rank 1
killed during a stream and killed again every time the launcher restarts it,
as a host that is down would be. After 3 s rank 0 re-plans the model onto its
own machine (it can hold SmolLM2), tells the launcher to retire rank 1, and
the interrupted stream continues with the text of an uninterrupted greedy run.

With three ranks (rank 2 gone for good) the cluster re-plans onto the two
survivors instead: the launcher restarts rank 1 into a world of two, each
survivor loads its new shard, the stream continues with the same text, and
`/cluster` and `/health` list the two ranks of the new world.

Starts its own multi-rank servers, so it runs once (the single-process pass).
"""

import os
import signal
import threading
import time

import pytest

import httpx

from conftest import start_server, stop_server
from test_reliability import H, health, rank_pid, stream_text, wait_ready

pytestmark = pytest.mark.skipif(bool(os.environ.get("SHARDLM_SERVE_ARGS")),
                                reason="starts its own --ranks 2 servers; runs in the single-process pass")


def keep_killing(srv, rank, stop):
    """Kills `rank` whenever it (re)appears under the launcher, until `stop` is set."""
    while not stop.is_set():
        try:
            os.kill(rank_pid(srv, rank), signal.SIGKILL)
        except (AssertionError, ProcessLookupError):
            pass
        time.sleep(0.05)


def test_a_rank_that_stays_gone_is_replanned_away():
    srv = start_server("--ranks", "2", "--strategy", "pipeline", "--replan-after", "3")
    try:
        reference = stream_text(srv)
        stop = threading.Event()
        killer = threading.Thread(target=keep_killing, args=(srv, 1, stop))
        text = stream_text(srv, kill_after=10, on_kill=killer.start)
        stop.set()
        killer.join()
        assert text == reference
        wait_ready(srv, limit=30)
        # Still serving, alone: a new request succeeds and rank 1 stays retired.
        assert stream_text(srv) == reference
        time.sleep(1.5)
        with pytest.raises(AssertionError):
            rank_pid(srv, 1)
    finally:
        log = srv.log.name
        stop_server(srv)
    text = open(log).read()
    assert "re-planned the model onto this machine alone" in text, text[-3000:]
    assert "retired by rank 0" in text, text[-3000:]


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_three_ranks_replan_onto_their_two_survivors(strategy):
    # --tp-exact: a 2-way split then gives the 3-way split's text (a plain
    # tensor split sums its partial results in another order per width).
    exact = ["--tp-exact"] if strategy == "tensor" else []
    srv = start_server("--ranks", "3", "--strategy", strategy, *exact, "--replan-after", "3")
    stop = threading.Event()
    try:
        reference = stream_text(srv)
        killer = threading.Thread(target=keep_killing, args=(srv, 2, stop))
        text = stream_text(srv, kill_after=10, on_kill=killer.start)
        stop.set()
        killer.join()
        assert text == reference
        h = wait_ready(srv, limit=90)
        assert [r["rank"] for r in h["ranks"]] == [0, 1], h
        assert h["strategy"] == strategy, h
        cluster = httpx.get(srv.base + "/cluster", headers=H, timeout=10).json()
        assert cluster["world_size"] == 2, cluster
        assert [r["rank"] for r in cluster["ranks"]] == [0, 1], cluster
        # Still serving, on two ranks: a new request gives the same text.
        assert stream_text(srv) == reference
        assert health(srv)[0] == 200
    finally:
        stop.set()
        log = srv.log.name
        stop_server(srv)
    text = open(log).read()
    assert "re-planning the model onto the 2 survivors" in text, text[-3000:]
    assert "restarting the others into a world of 2" in text, text[-3000:]
    assert "retired by rank 0" in text, text[-3000:]
