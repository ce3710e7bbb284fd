"""A rank that stays gone (issue 29): `serve --ranks 2 --replan-after 3`, rank 1
killed during a stream and killed again every time the launcher restarts it,
as a host that is down would be. After 3 s rank 0 re-plans the model onto its
own machine (it can hold SmolLM2), tells the launcher to retire rank 1, and
the interrupted stream continues with the text of an uninterrupted greedy run.

Starts its own two-rank servers, so it runs once (the single-process pass).
"""

import os
import signal
import threading
import time

import pytest

from conftest import start_server, stop_server
from test_reliability import rank_pid, stream_text, wait_ready

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
