"""Review of ReplicatedNode.hold_submits/release_submits: edge cases around close, step-down and threads."""

from __future__ import annotations

import threading

import pytest

from walkit.errors import NotLeader
from walkit.testing.processes import wait_until

from .test_node import io_thread_caught_up, leader_of, same_history


def held_after_one(nodes, first: bytes):
    """held_after_one is (the two nodes, the leader, a submit it holds) once the leader applied `first`."""
    group = nodes(2)
    leader = leader_of(group)
    leader.submit(first)
    leader.hold_submits()
    return group, leader, leader.submit_async(b"kept:1")


def test_release_after_close_neither_raises_nor_appends_the_kept_record(nodes):
    group, leader, kept = held_after_one(nodes, b"before:1")
    leader.close()
    leader.release_submits()                    # the KV server's call_soon may run after close
    with pytest.raises(NotLeader):
        kept.result(20)
    other = leader_of([n for n in group if n is not leader])
    other.submit(b"after:1")
    ids = [i for _, i in other.machine.log]
    assert "kept" not in ids, "a submit close failed was appended anyway"
    assert ids == ["before", "after"]


def test_a_step_down_between_hold_and_release_answers_the_kept_submit(nodes):
    group, leader, kept = held_after_one(nodes, b"a:1")
    leader.step_down()
    wait_until(lambda: not leader.is_leader, message="the leader never stepped down")
    leader.release_submits()
    try:
        kept.result(20)
        applied = True
    except NotLeader as exc:
        applied = False
        maybe = exc.maybe_in_log
    new = leader_of(group)
    new.submit(b"z:1")
    ids = same_history([n for n in group])
    if applied:
        assert ids.count("kept") == 1
    elif not maybe:
        assert "kept" not in ids, "a submit refused as never appended is in the log"


def test_another_threads_submit_waits_for_the_hold_and_then_completes(nodes):
    leader = leader_of(nodes(1))
    leader.hold_submits()
    results = []
    thread = threading.Thread(target=lambda: results.append(leader.submit(b"t:1", timeout=20)))
    thread.start()
    io_thread_caught_up(leader)
    assert results == []
    leader.release_submits()
    thread.join(20)
    assert results == [1]


def test_holds_from_two_threads_release_in_any_order(nodes):
    leader = leader_of(nodes(1))
    leader.hold_submits()
    a = leader.submit_async(b"a:1")
    done = threading.Event()

    def other() -> None:
        leader.hold_submits()
        leader.submit_async(b"b:1")
        leader.release_submits()
        done.set()
    thread = threading.Thread(target=other)
    thread.start()
    assert done.wait(20)
    thread.join(20)
    io_thread_caught_up(leader)
    assert not a.done()
    leader.release_submits()
    assert a.result(20) in (1, 2)
    assert leader.submit(b"c:1", timeout=20) == 3
