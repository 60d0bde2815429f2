"""walkit.replicate over in-process bookies: leadership, group commit, exactly-once apply, snapshots, reads."""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import threading
import time

import pytest

import walkit
from walkit.errors import ConfigError, NotLeader
from walkit.core.messages import AddRequest, AddResponse
from walkit.replication import batch
from walkit.testing.processes import wait_until
from walkit.wire.codec import decode_requests, decode_responses

from .machines import Counter


def leader_of(nodes):
    return wait_until(lambda: next((n for n in nodes if n.is_leader), None), message="no leader")


def same_history(nodes) -> list:
    """same_history checks that every node applied the same records in the same order, and returns it."""
    target = max(n.applied for n in nodes if n.applied is not None)
    for node in nodes:
        wait_until(lambda node=node: node.applied is not None and node.applied >= target, message=f"{node.node_id} lags")
    logs = [n.machine.log for n in nodes]
    assert all(log == logs[0] for log in logs), "nodes applied different histories"
    ids = [i for _, i in logs[0]]
    assert len(ids) == len(set(ids)), "a record was applied twice"
    positions = [p for p, _ in logs[0]]
    assert positions == sorted(positions), "records were applied out of log order"
    return ids


def test_one_leader_applies_submissions_and_followers_follow_in_the_same_order(nodes):
    group = nodes(3)
    leader = leader_of(group)
    results = [leader.submit(f"r{i}:{i}".encode()) for i in range(1, 11)]
    assert results == [sum(range(1, i + 1)) for i in range(1, 11)]       # apply's results, in order
    assert leader.leader == leader.node_id
    ids = same_history(group)
    assert ids == [f"r{i}" for i in range(1, 11)]
    for follower in (n for n in group if n is not leader):
        assert follower.machine.value == 55
        with pytest.raises(NotLeader) as refused:
            follower.submit(b"x:1")
        assert wait_until(lambda f=follower: f.leader) == leader.node_id
        assert refused.value.leader in (None, leader.node_id)


def test_concurrent_submitters_share_log_entries(nodes):
    leader = leader_of(nodes(1))
    positions, lock = [], threading.Lock()

    def submitter(k: int) -> None:
        for i in range(20):
            leader.submit(f"t{k}-{i}:1".encode())

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert leader.machine.value == 640
    entries = {p for p, _ in leader.machine.log}
    assert len(entries) < 640, "every record took an entry of its own: no group commit"


def test_every_acknowledged_record_is_applied_once_on_every_node_across_a_leader_change(nodes):
    group = nodes(3)
    first = leader_of(group)
    acked = [f"a{i}" for i in range(30) if first.submit(f"a{i}:1".encode())]
    first.close()                                          # steps down cleanly; another node takes over
    rest = [n for n in group if n is not first]
    second = leader_of(rest)
    acked += [f"b{i}" for i in range(30) if second.submit(f"b{i}:1".encode())]
    ids = same_history(rest)
    assert ids == acked
    assert all(n.machine.value == 60 for n in rest)


def test_a_node_that_was_away_while_two_snapshots_truncated_the_log_starts_from_the_latest(cluster, nodes):
    group = nodes(2, snapshot_every_records=0, roll_entries=5)
    leader = leader_of(group)
    for round_ in range(2):
        for i in range(12):
            leader.submit(f"s{round_}-{i}:1".encode())
        pointer = leader.snapshot_now()
        assert pointer is not None and pointer.position == leader.applied
    metadata = cluster.client().log_metadata("replicated-counter")
    assert metadata.truncated_to >= 0, "the snapshots did not truncate the log"
    for i in range(3):
        leader.submit(f"after-{i}:1".encode())
    (late,) = nodes(1)                                     # a new node: the log's start is gone
    late.wait_ready(20)
    assert late.snapshot_position == pointer.position      # it began from the latest snapshot
    assert wait_until(lambda: late.machine.value == 27)
    assert [i for _, i in late.machine.log] == [i for _, i in leader.machine.log]


def test_read_barrier_on_a_follower_sees_every_write_acknowledged_before_the_call(nodes):
    group = nodes(3, poll_s=5.0)                            # followers long-poll slowly: no luck involved
    leader = leader_of(group)
    followers = [n for n in group if n is not leader]
    for i in range(1, 21):
        value = leader.submit(f"w{i}:1".encode())
        follower = followers[i % 2]
        follower.read_barrier(10)
        assert follower.machine.value >= value


