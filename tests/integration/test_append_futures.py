"""Append Futures (walkit.futures.LightFuture) with real bookie processes and threads that block on them.

A LightFuture builds its Condition only once a thread waits, so the races that matter are a
thread starting to wait just as the I/O thread completes or fails the append. The adversaries:
threads blocked in `append()` (result()) and in `concurrent.futures.wait` while a bookie is
SIGKILLed (the writer changes its ensemble), and while the only bookies a writer may use are
frozen with SIGSTOP (every append must fail, and every waiting thread be told).
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

import walkit
from walkit.errors import WalkitError
from walkit.local import LocalCluster

from .test_log_handover import stopped

pytestmark = pytest.mark.slow


def _payload(thread: int, i: int) -> bytes:
    return b"t%d-%06d" % (thread, i) + b"x" * 200


@pytest.mark.parametrize("kill_after", [50, 400])
def test_threads_blocked_on_appends_all_return_through_a_bookie_kill_and_every_ack_reads_back(tmp_path, kill_after):
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="files") as local, \
            walkit.Client(local.metadata_url, request_timeout=3.0) as client:
        writer = client.create_ledger(3, 2, 2)
        acked: dict[int, bytes] = {}
        lock = threading.Condition()                   # notified as acknowledgements arrive
        started = threading.Barrier(5)

        def blocking(thread: int) -> None:              # append(): each call waits in result()
            started.wait()
            for i in range(600):
                data = _payload(thread, i)
                entry_id = writer.append(data, timeout=60)
                with lock:
                    acked[entry_id] = data
                    lock.notify_all()

        def waiting() -> None:                          # append_async + concurrent.futures.wait
            started.wait()
            for round_ in range(30):
                sent = [(f, _payload(9, round_ * 40 + j)) for j, f in
                        enumerate(writer.append_async(_payload(9, round_ * 40 + j)) for j in range(40))]
                done, pending = concurrent.futures.wait([f for f, _ in sent], timeout=60)
                assert not pending
                with lock:
                    acked.update((f.result(), data) for f, data in sent)
                    lock.notify_all()

        threads = [threading.Thread(target=blocking, args=(t,)) for t in range(3)] + [threading.Thread(target=waiting)]
        for thread in threads:
            thread.start()
        started.wait()
        victim = writer.metadata.current_ensemble[0]
        with lock:                                      # kill once this many appends were acknowledged
            assert lock.wait_for(lambda: len(acked) >= kill_after, timeout=60)
        local.kill_bookie(local.addresses.index(victim))
        for thread in threads:
            thread.join(120)
            assert not thread.is_alive(), "a thread blocked on an append Future never returned"
        assert len(acked) == 3 * 600 + 30 * 40
        assert victim not in writer.metadata.current_ensemble
        writer.close()
        with walkit.Client(local.metadata_url) as other:
            reader = other.open_ledger(writer.ledger_id)
            assert reader.last_add_confirmed == len(acked) - 1
            assert {e.entry_id: e.payload for e in reader.read()} == acked


def test_threads_waiting_on_appends_are_told_when_every_bookie_of_the_writer_is_frozen(tmp_path):
    with LocalCluster(bookies=2, data_dir=str(tmp_path / "cluster"), storage="files") as local, \
            walkit.Client(local.metadata_url, request_timeout=2.0, add_timeout=2.0) as client:
        writer = client.create_ledger(2, 2, 2)                 # no spare bookie: nowhere to go
        assert writer.append(b"before") == 0
        outcomes: list = []
        lock = threading.Lock()
        entered = threading.Barrier(5)

        def blocking() -> None:
            entered.wait()
            try:
                outcomes.append(writer.append(b"frozen", timeout=60))
            except WalkitError as exc:
                with lock:
                    outcomes.append(exc)

        with stopped(local, local.addresses[0]), stopped(local, local.addresses[1]):
            threads = [threading.Thread(target=blocking) for _ in range(4)]
            for thread in threads:
                thread.start()
            entered.wait()
            futures = [writer.append_async(b"async %d" % i) for i in range(20)]
            done, pending = concurrent.futures.wait(futures, timeout=60)
            for thread in threads:
                thread.join(60)
                assert not thread.is_alive(), "a thread blocked in append() was never woken"
        assert not pending
        assert all(isinstance(f.exception(), WalkitError) for f in futures)
        assert len(outcomes) == 4 and all(isinstance(o, WalkitError) for o in outcomes)
        assert writer.last_add_confirmed == 0                   # nothing confirmed while frozen
