"""Review of the unhurried EntryApplied and the one-piece follower reads, with real processes.

Two changes to walkit.replicate save wake-ups and hand-overs: a leader whose machine waits for
nothing posts EntryApplied without waking its I/O thread (node.py, `_prompt`; commit 81efae9),
and a lingering follower gets what piled up during its linger in one piece (RangeReader
`together`; TailReader leaves an entry its answer's LAC passes to the range read). Each test
here runs three counter nodes (tests/support/counter_node.py) over real bookies, injects one
kind of fault on purpose at moments drawn from a seed, and then checks one history:

- every acknowledged increment is applied exactly once on every node, refused ones never;
- what each node (each incarnation of it) applied is a prefix of one history: same positions,
  same ids, in the same order;
- a read barrier started after a submit was acknowledged returns a value at least the one that
  submit answered (deltas are positive, so the counter only grows along the history).
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections import Counter

import pytest

import walkit
from walkit.local import LocalCluster, stop_process
from walkit.testing.processes import wait_until
from tests.support.pause import resume, stop

from .test_counter_processes import Node

pytestmark = pytest.mark.slow

#: The errors of an HTTP call to a node that is stopped, killed or dying.
_GONE = (OSError, http.client.HTTPException)


class Group:
    """Group is the counter nodes of one test over one cluster; a restarted node is a new incarnation."""

    def __init__(self, cluster: LocalCluster, tmp_path, count: int = 3) -> None:
        self.cluster = cluster
        self.url = cluster.metadata_url + "?ttl=1"          # a dead leader's session expires after 1 s
        self.tmp_path = tmp_path
        self.incarnations: list[Node] = []                  # every process started, killed ones too
        self.live: list[Node] = []
        self.lock = threading.Lock()
        for i in range(count):
            self.start(f"node{i}")

    def start(self, node_id: str) -> Node:
        """start starts a process for `node_id`, writing what it applies to a file of its own."""
        node = Node(self.url, node_id, str(self.tmp_path / f"applied-{node_id}-{len(self.incarnations)}.txt"))
        with self.lock:
            self.incarnations.append(node)
            self.live.append(node)
        return node

    def kill(self, node: Node) -> None:
        """kill SIGKILLs `node`'s process; it stays among the incarnations, for its applied file."""
        with self.lock:
            self.live.remove(node)
        node.kill()

    def alive(self) -> list[Node]:
        with self.lock:
            return list(self.live)

    def leader(self) -> Node | None:
        """leader is the live node that says it leads, or None."""
        for node in self.alive():
            try:
                if node.state()["is_leader"]:
                    return node
            except _GONE:
                continue
        return None

    def followers(self) -> list[Node]:
        leader = wait_until(self.leader, 30, "no leader")
        return [node for node in self.alive() if node is not leader]

    def close(self) -> None:
        """close continues every process (a stopped one does not act on SIGTERM) and stops it."""
        for node in self.incarnations:
            resume(node.process.pid)
        for node in self.incarnations:
            stop_process(node.process, 10)


class Load:
    """Load is `threads` threads submitting increments with unique ids and seeded deltas (1 to 9) to the leader.

    Each outcome is recorded: acknowledged (with the value the leader answered), refused (409,
    never appended) or unknown (the call died with the leader, timed out, or a deposed leader
    says it may be in the log).
    """

    def __init__(self, group: Group, seed: int, threads: int = 4) -> None:
        self.group = group
        self.seed = seed
        self.acked: dict[str, tuple[int, int]] = {}        # id -> (delta, value answered)
        self.refused: set[str] = set()
        self.unknown: dict[str, int] = {}                   # id -> delta
        self.floor = 0                                      # the highest value answered so far
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(threads)]
        for thread in self._threads:
            thread.start()

    def _run(self, k: int) -> None:
        rng = random.Random(f"{self.seed}-{k}")
        i = 0
        while not self._stop.is_set():
            target = self.group.leader()
            if target is None:
                continue
            ident, delta = f"t{k}-{i}", rng.randint(1, 9)
            i += 1
            try:
                status, doc = target.call("/submit", f"{ident}:{delta}".encode())
            except _GONE:
                status, doc = None, {}
            with self.lock:
                if status == 200:
                    self.acked[ident] = (delta, doc["value"])
                    self.floor = max(self.floor, doc["value"])
                elif status == 409 and not doc.get("maybe_in_log"):
                    self.refused.add(ident)
                else:
                    self.unknown[ident] = delta

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def grows_by(self, n: int, timeout: float = 60) -> None:
        """grows_by waits until `n` more submits were acknowledged than now."""
        target = self.count() + n
        wait_until(lambda: self.count() >= target, timeout, lambda: f"the load stalled at {self.count()} < {target}")

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in self._threads), "a submit never returned"

    def delta(self, ident: str) -> int:
        return self.acked[ident][0] if ident in self.acked else self.unknown[ident]


