"""benchmarks/latency_floor.py's bare servers: they answer, and they fail loudly instead of hanging.

The floor is the baseline walkit's one-append-in-flight latency is compared with, so a floor
that hangs on a dead server, or leaves its server processes behind, would cost a benchmark run
its result and the machine its processes.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import time

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
SMALL = 1 << 20                               # each server's file: the tests write little


@pytest.fixture
def latency_floor(monkeypatch):
    monkeypatch.syspath_prepend(os.path.abspath(BENCHMARKS))     # the spawned servers import it too
    return importlib.import_module("latency_floor")


@pytest.mark.parametrize("transport", ["zmq", "tcp"])
def test_the_floor_answers_every_entry_on_both_paths_and_its_servers_end_with_it(latency_floor, tmp_path, transport):
    floor = latency_floor.Floor(str(tmp_path), sync=True, transport=transport, preallocate=SMALL)
    try:
        for _ in range(6):                   # each server gets its turns as first and second copy
            floor.round_trip(b"x" * 1024)
            floor.handed_off(b"y" * 1024)
        assert floor.entry == 12
    finally:
        floor.close()
    assert [process.exitcode for process in floor.processes] == [0, 0, 0]     # stopped, not killed or gone
    assert len(list(tmp_path.glob("floor-*.log"))) == 3                        # one file per server


@pytest.mark.parametrize("transport, error, says", [("zmq", TimeoutError, "did not answer"),
                                                    ("tcp", ConnectionError, "connection failed")])
def test_a_server_that_dies_fails_the_round_trip_instead_of_hanging(latency_floor, tmp_path, monkeypatch,
                                                                    transport, error, says):
    """ZeroMQ hides a dead peer, so the round trip times out; a TCP connection says it was closed."""
    floor = latency_floor.Floor(str(tmp_path), sync=True, transport=transport, preallocate=SMALL)
    monkeypatch.setattr(latency_floor, "TIMEOUT_S", 2)                 # started: now wait 2 s, not 10, for answers
    try:
        floor.handed_off(b"x")
        floor.processes[1].kill()
        floor.processes[1].join()
        began = time.monotonic()
        with pytest.raises(error, match=says):
            for _ in range(3):               # entries 1 and 2 both have a copy on server 1
                floor.handed_off(b"x")
        assert time.monotonic() - began < 3 * latency_floor.TIMEOUT_S
    finally:
        floor.close()
    assert not any(process.is_alive() for process in floor.processes)


@pytest.mark.parametrize("transport", ["zmq", "tcp"])
def test_a_server_that_cannot_start_is_reported_at_once_and_nothing_is_left_running(latency_floor, tmp_path,
                                                                                    transport):
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="exited before serving"):
        latency_floor.Floor(str(tmp_path / "missing"), sync=True, transport=transport,
                            preallocate=SMALL)                    # it cannot create its file
    assert time.monotonic() - began < latency_floor.TIMEOUT_S
    assert multiprocessing.active_children() == []


def test_an_unknown_transport_is_refused(latency_floor, tmp_path):
    with pytest.raises(ValueError, match="'zmq' or 'tcp'"):
        latency_floor.Floor(str(tmp_path), sync=True, transport="udp")


def test_a_tcp_server_whose_client_vanishes_says_so_in_its_exit_code(latency_floor, tmp_path):
    """Exit code 0 means the server read b"stop"; a connection that just ends is CLIENT_GONE."""
    floor = latency_floor.Floor(str(tmp_path), sync=False, transport="tcp", preallocate=SMALL)
    try:
        floor.round_trip(b"x")
        floor.links.close()                  # no b"stop"
        for process in floor.processes:
            process.join(latency_floor.TIMEOUT_S)
        assert [process.exitcode for process in floor.processes] == [latency_floor.CLIENT_GONE] * 3
    finally:
        floor.close()


def test_a_stopped_tcp_server_fails_a_large_send_instead_of_blocking_it(latency_floor, tmp_path, monkeypatch):
    """A payload larger than the sockets' buffers blocks in `sendall` while its server is stopped:
    the kernel's send timeout ends it (ZeroMQ would queue it instead)."""
    monkeypatch.setattr(latency_floor, "TIMEOUT_S", 1)                 # before connecting: the sockets take it
    payload = b"x" * (32 << 20)
    floor = latency_floor.Floor(str(tmp_path), sync=False, servers=1, write_quorum=1, transport="tcp",
                                preallocate=48 << 20)
    try:
        floor.handed_off(b"x")
        os.kill(floor.processes[0].pid, signal.SIGSTOP)
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="did not take a request"):
            floor.handed_off(payload)
        assert time.monotonic() - began < 10 * latency_floor.TIMEOUT_S
    finally:
        floor.processes[0].kill()            # stopped: it would only be killed after close() waited for it
        floor.close()
        for log in tmp_path.glob("floor-*.log"):
            log.unlink()
    assert not floor.processes[0].is_alive()