def test_a_caught_up_follower_lingers_before_it_reads_more_but_a_read_barrier_does_not_wait_for_it(nodes):
    group = nodes(3, follow_linger_ms=60_000)               # a minute: only a read barrier ends it
    leader = leader_of(group)
    followers = [n for n in group if n is not leader]
    leader.submit(b"first:1")                               # their first long poll brings it; then they linger
    wait_until(lambda: all(f.machine.value == 1 for f in followers), timeout=10, message="followers lag")
    leader.submit(b"second:1")
    deadline = time.monotonic() + 1.0                        # ten times the leader's explicit LAC (100 ms)
    while time.monotonic() < deadline:
        assert all(f.machine.value == 1 for f in followers), "a follower read during its linger"
        time.sleep(0.05)
    for follower in followers:
        follower.read_barrier(10)                           # would time out if it waited out the minute
        assert follower.machine.value == 2
    leader.submit(b"third:1")                               # lingering again; a forwarded write's wait:
    for follower in followers:
        assert follower.wait_applied(leader.applied, 10) >= leader.applied
        assert follower.machine.value == 3


def test_read_barrier_on_the_leader_proves_leadership_once_its_lease_expired(nodes):
    (leader,) = nodes(1, lease_ms=50)
    leader = leader_of([leader])
    leader.submit(b"x:1")
    time.sleep(0.1)                                         # let the 50 ms lease run out
    assert not leader.lease_valid
    assert leader.read_barrier(10) == leader.applied
    assert leader.lease_valid                               # proving it renewed the lease


def test_a_leader_whose_machine_heard_nothing_past_its_lease_does_not_claim_it(nodes):
    """The machine's clock moves only with events (once a second while quiet); lease_valid is asked between
    them (a KV read right after SIGCONT). Stalling the I/O loop stops the machine's clock: the lease must
    still end on time."""
    (leader,) = nodes(1, lease_ms=300)
    leader = leader_of([leader])
    stalled, release = threading.Event(), threading.Event()
    leader.submit(b"x:1")                                  # an acknowledged append: the lease runs
    assert leader.lease_valid
    leader._loop.call(lambda: (stalled.set(), release.wait(10)))
    try:
        assert stalled.wait(10)
        assert wait_until(lambda: not leader.lease_valid, timeout=5)
    finally:
        release.set()


def test_a_failing_apply_is_the_records_result_on_every_node(nodes):
    group = nodes(2)
    leader = leader_of(group)
    with pytest.raises(ValueError):
        leader.submit(b"bad:not-a-number")
    assert leader.submit(b"good:2") == 2           # the bad record changed nothing, here or elsewhere
    assert same_history(group) == ["good"]
    assert all(n.machine.value == 2 for n in group)


class Halt(BaseException):
    """Halt is what a machine raises to stop its node (as the SQLite adapter's machine does on a record
    that cannot apply): a BaseException, so it is not the record's result."""


class HaltingCounter(Counter):
    """HaltingCounter stops its node at the record "halt:0"."""

    def apply(self, record: bytes, position: walkit.Position):
        if record == b"halt:0":
            raise Halt(ValueError("the record cannot apply")) from ValueError("the record cannot apply")
        return super().apply(record, position)


def test_a_submit_whose_record_stops_the_node_is_answered_with_the_cause_at_once(cluster):
    node = walkit.replicate(HaltingCounter(), client=cluster.client(own_store=True), name="halting", node_id="h0")
    try:
        wait_until(lambda: node.is_leader, message="no leader")
        assert node.submit(b"ok:1") == 1
        answers = [node.submit_async(b"halt:0"), node.submit_async(b"after:1")]
        with pytest.raises(ValueError, match="the record cannot apply"):   # not the submit's Timeout
            answers[0].result(60)
        with pytest.raises(ValueError, match="the record cannot apply"):   # queued behind it: not applied here
            answers[1].result(60)
        assert isinstance(node.failed, Halt)
    finally:
        node.close()


