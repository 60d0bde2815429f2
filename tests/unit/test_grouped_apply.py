"""Grouped applying (walkit.core.replica) against one entry at a time: the same log, the same answers.

A ReplicaMachine hands the shell every queued entry at once (a group) and plans each entry's
records, new or retried, against the client sessions as one-at-a-time applying would leave them.
Here a seeded log of entries, with client sessions, retries, stale submits, records without a
session, stamps that jump and go back, and session expiry, is applied twice on fresh machines: one
entry at a time, and in groups of random size, answered per entry or all at once (as
walkit.replication.node does), with snapshots asked for in between. The records applied, every
submit's answer and the session table at every snapshot must be the same. A machine that records
a group's sessions only once applied (SESSIONS_AT_PLAN off) is told apart.
"""

from __future__ import annotations

import random

import pytest

from walkit.core import replicaevents as rev
from walkit.core.batch import Session, encode
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.loglist import LogConfig, Position
from walkit.core.replica import ReplicaConfig, ReplicaMachine
from walkit.core.sessions import encode_result

PASSWORD = b"pw"
DIGESTS = {"crc32c": Digest("crc32c", PASSWORD)}
SEEDS = 600


def started(machine_cls, ttl_ms: int) -> ReplicaMachine:
    config = ReplicaConfig(log=LogConfig(ensemble=1, write_quorum=1, ack_quorum=1), session_ttl_ms=ttl_ms)
    machine = machine_cls("m", "n1", config, master_key=master_key(PASSWORD), password_check=password_check(PASSWORD),
                          digest_for=DIGESTS.__getitem__, password=PASSWORD)
    machine.start()
    return machine


def seeded_log(rng: random.Random) -> list[tuple[Position, bytes, list[int]]]:
    """seeded_log is (position, payload, submit tokens) per entry: 1 to 4 records of clients a, b, c each."""
    highest: dict[str, int] = {}
    entries, stamp, tokens = [], 1000, iter(range(1, 1 << 20))
    for index in range(rng.randint(5, 40)):
        stamp = max(0, stamp + rng.choice([0, 1, 5, 30, 150, -20]))
        records, sessions, submits = [], [], []
        for _ in range(rng.randint(1, 4)):
            client, draw = rng.choice("abc"), rng.random()
            last = highest.get(client, 0)
            if draw < 0.45 or last == 0:
                seq = highest[client] = last + 1          # a new submit
            elif draw < 0.8:
                seq = last                                # a retry of the last one
            elif draw < 0.9:
                seq = max(1, last - rng.randint(1, 2))    # an older one: stale
            else:
                seq = None                                # no session
            records.append(f"{client}:{seq}:{index}".encode())
            sessions.append(None if seq is None else Session(client, seq))
            submits.append(next(tokens))
        entries.append((Position(1, index), encode(records, sessions, stamp), submits))
    return entries


class Shell:
    """Shell applies what its machine hands over and keeps what a node would show: state, answers, snapshots."""

    def __init__(self, machine: ReplicaMachine) -> None:
        self.machine = machine
        self.state: list[bytes] = []
        self.answers: dict[int, tuple[str, str]] = {}
        self.handed: list[rev.ApplyEntry] = []
        self.unreported: list[rev.EntryApplied] = []
        self.snapshots: list[tuple[Position, bytes]] = []

    def take(self, commands: list) -> None:
        for command in commands:
            kind = type(command)
            if kind is rev.ApplyEntry:
                self.handed.append(command)
            elif kind is rev.CompleteSubmit:
                assert command.token not in self.answers, f"submit {command.token} answered twice"
                self.answers[command.token] = ("duplicate", encode_result(command.result))
            elif kind is rev.SnapshotState:
                self.snapshots.append((command.position, command.sessions))

    def apply_next(self) -> bool:
        """apply_next applies the first entry handed over; it returns whether it was its group's last."""
        command = self.handed.pop(0)
        results = []
        for index, record in enumerate(command.records):
            self.state.append(record)
            results.append((len(self.state), record.decode()))
            if command.tokens is not None:
                assert command.tokens[index] not in self.answers, f"submit {command.tokens[index]} answered twice"
                self.answers[command.tokens[index]] = ("applied", encode_result(results[-1]))
        self.unreported.append(rev.EntryApplied(position=command.position, results=results, snapshot=False))
        return command.last

    def report(self, count: int | None = None) -> None:
        """report tells the machine of the first `count` entries applied (all of them by default)."""
        count = len(self.unreported) if count is None else count
        events, self.unreported = self.unreported[:count], self.unreported[count:]
        for event in events:
            self.take(self.machine.step(event))


