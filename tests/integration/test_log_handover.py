"""The handover a new user broke in minutes (issue 12), with real bookie processes and SIGSTOP.

A writer with an append in flight rolls; one bookie of the ledger holding that append is
stopped (SIGSTOP), so the append cannot be acknowledged and the rolled-over ledger cannot close.
Another process opens the log and appends. Then the bookie continues (SIGCONT).

Before the fix the new writer recovered only the last two ledgers, so the held append was
acknowledged later in a ledger nobody had recovered: the new writer (a KV leader replaying the
log) never saw it. Now opening recovers every unclosed ledger, so the held append ends one of
two ways, both of them BookKeeper's: recovery found it on the bookies that stored it and closed
the ledger with it, so the stopped bookie's late acknowledgement completes it at a position
before the new writer's records, where every reader sees it; or it fails with LedgerFenced.
Everything the old writer still had queued fails with LedgerFenced (its next roll, its next
ledger), acknowledgements arrive in log order, and a follower reads every acknowledged record
exactly once, in order.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

import walkit
from walkit.errors import LedgerFenced, WalkitError
from walkit.local import LocalCluster
from tests.support import pause

from .helpers import wait_until

pytestmark = pytest.mark.slow

QUORUMS = dict(ensemble=3, write_quorum=3, ack_quorum=3)


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        yield cluster


class Follower:
    """Follower tails the log in a thread and keeps every record it reads."""

    def __init__(self, client: walkit.Client, name: str) -> None:
        self.records: list[tuple[walkit.Position, bytes]] = []
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, args=(client, name), daemon=True)
        self.thread.start()

    def _run(self, client, name) -> None:
        try:
            for record in client.read_log(name, follow=True, poll=0.2):
                self.records.append((record.position, record.payload))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def saw(self, payload: bytes) -> bool:
        return any(p == payload for _, p in self.records)


def stopped(cluster: LocalCluster, address: str):
    """stopped is a context manager that holds a bookie process with SIGSTOP, then SIGCONT.

    The bookie is never held inside a write to the metadata file, whose lock would stall every
    other process's metadata writes (tests.support.pause): the writer's rolls and the new
    writer's open must go on while it is held.
    """
    return pause.paused(cluster.pid(cluster.addresses.index(address)), cluster.metadata_url)


def completion_order(futures: list[Future]) -> list:
    """completion_order records, in the order they complete, the positions of successful appends."""
    order: list = []
    lock = threading.Lock()

    def done(future: Future) -> None:
        if future.exception() is None:
            with lock:
                order.append(future.result())
    for future in futures:
        future.add_done_callback(done)
    return order


def check_follower(follower: Follower, acked: list[tuple[walkit.Position, bytes]]) -> None:
    positions = [p for p, _ in follower.records]
    assert positions == sorted(set(positions)), "the follower read a record twice or out of order"
    seen = dict(follower.records)
    for position, payload in acked:
        assert seen.get(position) == payload, f"the follower never read acknowledged {payload!r} at {position}"


def test_manual_rolls_with_an_append_held_end_with_the_old_append_fenced(cluster):
    url = cluster.metadata_url
    with walkit.Client(url, add_timeout=60) as old_client, walkit.Client(url, add_timeout=1) as new_client, \
            walkit.Client(url) as reader_client:
        old = old_client.open_log("x", **QUORUMS)
        first = old.append(b"r0")
        follower = Follower(reader_client, "x")
        victim = old_client.ledger_metadata(first.ledger_id).current_ensemble[0]
        with stopped(cluster, victim):
            held = old.append_async(b"r1")                  # held: the stopped bookie must ack it (Qa = 3)
            old.roll()                                      # r1's ledger must now close, which waits for r1
            second_roll: Future = Future()
            threading.Thread(target=lambda: _capture(second_roll, old.roll), daemon=True).start()
            new = new_client.open_log("x")                  # fences and recovers every unclosed ledger
            new_position = new.append(b"new-0")
        acked = [(first, b"r0"), (new_position, b"new-0")]
        try:
            held_position = held.result(timeout=60)
        except LedgerFenced:
            held_position = None
        else:                      # acknowledged late: only where the new writer's recovery found it
            assert first < held_position < new_position
            acked.append((held_position, b"r1"))
        with pytest.raises(LedgerFenced):
            second_roll.result(timeout=60)
        with pytest.raises(LedgerFenced):
            old.append(b"r2", timeout=60)
        new.append(b"new-1")
        wait_until(lambda: follower.saw(b"new-1"), 30, message="the follower did not reach the new writer's records")
        assert follower.error is None
        check_follower(follower, sorted(acked))
        records = [p for p, _ in follower.records]
        assert b"r2" not in [p for _, p in follower.records]
        assert records.index(first) < records.index(new_position)
        new.close()


def test_automatic_rolls_with_appends_held_acknowledge_in_log_order_and_fence_the_rest(cluster):
    url = cluster.metadata_url
    with walkit.Client(url, add_timeout=60) as old_client, walkit.Client(url, add_timeout=1) as new_client, \
            walkit.Client(url) as reader_client:
        old = old_client.open_log("y", roll_entries=1, **QUORUMS)
        first = old.append(b"r0")
        follower = Follower(reader_client, "y")
        victim = old_client.ledger_metadata(first.ledger_id).current_ensemble[0]
        with stopped(cluster, victim):
            futures = [old.append_async(f"r{i}".encode()) for i in range(1, 7)]   # a roll before each
            order = completion_order(futures)
            new = new_client.open_log("y")
            new_position = new.append(b"new-0")
        outcomes = []
        for i, future in enumerate(futures, 1):
            try:
                outcomes.append((future.result(timeout=60), f"r{i}".encode()))
            except LedgerFenced:
                outcomes.append((None, f"r{i}".encode()))
        acked = [(p, payload) for p, payload in outcomes if p is not None]
        assert order == sorted(order), f"acknowledgements arrived out of log order: {order}"
        assert all(p < new_position for p, _ in acked), "an old append was acknowledged after the new writer wrote"
        # A held append either fails (LedgerFenced) or, when the bookies that have it answered the
        # new writer's recovery first and the stopped bookie acknowledges it after SIGCONT, is
        # acknowledged at the position recovery kept: before every record of the new writer, and
        # read by the follower (checked below). Both are what BookKeeper allows.
        acked_index = [i for i, (p, _) in enumerate(outcomes) if p is not None]
        assert acked_index == list(range(len(acked_index))), "a later append succeeded after an earlier one failed"
        new.append(b"new-1")
        wait_until(lambda: follower.saw(b"new-1"), 30, message="the follower did not reach the new writer's records")
        assert follower.error is None
        check_follower(follower, [(first, b"r0"), *acked, (new_position, b"new-0")])
        new.close()


def _capture(future: Future, call) -> None:
    try:
        future.set_result(call())
    except WalkitError as exc:
        future.set_exception(exc)



def test_a_close_while_the_ledger_before_holds_an_append_answers_every_append_in_log_order(cluster):
    # Ledger A cannot close: a stopped bookie holds r1. The next ledger B takes r2 and r3 (confirmed,
    # but acknowledged only after r1), r4 waits for a roll that cannot start before A is closed, and
    # close comes. Before the fix r4 stayed held for good, and B, closed before A, left the writer's
    # ledgers with r2 and r3 unacknowledged: close returned and their futures never resolved.
    url = cluster.metadata_url
    with walkit.Client(url, add_timeout=60) as client:
        writer = client.open_log("z", roll_entries=2, ensemble=2, write_quorum=2, ack_quorum=2)
        first = writer.append(b"r0")
        victim = client.ledger_metadata(first.ledger_id).current_ensemble[0]
        with stopped(cluster, victim):
            # new ledgers avoid the stopped bookie once its registration lapsed
            wait_until(lambda: victim not in client.bookies(), 30, message="the stopped bookie stayed registered")
            futures = [writer.append_async(b"r1")]              # A: held by the stopped bookie
            ledger_b = writer.roll()                            # appends go to B; A closes once r1 is in
            assert victim not in client.ledger_metadata(ledger_b).current_ensemble
            futures += [writer.append_async(b"r2"), writer.append_async(b"r3")]
            wait_until(lambda: client.ledger_lac(ledger_b) >= 1, 30, message="B did not confirm r2 and r3")
            futures.append(writer.append_async(b"r4"))          # a roll is due, but A is not closed: held
            closing: Future = Future()
            threading.Thread(target=lambda: _capture(closing, writer.close), daemon=True).start()
            wait_until(lambda: client.ledger_metadata(ledger_b).state == "CLOSED", 30,
                       message="the later ledger did not close while the earlier one waited")
            assert not any(f.done() for f in futures)              # every one of them waits for r1
        closing.result(timeout=60)
        positions = [f.result(timeout=10) for f in futures]
        assert [(p.ledger_id, p.entry_id) for p in positions] == [
            (first.ledger_id, 1), (ledger_b, 0), (ledger_b, 1), (ledger_b, 2)]
        read = [(r.position, r.payload) for r in client.read_log("z")]
        assert read == [(first, b"r0"), *zip(positions, (b"r1", b"r2", b"r3", b"r4"))]
