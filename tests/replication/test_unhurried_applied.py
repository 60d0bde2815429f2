"""A leader's EntryApplied goes to the I/O thread without a wake-up when nothing waits for it (node.py, `_prompt`).

The apply thread answers the leader's own submits itself; what is left of EntryApplied (the
machine's applied position, sessions) is handed over with whatever wakes the I/O thread next.
These tests check that this saves the wake-up, that it is done only when nothing waits
(`ReplicaMachine.waits_for_applied`), and that nothing waiting is ever left behind it: reads,
entries queued behind, duplicates answered at EntryApplied, a machine that stays idle.
"""

from __future__ import annotations

import threading

from walkit.core.loglist import Position
from walkit.core.replica import LEADING
from walkit.core.batch import Session
from walkit.core import batch
from walkit.testing.processes import wait_until

from .test_node import leader_of
from tests.unit.test_review_grouped_apply import new_machine


def _count_wakes(node) -> list:
    """_count_wakes counts the wake-ups of the node's I/O thread (calls of its transport's `wake`)."""
    transport = node._loop.transport
    wake, count = transport.wake, [0]

    def counted() -> None:
        count[0] += 1
        wake()
    transport.wake = counted
    return count


def test_a_lone_leader_s_submits_cost_one_wake_up_each_not_two(nodes):
    leader = leader_of(nodes(1))
    leader.submit(b"w:1")                                   # settled: elected, first entry written
    wakes = _count_wakes(leader)
    for i in range(50):
        leader.submit(f"r{i}:1".encode())
    # Each submit wakes the I/O thread once; its EntryApplied rides along with the next submit.
    assert wakes[0] <= 60, f"{wakes[0]} wake-ups for 50 submits: EntryApplied woke the I/O thread too"


def test_an_idle_leader_s_machine_takes_the_last_entry_applied_without_any_other_event(nodes):
    leader = leader_of(nodes(1))
    for i in range(5):
        leader.submit(f"r{i}:1".encode())
    last = leader.applied
    # Nothing else happens: the tick of the I/O thread hands EntryApplied over (within tick_ms).
    wait_until(lambda: leader.core.applied == last and not leader.core._applying,
               message="the machine never took the last EntryApplied")


def test_a_read_barrier_right_after_a_submit_sees_that_submit(nodes):
    leader = leader_of(nodes(1))
    for i in range(30):
        leader.submit(f"r{i}:1".encode())
        applied = leader.applied
        assert leader.read_barrier() >= applied


def test_reads_and_submits_from_threads_all_complete(nodes):
    leader = leader_of(nodes(1))
    errors: list = []

    def submit(k: int) -> None:
        try:
            for i in range(40):
                leader.submit(f"t{k}-{i}:1".encode())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(40):
                leader.read_barrier()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=submit, args=(k,)) for k in range(4)] + [threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a submit or a read never completed"
    assert not errors
    assert leader.machine.value == 160


def _leading(core):
    core.role = LEADING
    return core


def test_waits_for_applied_says_what_waits():
    core = new_machine()
    assert core.waits_for_applied(), "a follower's machine always waits (reads, its reader)"
    core = _leading(new_machine())
    assert not core.waits_for_applied(), "a leader with nothing queued, read or duplicated waits for nothing"
    core._reads[1] = None
    assert core.waits_for_applied(), "a read waits for the applied position"
    core = _leading(new_machine())
    core._queue_entry(Position(1, 0), batch.encode([b"a"], [None], 100), [1])
    assert core.waits_for_applied(), "an entry queued behind the group being applied waits"
    core = _leading(new_machine())
    core._queue_entry(Position(1, 0), batch.encode([b"a"], [Session("c", 1)], 100), [1])
    core._next_apply()
    assert not core.waits_for_applied(), "an entry of new records only: the shell answers them all"
    core._queue_entry(Position(1, 1), batch.encode([b"a", b"b"], [Session("c", 1), None], 101), [2, 3])
    core._finish(Position(1, 0), [1], False)
    core._next_apply()
    assert core.waits_for_applied(), "a duplicate is answered by the machine at EntryApplied: it waits"
    core = _leading(new_machine())
    core._snapshot_requested = True
    assert core.waits_for_applied(), "a snapshot due between two entries waits"