def barrier_floor(node: Node, floor: int) -> str | None:
    """barrier_floor runs a read barrier on `node`; it says what is wrong if it returned less than `floor`."""
    status, state = node.call("/barrier", b"")
    if status != 200:
        return f"{node.node_id}: read barrier answered {status} {state}"
    if state["value"] < floor:
        return f"{node.node_id}: read barrier returned value {state['value']} < {floor} already acknowledged"
    return None


def converged(group: Group) -> list[dict]:
    """converged waits until a read barrier on every live node returns the same applied position, and returns
    their states (a submit whose outcome is unknown may still be appended by then)."""
    def same() -> list[dict] | None:
        states = [node.call("/barrier", b"")[1] for node in group.alive()]
        return states if len({s.get("applied") for s in states}) == 1 and "applied" in states[0] else None
    return wait_until(same, 30, "the live nodes did not converge on one applied position")


def one_history(group: Group, load: Load) -> list[tuple[str, str]]:
    """one_history checks every node against the log's one history and returns it.

    The live nodes applied the same records; every incarnation (killed ones too) applied a
    prefix of them; no id twice; every acknowledged id, no refused one; and each live node's
    value is the sum of the deltas it applied.
    """
    states = converged(group)
    live = group.alive()
    history = live[0].applied()
    for node in live[1:]:
        assert node.applied() == history, f"{node.node_id} and {live[0].node_id} applied different histories"
    for node in group.incarnations:
        applied = node.applied()
        assert applied == history[:len(applied)], \
            f"{node.applied_file} is not a prefix of the history: first difference at " \
            f"{next(i for i, (a, b) in enumerate(zip(applied + [None], history + [None])) if a != b)}"
    ids = [ident for _, ident in history]
    twice = {ident for ident, n in Counter(ids).items() if n > 1}
    assert not twice, f"applied twice: {sorted(twice)[:5]}"
    lost = set(load.acked) - set(ids)
    assert not lost, f"acknowledged increments lost: {sorted(lost)[:5]}"
    assert not load.refused & set(ids), f"refused submissions applied: {sorted(load.refused & set(ids))[:5]}"
    total = sum(load.delta(ident) for ident in ids)
    assert [s["value"] for s in states] == [total] * len(states), "a node's value is not the sum of its history"
    return history


@pytest.fixture
def group(tmp_path):
    """group is three counter nodes over four bookies; every process is continued and stopped at the end."""
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        nodes = None
        try:
            nodes = Group(cluster, tmp_path)
            wait_until(nodes.leader, 30, "no leader was elected")
            yield nodes
        finally:
            for i in range(4):
                if cluster.pid(i) is not None:
                    resume(cluster.pid(i))
            if nodes is not None:
                nodes.close()


def test_followers_stopped_and_continued_under_load_apply_every_acknowledged_increment_once(group):
    rng = random.Random(1)
    load = Load(group, seed=1)
    try:
        load.grows_by(rng.randint(50, 150))
        first, second = group.followers()
        stop(first.process.pid, group.cluster.metadata_url)
        load.grows_by(rng.randint(200, 400))
        stop(second.process.pid, group.cluster.metadata_url)           # both followers held for a while
        load.grows_by(rng.randint(200, 400))
        for node in (first, second):
            resume(node.process.pid)
            floor = load.floor
            problem = barrier_floor(node, floor)                    # caught up right after it continued
            assert problem is None, problem
            load.grows_by(rng.randint(50, 150))
    finally:
        load.stop()
    assert not load.unknown and not load.refused, "the leader failed submits though only followers were held"
    history = one_history(group, load)
    print(f"\n{len(load.acked)} acknowledged, {len(history)} applied")