@pytest.mark.processes
def test_a_deposed_leader_stops_accepting_and_follows_the_new_writer(cluster, nodes):
    group = nodes(2)
    leader = leader_of(group)
    leader.submit(b"before:1")
    other = next(n for n in group if n is not leader)
    # Another writer opens the log (as a new leader would): the old leader's next append is fenced.
    intruder = cluster.client(own_store=True).open_log("replicated-counter")
    intruder.append(walkit.replication.batch.encode([b"intruder:100"]))
    with pytest.raises(walkit.errors.WalkitError):
        leader.submit(b"fenced:1", timeout=10)
    try:
        intruder.close()
    except walkit.errors.LedgerFenced:
        pass                        # the group elected a leader again and took the log back first
    new = leader_of(group)
    new.submit(b"after:1")
    ids = same_history(group)
    assert ids[:2] == ["before", "intruder"] and ids[-1] == "after"
    assert other.machine.value == leader.machine.value


def test_step_down_hands_leadership_to_another_node_and_reports_roles(nodes):
    roles: list[tuple[str, str]] = []
    group = nodes(2)
    for node in group:
        node.on_role = lambda role, node=node: roles.append((node.node_id, role))
    first = leader_of(group)
    first.submit(b"one:1")
    first.step_down()
    second = leader_of([n for n in group if n is not first])
    assert second.submit(b"two:1") == 2
    assert (first.node_id, "follower") in roles and (second.node_id, "leader") in roles
    assert same_history(group) == ["one", "two"]


def test_a_retention_window_keeps_older_snapshots_and_the_log_after_the_oldest(cluster, nodes):
    from walkit.replication.snapshots import list_snapshots
    (leader,) = nodes(1, snapshot_every_records=0, roll_entries=3, retention_s=3600)
    leader = leader_of([leader])
    firsts = []
    for round_ in range(3):
        for i in range(5):
            leader.submit(f"k{round_}-{i}:1".encode())
        firsts.append(leader.snapshot_now().position)
    client = cluster.client()
    assert [s.position for s in list_snapshots(client, "counter")] == firsts     # all three kept
    segments = client.log_metadata("replicated-counter").segments
    assert segments[0].ledger_id <= firsts[0].ledger_id                          # the log from the oldest on


def test_campaign_when_holds_a_node_back_until_it_may_lead(nodes):
    allowed = {"node0": False, "node1": True}
    asked: list[str] = []
    group = nodes(2, campaign_when=lambda: False)

    def may(node) -> bool:
        asked.append(node.node_id)
        return allowed[node.node_id]
    for node in group:
        node.campaign_when = lambda node=node: may(node)
    held, free = group
    assert leader_of(group) is free
    free.submit(b"one:1")
    before = asked.count("node0")
    free.close()                                           # resigns: the watch wakes node0, which may not lead
    assert wait_until(lambda: asked.count("node0") > before, message="node0 asked again after the resignation")
    assert not held.is_leader and held.role == "FOLLOWING"
    allowed["node0"] = True
    assert leader_of([held]) is held
    assert held.submit(b"two:1") == 2


def test_keep_log_from_limits_how_far_a_snapshot_truncates_the_log(cluster, nodes):
    keep: list = [None]
    (leader,) = nodes(1, snapshot_every_records=0, roll_entries=3, keep_log_from=lambda: keep[0])
    leader = leader_of([leader])
    positions = []
    for i in range(10):
        leader.submit(f"k{i}:1".encode())
        positions.append(leader.machine.log[-1][0])
    first = cluster.client().log_metadata("replicated-counter").ledger_ids[0]
    leader.snapshot_now()
    assert cluster.client().log_metadata("replicated-counter").ledger_ids[0] == first   # None: keep everything
    keep[0] = positions[4]
    leader.submit(b"more:1")
    leader.snapshot_now()
    ledgers = cluster.client().log_metadata("replicated-counter").ledger_ids
    assert ledgers[0] == positions[4].ledger_id > first     # truncated up to the position kept, not the snapshot
    (late,) = nodes(1)
    assert wait_until(lambda: late.machine.value == 11)


def test_roll_age_s_rolls_the_log_by_age(cluster, nodes):
    (leader,) = nodes(1, roll_age_s=0.2)
    leader = leader_of([leader])
    leader.submit(b"a:1")
    time.sleep(0.4)
    leader.submit(b"b:1")                                  # rolls on the append after 0.2 s
    assert len(cluster.client().log_metadata("replicated-counter").ledger_ids) >= 2


