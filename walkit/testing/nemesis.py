"""walkit.testing.nemesis breaks a multi-host deployment on a seeded schedule, Jepsen style.

    schedule = Schedule.random(seed, duration_s=60)        # the same seed, the same faults
    nemesis = Nemesis(net, schedule, servers=..., bookies=..., meta=meta_host, clients=client_hosts,
                      leader=find_leader)
    nemesis.run()                                          # applies, holds and heals each fault
    nemesis.log                                            # what was done, with monotonic times

Fault kinds (`FAULTS`), each held for a few seconds, healed, then followed by a quiet spell:

- `halves`: the hosts split in two, the leader's side the smaller one (a minority partition);
- `isolate-leader`: the leader's host cut from every other host (processes on it still reach it);
- `leader-from-metadata`: the leader's host cut from the metadata store's host, nothing else;
- `leader-from-clients`: the leader's host cut from every client host, nothing else;
- `bookie-from-leader`: one bookie's host cut from the leader's host only;
- `one-way`: the leader's packets to the metadata store dropped, the other direction kept;
- `kill`: the leader's process SIGKILLed, started again when the fault ends;
- `pause`: the leader's process SIGSTOPped, SIGCONTed when the fault ends;
- `isolate-client` (not in `FAULTS`, so the seeded schedules stay as they were; pass it in
  `kinds`): one client host, drawn by the fault's pick, cut from every other host. Held past a
  consumer's session timeout, its group moves the member's partitions to another member, and
  the member's next commit fails when it is back: the fault that makes commits surely fail.

The schedule is drawn from the seed alone (kinds, holds, quiet spells); which host is the leader
is found when a fault starts (`leader()`), so a run replays its schedule, and the cluster's own
reactions differ only by timing. Monotonic times are the machine's (shared by every namespace),
so the log lines up with the histories clients record.

`Deadline(seconds, healed_file)` is when a client's workload stops: not before a few seconds past
the nemesis's end (the test writes `healed_file` once `run` returned), so operations follow the
last heal even when a loaded machine heals a fault late.

`unavailability(log, ops)` measures each fault from a history: the longest time in the fault's
window (from its start to the end of the quiet spell after it) without an acknowledged write.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)

FAULTS = ("halves", "isolate-leader", "leader-from-metadata", "leader-from-clients", "bookie-from-leader", "one-way", "kill", "pause")
#: Faults a schedule draws only when asked (`kinds`), aimed at the clients rather than the servers.
CLIENT_FAULTS = ("isolate-client",)


@dataclass(frozen=True)
class Fault:
    """Fault is one planned fault: its kind, how long it holds and the quiet spell after it."""

    kind: str
    hold_s: float
    quiet_s: float
    pick: int                 # a seeded choice the fault uses (which bookie, which side)


@dataclass
class Schedule:
    """Schedule is the seeded list of faults of one run."""

    seed: int
    faults: list[Fault]
    settle_s: float = 5.0     # quiet time before the first fault

    @classmethod
    def random(cls, seed: int, duration_s: float, kinds: tuple[str, ...] = FAULTS,
               hold_s: tuple[float, float] = (3.0, 8.0), quiet_s: tuple[float, float] = (4.0, 7.0)) -> "Schedule":
        """random draws faults from `kinds` until they fill `duration_s` (every kind once before any twice)."""
        rng = random.Random(seed)
        faults: list[Fault] = []
        spent = 0.0
        bag: list[str] = []
        while spent < duration_s:
            if not bag:
                bag = list(kinds)
                rng.shuffle(bag)
            fault = Fault(bag.pop(), round(rng.uniform(*hold_s), 2), round(rng.uniform(*quiet_s), 2),
                          rng.randrange(1 << 30))
            faults.append(fault)
            spent += fault.hold_s + fault.quiet_s
        return cls(seed, faults)

    @property
    def duration_s(self) -> float:
        return self.settle_s + sum(f.hold_s + f.quiet_s for f in self.faults)


@dataclass
class Applied:
    """Applied is a fault as it happened: kind, detail, and monotonic start, heal and quiet-end times."""

    kind: str
    detail: str
    start: float
    healed: float = 0.0
    end: float = 0.0


@dataclass
class Nemesis:
    """Nemesis applies a Schedule to a deployment (see the module doc).

    `servers` and `bookies` are walkit.testing.multihost Services; `leader()` returns the
    server Service leading now, or None when none does (the fault then targets a random server).
    """

    network: object
    schedule: Schedule
    servers: list
    bookies: list
    meta: object
    clients: list
    leader: Callable[[], object]
    log: list[Applied] = field(default_factory=list)

    def run(self, stop: Callable[[], bool] = lambda: False) -> list[Applied]:
        """run applies every fault in turn (blocking), healing each before the next; returns the log."""
        rng = random.Random(self.schedule.seed)
        time.sleep(self.schedule.settle_s)
        for fault in self.schedule.faults:
            if stop():
                break
            target = self.leader() or self.servers[rng.randrange(len(self.servers))]
            applied = Applied(fault.kind, "", time.monotonic())
            undo = self._apply(fault, target, applied)
            log.info("nemesis: %s %s for %.1f s", fault.kind, applied.detail, fault.hold_s)
            time.sleep(fault.hold_s)
            undo()
            applied.healed = time.monotonic()
            time.sleep(fault.quiet_s)
            applied.end = time.monotonic()
            self.log.append(applied)
        return self.log

    def _apply(self, fault: Fault, target, applied: Applied) -> Callable[[], None]:
        net, host = self.network, target.host
        if fault.kind == "halves":
            others = [s.host for s in self.servers if s.host is not host] + [b.host for b in self.bookies]
            others += [self.meta] + list(self.clients)
            random.Random(fault.pick).shuffle(others)
            minority = [host] + others[:max(0, (len(others) + 1) // 2 - 1)]
            majority = [h for h in others if h not in minority]
            for a in minority:
                for b in majority:
                    net.cut(a, b)
            applied.detail = f"minority {sorted(h.name for h in minority)}"
            return lambda: net.heal()
        if fault.kind == "isolate-leader":
            net.isolate(host)
            applied.detail = f"{host.name} alone"
            return lambda: net.heal(host)
        if fault.kind == "leader-from-metadata":
            net.cut(host, self.meta)
            applied.detail = f"{host.name} | {self.meta.name}"
            return lambda: net.heal(host, self.meta)
        if fault.kind == "leader-from-clients":
            for client in self.clients:
                net.cut(host, client)
            applied.detail = f"{host.name} | clients"
            return lambda: net.heal()
        if fault.kind == "bookie-from-leader":
            bookie = self.bookies[fault.pick % len(self.bookies)].host
            net.cut(host, bookie)
            applied.detail = f"{host.name} | {bookie.name}"
            return lambda: net.heal(host, bookie)
        if fault.kind == "one-way":
            net.cut(host, self.meta, one_way=True)
            applied.detail = f"{host.name} -> {self.meta.name}"
            return lambda: net.heal(host, self.meta)
        if fault.kind == "kill":
            target.kill()
            applied.detail = f"{host.name} {target.what}"
            return target.start
        if fault.kind == "pause":
            target.process.send_signal(signal.SIGSTOP)
            applied.detail = f"{host.name} {target.what}"
            return lambda: target.process.send_signal(signal.SIGCONT)
        if fault.kind == "isolate-client":
            client = self.clients[fault.pick % len(self.clients)]
            net.isolate(client)
            applied.detail = f"{client.name} alone"
            return lambda: net.heal(client)
        raise ValueError(f"unknown fault kind {fault.kind!r}; known: {', '.join(FAULTS + CLIENT_FAULTS)}")


class Deadline:
    """Deadline ends a workload `seconds` after it was made, but not before `after_heal_s` past the moment
    `healed_file` appeared (the test writes it when the nemesis is over), and at most `most_s` after the
    planned end (a test that failed writes no file). Without `healed_file` it is the planned end."""

    def __init__(self, seconds: float, healed_file: str | None = None, after_heal_s: float = 3.0,
                 most_s: float = 120.0) -> None:
        self.planned = time.monotonic() + seconds
        self.healed_file = healed_file
        self.after_heal_s = after_heal_s
        self.most_s = most_s
        self.healed_at: float | None = None
        self.ended_at: float | None = None       # when `passed` first said so

    def passed(self) -> bool:
        """passed tells whether the workload should stop now."""
        if self.ended_at is not None:
            return True
        now = time.monotonic()
        if self.healed_file is not None and self.healed_at is None and os.path.exists(self.healed_file):
            self.healed_at = now
        over = now >= self.planned and (
            self.healed_file is None or now >= self.planned + self.most_s
            or (self.healed_at is not None and now >= self.healed_at + self.after_heal_s))
        if over:
            self.ended_at = now
        return over


def unavailability(applied: list[Applied], ops, f: str = "write") -> dict[str, list[float]]:
    """unavailability maps each fault kind to the seconds without an acknowledged write in each of its windows.

    A window runs from the fault's start to the end of the quiet spell after it; its unavailability
    is the longest stretch between two acknowledgements inside it, or between an edge of the
    window and the acknowledgement nearest that edge. The writes are the ops named `f` ("send"
    for a queue's history).
    """
    acked = sorted(op.complete_time for op in ops if op.f == f and op.outcome == "ok")
    found: dict[str, list[float]] = {}
    for fault in applied:
        inside = [t for t in acked if fault.start <= t <= fault.end]
        points = [fault.start, *inside, fault.end]
        found.setdefault(fault.kind, []).append(round(max(b - a for a, b in zip(points, points[1:])), 2))
    return found