def one_at_a_time(log, ttl_ms: int) -> tuple[Shell, dict[Position, bytes]]:
    """one_at_a_time applies `log` entry by entry; it returns the shell and the sessions after each entry."""
    shell = Shell(started(ReplicaMachine, ttl_ms))
    sessions = {}
    for position, payload, tokens in log:
        shell.machine._queue_entry(position, payload, tokens)
        shell.take(shell.machine._next_apply())
        while shell.handed:
            shell.apply_next()
            shell.report()
        sessions[position] = shell.machine.sessions.to_bytes()
    return shell, sessions


def in_groups(log, ttl_ms: int, rng: random.Random, machine_cls=ReplicaMachine) -> Shell:
    """in_groups applies `log` as entries arrive in bursts, reported per entry or per group, with snapshots asked."""
    shell = Shell(started(machine_cls, ttl_ms))
    machine, arrived = shell.machine, 0
    while arrived < len(log) or shell.handed or shell.unreported:
        draw = rng.random()
        if draw < 0.35 and arrived < len(log):
            for position, payload, tokens in log[arrived:arrived + rng.randint(1, 6)]:
                machine._queue_entry(position, payload, tokens)
                arrived += 1
            shell.take(machine._next_apply())
        elif draw < 0.7 and shell.handed:
            if shell.apply_next() or rng.random() < 0.3:      # node.py reports at a group's last entry
                shell.report()
        elif draw < 0.8 and shell.unreported:
            shell.report(1)
        elif draw < 0.85:
            shell.take(machine.step(rev.SnapshotRequested()))
        elif shell.unreported and not shell.handed:
            shell.report()
    return shell


def differences(seed: int, machine_cls=ReplicaMachine) -> list[str]:
    """differences is what grouped applying of seed's log does otherwise than one entry at a time."""
    rng = random.Random(seed)
    ttl_ms = rng.choice([40, 100, 10_000])
    log = seeded_log(rng)
    reference, sessions = one_at_a_time(log, ttl_ms)
    grouped = in_groups(log, ttl_ms, rng, machine_cls)
    found = []
    if grouped.state != reference.state:
        found.append(f"applied {grouped.state}, one at a time {reference.state}")
    for token in sorted(set(grouped.answers) | set(reference.answers)):
        if grouped.answers.get(token) != reference.answers.get(token):
            found.append(f"submit {token} answered {grouped.answers.get(token)}, one at a time "
                         f"{reference.answers.get(token)}")
    for position, table in grouped.snapshots:
        if position is not None and table != sessions[position]:
            found.append(f"the snapshot at {position} holds other sessions than one at a time")
    if grouped.machine.sessions != reference.machine.sessions:
        found.append("the sessions at the end differ")
    return found


@pytest.mark.parametrize("block", range(6))
def test_grouped_applying_applies_answers_and_snapshots_as_one_entry_at_a_time(block: int) -> None:
    for seed in range(block * SEEDS // 6, (block + 1) * SEEDS // 6):
        assert differences(seed) == [], f"seed {seed}"


class SessionsOnceApplied(ReplicaMachine):
    """Records a group's new sessions only once each entry is applied (right for one entry at a time only)."""

    SESSIONS_AT_PLAN = False


def test_the_comparison_catches_a_group_planned_without_the_sessions_of_its_earlier_entries() -> None:
    broken = next((seed for seed in range(SEEDS) if differences(seed, SessionsOnceApplied)), None)
    assert broken is not None, f"sessions recorded once applied made no difference in {SEEDS} seeds"
    assert differences(broken) == []                    # the correct machine, the very same run