class HeldAcks:
    """HeldAcks stands between a leader's client and the in-memory bookies: each entry the leader
    appends reaches the bookies, but their acknowledgements reach the leader only once the test
    calls `release()`, one entry at a time, in order. `sent` lists (when, the entry's records)."""

    def __init__(self, network, peer: bytes) -> None:
        self.network, self.peer = network, peer
        self.sent: list[tuple[float, list[bytes]]] = []
        self._seen: set[tuple[int, int]] = set()
        self._frames: list[tuple[str, tuple[int, int], bytes]] = []     # (bookie, first add answered, frame)
        self._released: set[tuple[int, int]] = set()
        self._order: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._send, self._deliver = network._send, network._deliver
        network._send, network._deliver = self._on_send, self._on_deliver

    def _on_send(self, peer: bytes, address: str, frame: bytes) -> bool:
        if peer == self.peer:
            for request in decode_requests(frame):
                if isinstance(request, AddRequest) and not request.recovery:
                    for entry in request.entries:
                        key = (request.ledger_id, entry.entry_id)
                        with self._lock:
                            if key not in self._seen:
                                self._seen.add(key)
                                self._order.append(key)
                                self.sent.append((time.monotonic(), batch.decode(entry.payload)))
        return self._send(peer, address, frame)

    def _on_deliver(self, address: str, replies: list) -> None:
        passed = []
        for peer, frame in replies:
            adds = [r for r in decode_responses(frame) if isinstance(r, AddResponse)] if peer == self.peer else []
            keys = [(r.ledger_id, e) for r in adds for e in r.entry_ids]
            with self._lock:
                if keys and not all(k in self._released for k in keys):
                    self._frames.append((address, min(keys), frame))
                    continue
            passed.append((peer, frame))
        self._deliver(address, passed)

    def release(self) -> None:
        """release passes the acknowledgements of the oldest entry not released yet on."""
        with self._lock:
            key = next(k for k in self._order if k not in self._released)
            self._released.add(key)
            ready = [f for f in self._frames if f[1] in self._released]
            self._frames = [f for f in self._frames if f[1] not in self._released]
        for address, _, frame in ready:
            with self.network._lock:
                self._deliver(address, [(self.peer, frame)])

    def stop(self) -> None:
        """stop passes every held acknowledgement on, and holds nothing from now on."""
        with self._lock:
            self._released.update(self._order)
            self._order.clear()
            ready, self._frames = self._frames, []
            self.network._send, self.network._deliver = self._send, self._deliver
        for address, _, frame in ready:
            with self.network._lock:
                self._deliver(address, [(self.peer, frame)])

    def appended(self, count: int) -> list[list[bytes]]:
        """appended waits until `count` entries were sent and returns their records."""
        wait_until(lambda: len(self.sent) >= count, message=f"{count} entries were never appended")
        return [records for _, records in self.sent]


def held_leader(nodes, cluster, **options):
    (leader,) = nodes(1, max_entries_in_flight=1, **options)
    leader = leader_of([leader])
    return leader, HeldAcks(cluster.network, leader.client._loop.transport.peer)


def test_linger_holds_the_next_entry_until_the_submitters_the_last_one_answered_are_back(nodes, cluster):
    leader, held = held_leader(nodes, cluster, linger_ms=60_000)
    a = leader.submit_async(b"a:1")                         # nothing to wait for: it leaves at once
    assert held.appended(1) == [[b"a:1"]]
    b, c = leader.submit_async(b"b:1"), leader.submit_async(b"c:1")
    held.release()                                          # a's entry answered 1, 2 were queued: wait for 3
    assert a.result(20) == 1                                # (the linger was decided with the answer)
    assert len(held.sent) == 1 and not b.done()
    d = leader.submit_async(b"d:1")
    assert held.appended(2) == [[b"a:1"], [b"b:1", b"c:1", b"d:1"]]
    held.release()
    assert [f.result(20) for f in (b, c, d)] == [2, 3, 4]


def test_a_lingering_batch_leaves_when_linger_ms_is_up(nodes, cluster):
    leader, held = held_leader(nodes, cluster, linger_ms=300)
    leader.submit_async(b"a:1")
    held.appended(1)
    b, c = leader.submit_async(b"b:1"), leader.submit_async(b"c:1")
    released = time.monotonic()
    held.release()                                          # waits for a third record that never comes
    wait_until(lambda: len(held.sent) == 2, message="the lingering batch was never appended")
    when, records = held.sent[1]
    assert records == [b"b:1", b"c:1"]
    assert when - released >= 0.3 - 0.001                   # the node's clock counts whole milliseconds
    held.release()
    assert [f.result(20) for f in (b, c)] == [2, 3]


