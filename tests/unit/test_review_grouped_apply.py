"""The follower linger and grouped applying (walkit.core.replica, walkit.replication.node) where the simulator does
not reach: waits on a node whose apply thread stops, and a group whose apply thread fails part way. An
adversarial review of the change found each of these broken; each test states the rule.

Each test drives the real ReplicaMachine (sans-IO) and the real shell methods of ReplicatedNode /
Database on a stand-in for the client's I/O loop (run inline), no servers.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

from walkit.adapters.sqlite.database import Database
from walkit.adapters.sqlite.errors import ReplicaStopped
from walkit.core import events as ev
from walkit.core import replicaevents as rev
from walkit.core.batch import Session, encode
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.loglist import LogConfig, Position
from walkit.core.replica import FOLLOWING, ReplicaConfig, ReplicaMachine
from walkit.replication.node import ReplicatedNode, _Driver
from walkit.testing.processes import wait_until

from .helpers import make_entry
from .test_log_reader import listed, open_ledger

PASSWORD = b""                                   # tests.unit.helpers signs entries without a password
DIGESTS = {"crc32c": Digest("crc32c", PASSWORD)}


def new_machine(**config) -> ReplicaMachine:
    return ReplicaMachine("m", "n1", ReplicaConfig(log=LogConfig(ensemble=1, write_quorum=1, ack_quorum=1), **config),
                          master_key=master_key(PASSWORD), password_check=password_check(PASSWORD),
                          digest_for=DIGESTS.__getitem__, password=PASSWORD)


class _InlineLoop:
    """_InlineLoop stands for the client's I/O loop: a call runs at once, a step hands the commands to the driver."""

    def call(self, fn) -> None:
        fn()

    call_unhurried = call

    def step(self, driver, event) -> None:
        for command in driver.machine.step(event):
            driver.handle(command)


class _Halt(BaseException):
    """_Halt stops the apply thread, as the SQLite adapter's _Halt does (a BaseException from apply)."""


class _App:
    def __init__(self) -> None:
        self.applied: list[bytes] = []

    def apply(self, record: bytes, position):
        if record == b"halt":
            raise _Halt("the file cannot go on")
        self.applied.append(record)
        return len(self.applied)


def shell_of(core: ReplicaMachine, app=None, timeout: float = 1.0) -> ReplicatedNode:
    """shell_of is a ReplicatedNode holding `core`, with only what its apply thread and waits use."""
    node = object.__new__(ReplicatedNode)
    node.name, node.node_id = "m", "n1"
    node.core, node.machine = core, app or _App()
    node.client = SimpleNamespace(timeout=timeout)
    node._loop = _InlineLoop()
    node._driver = _Driver(node)
    node._tokens = itertools.count(1000)
    node._reads, node._submits = {}, {}
    node._ready_token = None
    node._role = FOLLOWING
    node.on_role = None
    node.failed = None
    node._applied, node.records_applied = None, 0
    node._applied_cond = threading.Condition()
    node._since_records = node._since_bytes = 0
    node._snapshotting = node._snapshot_wanted = False
    node._apply_queue = queue.Queue()
    node._group_applied = []
    node._handing = []
    node._prompt = True
    node._stopped = threading.Event()
    return node


def test_a_forwarded_commit_on_a_node_whose_apply_thread_stopped_fails_at_once_not_after_the_client_timeout():
    """Rule (Database.wait_applied's doc, and what it did before 2f88c64): ReplicaStopped "if the file stopped
    applying the log", found by its 50 ms check loop. 2f88c64 first calls node.wait_applied, which a stopped
    machine never answers (a STOPPED ReplicaMachine drops ReadRequested): the COMMIT hangs the client's whole
    timeout (30 s by default) before the check runs."""
    core = new_machine()
    core.step(rev.StopRequested())                 # what the apply thread's failure posts (node.py _apply_loop)
    node = shell_of(core, timeout=1.0)
    node.failed = _Halt("the apply thread stopped")
    db = object.__new__(Database)
    db.name, db.node = "m", node
    db.machine = SimpleNamespace(position=None, failed=None)
    db._applied = threading.Condition()
    started = time.monotonic()
    try:
        db.wait_applied((1, 5, 0))
    except ReplicaStopped:
        pass
    waited = time.monotonic() - started
    assert waited < 0.5, f"ReplicaStopped came after {waited:.2f} s: the client's timeout, not the 50 ms check"