def test_followers_catch_up_through_a_held_bookie_and_apply_nothing_twice(group):
    rng = random.Random(2)
    load = Load(group, seed=2)
    try:
        with walkit.Client(group.cluster.metadata_url) as client:
            # 1 s: below the add and request timeouts (2 s), every reader waits it out; 2.5 s: past
            # them, the writer replaces the bookie and a follower's range read asks another replica.
            for held in (1.0, 2.5):
                load.grows_by(rng.randint(30, 120))
                ledger_id = int(wait_until(group.leader, 30, "no leader").state()["applied"].split(":")[0])
                ensemble = client.ledger_metadata(ledger_id).current_ensemble
                pid = group.cluster.pid(group.cluster.addresses.index(rng.choice(ensemble)))
                stop(pid, group.cluster.metadata_url)
                timer = threading.Timer(held, resume, args=(pid,))
                timer.start()
                try:
                    timer.join(held + 10)
                finally:
                    timer.cancel()
                    resume(pid)
                load.grows_by(rng.randint(50, 150))
    finally:
        load.stop()
    assert not load.unknown and not load.refused, "a submit failed though only a bookie was held"
    print(f"\n{len(load.acked)} acknowledged")
    acknowledged = sum(delta for delta, _ in load.acked.values())
    for node in group.followers():
        status, state = node.call("/barrier", b"")
        assert status == 200 and state["value"] == acknowledged, \
            f"{node.node_id} did not catch up: {status} {state}, not {acknowledged}"
    one_history(group, load)


def test_leader_killed_at_seeded_moments_loses_nothing_and_barriers_see_acknowledged_writes(group):
    rng = random.Random(3)
    load = Load(group, seed=3)
    outcomes: list[str | None] = []                     # None: a barrier returned what it had to
    done = threading.Event()

    def read(k: int) -> None:
        pick = random.Random(f"3-read-{k}")
        while not done.is_set():
            floor = load.floor                          # acknowledged before the barrier starts
            node = pick.choice(group.alive())
            try:
                outcomes.append(barrier_floor(node, floor))
            except _GONE:
                continue                                # the node was killed mid-call

    readers = [threading.Thread(target=read, args=(k,), daemon=True) for k in range(2)]
    for thread in readers:
        thread.start()
    try:
        for _ in range(3):
            load.grows_by(rng.randint(40, 160))
            leader = wait_until(group.leader, 30, "no leader")
            group.kill(leader)
            wait_until(group.leader, 30, "no other node took over")
            group.start(leader.node_id)                 # the killed node comes back, replaying the log
        load.grows_by(100)
    finally:
        done.set()
        load.stop()
        for thread in readers:
            thread.join(30)
    problems = [each for each in outcomes if each is not None]
    assert not problems, problems[:5]
    assert len(outcomes) >= 20, f"only {len(outcomes)} read barriers returned"
    history = one_history(group, load)
    print(f"\n{len(load.acked)} acknowledged, {len(load.unknown)} unknown, {len(history)} applied; "
          f"{len(outcomes)} read barriers")


def test_read_barriers_at_seeded_moments_on_an_idle_group_all_return_promptly(group):
    rng = random.Random(4)
    latencies: dict[str, list[float]] = {}
    problems: list[str] = []
    for _ in range(3):
        load = Load(group, seed=rng.randrange(1 << 30))
        try:
            load.grows_by(rng.randint(20, 80))
        finally:
            load.stop()
        total = converged(group)[0]["value"]

        # Barriers at moments up to 2 s after the burst: before and after the machines go quiet
        # (QUIET_MS, 1 s), when the leader's EntryApplied went unhurried.
        def barrier(node: Node, after: float) -> None:
            time.sleep(after)                          # a moment of the schedule, not a wait for anything
            started = time.monotonic()
            status, state = node.call("/barrier", b"")
            latencies.setdefault(node.node_id, []).append(time.monotonic() - started)
            if (status, state.get("value")) != (200, total):
                problems.append(f"{node.node_id} {after:.2f} s after the burst: {status} {state}, not {total}")
        threads = [threading.Thread(target=barrier, args=(node, rng.uniform(0, 2)))
                   for node in group.alive() for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert not problems, problems
    slowest = max(max(each) for each in latencies.values())
    print(f"\nslowest read barrier {slowest * 1000:.0f} ms")
    assert slowest < 0.5, f"a read barrier on an idle node took {slowest:.2f} s: {latencies}"