def test_without_linger_ms_the_next_entry_leaves_at_once(nodes, cluster):
    leader, held = held_leader(nodes, cluster)
    a = leader.submit_async(b"a:1")
    held.appended(1)
    b, c = leader.submit_async(b"b:1"), leader.submit_async(b"c:1")
    held.release()                                          # the queued two leave on this acknowledgement
    assert held.appended(2) == [[b"a:1"], [b"b:1", b"c:1"]]
    held.release()
    assert [f.result(20) for f in (a, b, c)] == [1, 2, 3]


def test_a_lingering_batch_fails_with_not_leader_at_a_step_down_and_is_never_appended(nodes, cluster):
    leader, held = held_leader(nodes, cluster, linger_ms=60_000)
    a = leader.submit_async(b"a:1")
    held.appended(1)
    b, c = leader.submit_async(b"b:1"), leader.submit_async(b"c:1")
    held.release()                                          # b and c wait for a's submitter
    assert a.result(20) == 1
    stepped_down = time.monotonic()
    leader.step_down()
    for future in (b, c):
        with pytest.raises(NotLeader) as caught:
            future.result(20)
        assert not caught.value.maybe_in_log                # never sent: a refusal, not an unknown outcome
    assert time.monotonic() - stepped_down < 30             # told at the step-down, not when linger_ms ran out
    assert [records for _, records in held.sent] == [[b"a:1"]]
    held.stop()
    wait_until(lambda: leader.is_leader, timeout=30, message="the node did not lead again")
    assert leader.submit(b"d:1") == 2                       # b and c were never applied


def test_close_while_a_batch_lingers_fails_it_at_once(nodes, cluster):
    leader, held = held_leader(nodes, cluster, linger_ms=60_000)
    a = leader.submit_async(b"a:1")
    held.appended(1)
    b, c = leader.submit_async(b"b:1"), leader.submit_async(b"c:1")
    held.release()
    assert a.result(20) == 1
    closing = time.monotonic()
    leader.close()
    assert time.monotonic() - closing < 30
    for future in (b, c):
        with pytest.raises(NotLeader):
            future.result(0)
    assert [records for _, records in held.sent] == [[b"a:1"]]


def test_linger_never_holds_a_lone_submitter(nodes, cluster):
    leader, held = held_leader(nodes, cluster, linger_ms=60_000)
    for i in range(1, 4):
        future = leader.submit_async(f"r{i}:1".encode())
        assert len(held.appended(i)) == i                   # appended at once, every time
        held.release()
        assert future.result(20) == i