def test_a_forwarded_commit_waiting_when_the_apply_thread_stops_fails_at_once():
    """The same rule when the apply thread stops while the COMMIT waits (say, the forwarded write itself does not
    apply on this follower: the SQLite adapter's _Halt). The machine drops its reads when it stops and node.py does
    not fail the futures of node.wait_applied: the wait lasts the client's whole timeout."""
    core = new_machine()
    node = shell_of(core, timeout=1.0)
    db = object.__new__(Database)
    db.name, db.node = "m", node
    waiting = threading.Event()

    class Machine:                                  # the file's machine; the wait reads its position while it waits
        failed = None

        @property
        def position(self):
            waiting.set()
    db.machine = Machine()
    db._applied = threading.Condition()
    outcome: list = []

    def commit() -> None:
        started = time.monotonic()
        try:
            db.wait_applied((1, 5, 0))
        except ReplicaStopped as exc:
            outcome.append((time.monotonic() - started, exc))

    waiter = threading.Thread(target=commit)
    waiter.start()
    wait_until(lambda: waiting.is_set() or node._reads, timeout=5,        # in the file's wait, or in the node's
               message="the COMMIT did not start waiting")
    node.failed = _Halt("the apply thread stopped")  # what node.py's _apply_loop does when apply raises _Halt
    node._post(rev.StopRequested())
    stopped_at = time.monotonic()
    waiter.join(5)
    assert outcome, "the COMMIT did not fail"
    late = time.monotonic() - stopped_at
    assert late < 0.5, f"ReplicaStopped came {late:.2f} s after the node stopped (the client's timeout)"


def test_duplicates_in_an_entry_applied_before_the_apply_thread_failed_are_answered():
    """Rule (submit's doc: an apply that raises a BaseException fails "the submit of that record and those of the
    records after it"): every other submit is answered. A duplicate's answer is the machine's CompleteSubmit when
    its entry's EntryApplied comes. One entry at a time, an entry applied before the failing one was reported
    before it; in a group (ddfc128) node.py stashes the EntryApplied of the entries before the last and drops
    them when the thread fails in a later entry: the duplicate's submit is never answered (until close)."""
    core = new_machine()
    node = shell_of(core)
    futures = {token: Future() for token in (1, 2, 3, 4)}
    node._submits.update(futures)

    def hand(*entries) -> None:
        for position, payload, tokens in entries:
            core._queue_entry(position, payload, tokens)
        for command in core._next_apply():
            node._handle(command)

    hand((Position(1, 0), encode([b"c1"], [Session("c", 1)], 100), [1]))
    node._apply_queue.put(None)
    node._apply_loop()
    assert futures[1].result(0) == 1 and core.applied == Position(1, 0)
    # A group: entry 1 holds a retry of c:1 (a duplicate) and a new record; entry 2's apply stops the thread.
    hand((Position(1, 1), encode([b"c1", b"d1"], [Session("c", 1), Session("d", 1)], 101), [2, 3]),
         (Position(1, 2), encode([b"halt"], [Session("e", 1)], 102), [4]))
    node._apply_loop()                              # returns once the apply failed
    assert futures[3].result(0) == 2               # applied, answered by the shell
    assert futures[4].done()                        # the failing record: failed by _fail_unapplied
    assert futures[2].done(), "the duplicate of c:1 (entry 1:1, applied before the failure) was never answered"
    assert futures[2].result(0) == 1


def test_a_follower_lingers_after_the_entry_a_wait_applied_waited_for():
    """Rule (2f88c64: barriers and forwarded commits end the linger; otherwise a caught-up follower lingers):
    a read that the very entry just applied satisfies waits for nothing more. _finish tells the reader the entry
    was consumed (ReaderCaughtUp) before it releases the reads, so the reader sees that read still waiting and
    long-polls at once: with the SQLite adapter (every forwarded COMMIT waits for its own entry) the follower
    never lingers. (Cost only, not correctness.)"""
    core = new_machine(follow_linger_ms=20)
    core.start()
    key = core._reader_key
    reader = core._subs[key]
    # Bring the reader to a long poll of ledger 11, entry 0 (as test_log_reader does).
    core.step(rev.From(key, listed(11)))
    [poll] = [c for v in core.step(rev.From(key, ev.LedgerMetadataRead(ledger_id=11, metadata=open_ledger(11),
                                                                        version=0)))
              for c in v.commands]
    # A forwarded commit waits for entry 11:0.
    assert core.step(rev.ReadRequested(token=7, upto=Position(11, 0))) == []
    payload = encode([b"x"], [None], 100)
    out = core.step(rev.From(key, ev.EntriesRead(bookie=poll.bookie, ledger_id=11, missing=[], lac=0,
                                                  entries=[make_entry(0, payload, ledger_id=11)])))
    [apply] = [c for c in out if type(c) is rev.ApplyEntry]
    core.at(1_000, 1_000)
    out = core.step(rev.EntryApplied(position=apply.position, results=[1], snapshot=False))
    assert rev.ReadReady(token=7, applied=Position(11, 0)) in out
    polls = [c for v in out if type(v) is rev.Via for c in v.commands]
    assert not polls, f"the follower long-polled at once instead of lingering: {polls}"
    assert reader._wake_at is not None