def test_with_linger_closed_loop_submitters_share_one_entry_per_round(nodes):
    leader = leader_of(nodes(1, max_entries_in_flight=1, linger_ms=1000))
    submitters, records = 16, 16 * 40
    start, stop = threading.Barrier(submitters), threading.Event()

    def submitter(k: int) -> None:
        start.wait(20)
        for i in itertools.count():
            if stop.is_set():
                return
            if leader.submit(f"t{k}-{i}:1".encode()) >= records:
                stop.set()

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(submitters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    sizes = list(collections.Counter(p for p, _ in leader.machine.log).values())    # in log order
    full = sum(1 for size in sizes if size == submitters)
    # The first entries leave with whoever came first; within a few rounds every entry waits for
    # all of them, until they stop.
    assert full >= 30, f"entries of all {submitters} submitters: {full} of {len(sizes)}: {sizes}"


def io_thread_caught_up(node) -> None:
    """io_thread_caught_up returns once the node's I/O thread ran everything handed to it before the call."""
    done = threading.Event()
    node.client._loop.call(done.set)
    assert done.wait(20), "the I/O thread did not run a call"


def test_submits_made_while_held_reach_the_log_together_once_released(nodes, cluster):
    leader, held = held_leader(nodes, cluster)
    leader.hold_submits()
    a = leader.submit_async(b"a:1")
    leader.hold_submits()                                   # holds nest
    b = leader.submit_async(b"b:1")
    leader.release_submits()
    io_thread_caught_up(leader)
    c = leader.submit_async(b"c:1")
    io_thread_caught_up(leader)
    assert held.sent == [] and not a.done()                 # the outer hold still keeps them
    leader.release_submits()
    assert held.appended(1) == [[b"a:1", b"b:1", b"c:1"]]   # one hand-off, one entry
    held.release()
    assert [f.result(20) for f in (a, b, c)] == [1, 2, 3]
    with pytest.raises(RuntimeError, match="without hold_submits"):
        leader.release_submits()
    d = leader.submit_async(b"d:1")                         # no hold: it leaves at once
    assert held.appended(2)[1] == [b"d:1"]
    held.release()
    assert d.result(20) == 4


def test_closing_a_node_fails_the_submits_a_hold_kept(nodes):
    leader = leader_of(nodes(1))
    leader.hold_submits()
    kept = leader.submit_async(b"a:1")
    leader.close()
    with pytest.raises(NotLeader, match="closed"):
        kept.result(0)


def test_a_negative_or_endless_linger_ms_is_refused(cluster):
    with pytest.raises(ConfigError, match="linger_ms must not be negative"):
        walkit.replicate(Counter(), client=cluster.client(), name="counter", node_id="n", linger_ms=-1)
    with pytest.raises(ConfigError, match="linger_ms is at most 60000"):
        walkit.replicate(Counter(), client=cluster.client(), name="counter", node_id="n", linger_ms=float("inf"))


def test_linger_counts_a_submitter_of_many_records_once(nodes, cluster):
    leader, held = held_leader(nodes, cluster, linger_ms=60_000)
    first = [leader.submit_async(b"p0:1", submitter="conn")]
    assert [len(records) for records in held.appended(1)] == [1]
    first += [leader.submit_async(f"p{i}:1".encode(), submitter="conn") for i in range(1, 4)]
    held.release()                       # it answered "conn", and "conn" is queued: nothing to wait for
    assert [len(records) for records in held.appended(2)] == [1, 3]
    held.release()
    assert [f.result(20) for f in first] == [1, 2, 3, 4]


def test_a_lingering_batch_that_fills_an_entry_leaves_at_once(nodes, cluster):
    leader, held = held_leader(nodes, cluster, linger_ms=60_000, max_batch_records=2)
    a = leader.submit_async(b"a:1")
    held.appended(1)
    waiting = [leader.submit_async(f"r{i}:1".encode()) for i in range(3)]
    held.release()                       # 3 queued of 4 awaited, but 2 fill an entry
    assert held.appended(2) == [[b"a:1"], [b"r0:1", b"r1:1"]]
    held.release()
    assert a.result(20) == 1 and [f.result(20) for f in waiting[:2]] == [2, 3]


def scrape_replicas() -> dict:
    """scrape_replicas is the walkit_replicate_* samples of this process: {(metric, name, node): value}."""
    from prometheus_client import REGISTRY
    from walkit.metrics import replica_metrics
    replica_metrics()
    return {(s.name, s.labels.get("name"), s.labels.get("node")): s.value for family in REGISTRY.collect()
            if family.name.startswith("walkit_replicate") for s in family.samples}


def test_an_entry_that_does_not_decode_makes_the_node_unhealthy_and_it_says_why_everywhere(cluster, nodes):
    (first,) = nodes(1, name="garbled")
    leader_of([first]).submit(b"a:1")
    first.close()
    with cluster.client().open_log("replicated-garbled") as log:      # fences the old leader's ledger
        log.append(b"\xffnot an entry walkit.replicate wrote")
    (node,) = nodes(1, name="garbled")
    wait_until(lambda: not node.health[0], message="the node noticed the entry")
    healthy, why = node.health
    assert "decode" in why or "entry" in why, why
    status = node.status
    assert status["healthy"] is False and status["why"] == why and status["role"] == "FOLLOWING"
    assert node.machine.value == 1                   # applied up to the bad entry, never past it
    assert scrape_replicas()[("walkit_replicate_healthy", "garbled", node.node_id)] == 0
    from walkit.metrics import replicas_health
    ok, text = replicas_health()
    assert not ok and "garbled" in text and why in text
    with pytest.raises(NotLeader):                   # it does not campaign: it cannot lead what it cannot apply
        node.submit(b"b:1")


def test_a_follower_that_cannot_read_the_log_reports_the_trouble_until_it_can(cluster, nodes):
    group = nodes(2, poll_s=0.05)
    leader = leader_of(group)
    follower = next(n for n in group if n is not leader)
    leader.submit(b"a:1")
    wait_until(lambda: follower.machine.value == 1)
    assert follower.trouble is None
    for i in range(len(cluster.addresses)):
        cluster.kill(i)
    try:
        wait_until(lambda: follower.trouble is not None, message="the follower noticed it cannot read the log")
        assert follower.trouble.startswith("cannot read the log"), follower.trouble
        assert follower.health == (True, "ok")       # it retries on its own: healthy, but it says what is wrong
        assert follower.status["trouble"] == follower.trouble
        assert scrape_replicas()[("walkit_replicate_in_trouble", "counter", follower.node_id)] == 1
    finally:
        for i in range(len(cluster.addresses)):
            cluster.revive(i)
    wait_until(lambda: follower.trouble is None, message="the trouble is over once the bookies are back")
    assert follower.troubles >= 1
    assert scrape_replicas()[("walkit_replicate_troubles_total", "counter", follower.node_id)] >= 1
    leader = leader_of(group)
    leader.submit(b"b:1")
    wait_until(lambda: all(n.machine.value == 2 for n in group))


def test_submit_with_timeout_zero_does_not_wait(cluster, nodes):
    (leader,) = nodes(1, max_entries_in_flight=1)
    leader = leader_of([leader])
    held = HeldAcks(cluster.network, leader.client._loop.transport.peer)
    try:
        started = time.monotonic()
        with pytest.raises(walkit.errors.Timeout):
            leader.submit(b"a:1", timeout=0)
        assert time.monotonic() - started < 1.0
        held.appended(1)
    finally:
        held.stop()
    wait_until(lambda: leader.machine.value == 1)       # not waited for, but not dropped either


def test_a_snapshot_reads_the_metadata_of_its_own_snapshot_ledgers_not_the_clusters(cluster, nodes):
    other = cluster.client()
    for _ in range(60):                              # ledgers of someone else: a snapshot has no business with them
        other.create_ledger(3, 2, 2).close()
    (node,) = nodes(1)
    leader = leader_of([node])
    leader.submit(b"a:1")
    assert leader.snapshot_now(timeout=30) is not None      # the first one also indexes what nobody indexed
    store = leader.client.store
    reads: list[str] = []
    get = store.get

    def counting_get(key: str):
        reads.append(key)
        return get(key)
    store.get = counting_get
    try:
        for i in range(3):
            leader.submit(b"b:1")
            assert leader.snapshot_now(timeout=30) is not None
    finally:
        store.get = get
    ledger_reads = [k for k in reads if k.startswith("ledgers/")]
    assert len(ledger_reads) < 30, f"{len(ledger_reads)} ledger metadata reads for 3 snapshots: {ledger_reads[:10]}"
    from walkit.replication.snapshots import index_prefix, list_snapshots
    assert len(list_snapshots(leader.client, "counter")) == 1
    assert len(store.children(index_prefix("counter"))) == 1      # the replaced ones were deleted with their keys


def test_snapshot_ledgers_nobody_indexed_are_adopted_and_collected(cluster, nodes):
    from walkit.replication.snapshots import index_key, index_prefix, list_snapshots
    (node,) = nodes(1)
    leader = leader_of([node])
    leader.submit(b"a:1")
    first = leader.snapshot_now(timeout=30)
    store = leader.client.store
    store.delete(index_key("counter", first.ledger_id))       # as a walkit from before the index left it
    leader.submit(b"b:1")
    second = leader.snapshot_now(timeout=30)
    node.close()
    (again,) = nodes(1)                                  # a new start adopts it, and the next snapshot collects it
    leader = leader_of([again])
    leader.submit(b"c:1")
    third = leader.snapshot_now(timeout=30)
    ids = [s.ledger_id for s in list_snapshots(leader.client, "counter", scan=True)]
    assert ids == [third.ledger_id] and first.ledger_id != third.ledger_id and second.ledger_id != third.ledger_id
    assert [k.rsplit("/", 1)[-1] for k in store.children(index_prefix("counter"))] == [f"{third.ledger_id:020d}"]
