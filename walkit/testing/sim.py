"""walkit.testing.sim runs the sans-IO core under seeded faults and checks invariants every step.

One `Simulation(seed)` is a deterministic run: simulated bookies (BookieHandler over a storage
that loses unsynced writes on a crash), a writer (LedgerWriter), recoverers (LedgerRecovery,
several may run at once, some while the writer is alive) and readers (RangeReader), over a
simulated network that drops, delays, reorders and duplicates messages, with a simulated
metadata store doing compare-and-swap with delays. Bookies and the writer crash at random
times; bookies come back with their durable state. Everything random comes from the seed, so a
failing seed is a one-line reproduction: ``pytest tests/sim --seed N``.

After every event the checker verifies (DESIGN.md §3, seed 000 "Guarantees"):

- every entry acknowledged to the writer is durably stored on at least Qa bookies of its write
  set, under the metadata currently in the store, with its original payload;
- once the ledger is CLOSED, no acknowledged entry lies beyond last_entry_id and the metadata
  never changes again;
- all readers of the closed ledger read the same sequence, the one the writer wrote;
- a writer that was told LedgerFenced completes no add afterwards;
- and, at the end (faults stop, bookies return), the ledger is closed and readable (liveness).

A violation raises InvariantViolation carrying the run's recent trace.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass

from walkit.core.dispatch import failure_event as _failure_event, response_event as _response_event
from walkit.core import events as ev
from walkit.core.bookie import BookieHandler, LedgerState, Reply, StoreEntries, StoreLedgerState, unpack_entry
from walkit.core.digest import Digest, master_key
from walkit.core.distribution import write_set_bookies
from walkit.core.messages import (
    AddRequest, ReadLacRequest, ReadRequest, Status, WriteLacRequest,
)
from walkit.core.metadata import CLOSED, LedgerMetadata
from walkit.core.reader import RangeReader
from walkit.core.recovery import LedgerRecovery
from walkit.core.writer import LedgerWriter
from walkit.errors import LedgerFenced

LEDGER_ID = 7
PASSWORD = b"sim"
#: Quorum shapes (E, Qw, Qa) a random configuration picks from.
SHAPES = [(3, 2, 2), (3, 3, 2), (3, 3, 3), (4, 3, 2), (4, 2, 2), (5, 3, 2), (2, 2, 1), (3, 2, 1)]


class InvariantViolation(AssertionError):
    """InvariantViolation reports a broken invariant with the trace that led to it."""

    def __init__(self, seed: int, message: str, trace: list[str]) -> None:
        self.seed = seed
        self.message = message
        self.trace = trace
        tail = "\n".join(trace[-60:])
        super().__init__(f"seed {seed}: {message}\n--- last events ---\n{tail}")


@dataclass(frozen=True)
class SimConfig:
    """SimConfig sets the shape of the cluster and how hostile the run is."""

    bookies: int = 5
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    entries: int = 30
    drop_rate: float = 0.02
    duplicate_rate: float = 0.02
    max_delay_ms: int = 12
    max_sync_ms: int = 4
    metadata_delay_ms: int = 8
    bookie_crashes: int = 2
    writer_crash_rate: float = 0.4
    writer_close_rate: float = 0.5
    recoverers: int = 2
    fault_window_ms: int = 1500
    append_gap_ms: int = 20          # appends come 0..append_gap_ms apart
    recovery_window_ms: int = 0      # recoveries start in 0..this (0: the fault window)
    end_ms: int = 15000
    add_timeout_ms: int = 150
    request_timeout_ms: int = 100

    @classmethod
    def random(cls, rng: random.Random) -> "SimConfig":
        """random picks a quorum shape and fault rates from `rng`."""
        e, qw, qa = rng.choice(SHAPES)
        return cls(bookies=e + rng.randint(1, 2), ensemble=e, write_quorum=qw, ack_quorum=qa,
                   entries=rng.randint(5, 40), drop_rate=rng.choice([0.0, 0.01, 0.05]),
                   duplicate_rate=rng.choice([0.0, 0.02]), max_delay_ms=rng.choice([3, 12, 30]),
                   bookie_crashes=rng.randint(0, 3), writer_crash_rate=0.4, recoverers=rng.randint(1, 3))


class VolatileStorage:
    """VolatileStorage is a bookie's storage: `put`s are volatile until `sync`, lost on a crash."""

    def __init__(self) -> None:
        self.durable: dict[tuple[int, int], bytes] = {}
        self.durable_states: dict[int, LedgerState] = {}
        self.volatile: dict[tuple[int, int], bytes] = {}
        self.volatile_states: dict[int, LedgerState] = {}

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        key = (ledger_id, entry_id)
        return self.volatile.get(key, self.durable.get(key))

    def last_entry(self, ledger_id: int) -> int:
        ids = [e for (l, e) in itertools.chain(self.durable, self.volatile) if l == ledger_id]
        return max(ids, default=-1)

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        return self.volatile_states.get(ledger_id, self.durable_states.get(ledger_id))

    def sync(self) -> None:
        self.durable.update(self.volatile)
        self.durable_states.update(self.volatile_states)
        self.volatile.clear()
        self.volatile_states.clear()

    def crash(self) -> None:
        self.volatile.clear()
        self.volatile_states.clear()


class _SimBookie:
    def __init__(self, address: str) -> None:
        self.address = address
        self.storage = VolatileStorage()
        self.handler = BookieHandler(self.storage)
        self.up = True
        self.held: list[Reply] = []          # durable replies waiting for the next sync
        self.sync_pending = False
        self.incarnation = 0


class _SimClient:
    """_SimClient is the shell around one machine: requests, timeouts and outcomes."""

    def __init__(self, sim: "Simulation", name: str, machine) -> None:
        self.sim = sim
        self.name = name
        self.machine = machine
        self.alive = True
        self.inflight: dict[int, tuple[str, object, int]] = {}     # txn -> (bookie, request, deadline)

    def step(self, event) -> None:
        if self.alive:
            self.execute(self.machine.step(event))

    def execute(self, commands: list) -> None:
        for command in commands:
            self.sim.command(self, command)


class Simulation:
    """Simulation is one seeded run; `run()` returns a summary or raises InvariantViolation.

    `recovery_cls` lets a test substitute a deliberately broken recovery machine.
    """

    def __init__(self, seed: int, config: SimConfig | None = None, recovery_cls=LedgerRecovery) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = config or SimConfig.random(self.rng)
        self.recovery_cls = recovery_cls
        self.now = 0
        self.trace: list[str] = []
        self._queue: list = []
        self._seq = itertools.count()
        self._txns = itertools.count(1)
        self._names = itertools.count(1)
        self._links: dict[tuple[str, str], int] = {}
        self.faults = True
        cfg = self.config
        # A request must be able to outlive a round trip on the slowest link (see _link_delay).
        self.request_timeout_ms = max(cfg.request_timeout_ms, 8 * cfg.max_delay_ms + 2 * cfg.max_sync_ms + 10)
        self.bookies = {f"b{i}": _SimBookie(f"b{i}") for i in range(cfg.bookies)}
        ensemble = tuple(self.rng.sample(sorted(self.bookies), cfg.ensemble))
        self.metadata = LedgerMetadata(ledger_id=LEDGER_ID, ensemble_size=cfg.ensemble,
                                       write_quorum=cfg.write_quorum, ack_quorum=cfg.ack_quorum,
                                       ensembles={0: ensemble})
        self.version = 0
        self.digest = Digest("crc32c", PASSWORD)
        self.master_key = master_key(PASSWORD)
        writer = LedgerWriter(self.metadata, 0, master_key=self.master_key, digest=self.digest,
                              add_timeout_ms=cfg.add_timeout_ms, explicit_lac_ms=50)
        self.writer = _SimClient(self, "writer", writer)
        self.clients: list[_SimClient] = [self.writer]
        self.acked_upto = -1                 # highest entry acknowledged to the writer
        self.writer_failed = False
        self.appended = 0
        self.closed_metadata: LedgerMetadata | None = None
        self.reads: list[list[bytes]] = []
        self.recoveries_started = 0

    # -- scheduling -------------------------------------------------------------------------
    def at(self, delay: int, kind: str, *args) -> None:
        """at schedules an event `delay` ms from now."""
        heapq.heappush(self._queue, (self.now + max(0, delay), next(self._seq), kind, args))

    def log(self, text: str) -> None:
        self.trace.append(f"{self.now:6d} {text}")
        if len(self.trace) > 400:
            del self.trace[:200]

    def fail(self, message: str) -> None:
        raise InvariantViolation(self.seed, message, self.trace)

    def _plan(self) -> None:
        cfg, rng = self.config, self.rng
        window = cfg.fault_window_ms
        t = 0
        for _ in range(cfg.entries):
            t += rng.randint(0, cfg.append_gap_ms)
            self.at(t, "append", rng.randint(1, 3))
        if rng.random() < cfg.writer_close_rate:
            self.at(t + rng.randint(0, 200), "writer_close")
        if rng.random() < cfg.writer_crash_rate:
            self.at(rng.randint(0, window), "writer_crash")
        for _ in range(cfg.bookie_crashes):
            self.at(rng.randint(0, window), "bookie_crash", rng.choice(sorted(self.bookies)))
        for _ in range(cfg.recoverers):
            self.at(rng.randint(0, cfg.recovery_window_ms or window), "recover")
        self.at(window, "quiet")
        self.at(0, "tick")

    # -- run --------------------------------------------------------------------------------
    def run(self) -> dict:
        """run plays the whole schedule, checking invariants after every event."""
        self._plan()
        while self._queue:
            self.now, _, kind, args = heapq.heappop(self._queue)
            if self.now > self.config.end_ms:
                break
            getattr(self, f"_on_{kind}")(*args)
            self._check()
            if self.closed_metadata is not None and self.reads and not self.faults and self._idle():
                break
        self._check_end()
        return {"seed": self.seed, "config": self.config, "acked": self.acked_upto,
                "last_entry_id": self.closed_metadata.last_entry_id, "reads": len(self.reads),
                "recoveries": self.recoveries_started}

    def _idle(self) -> bool:
        return all(not c.alive or getattr(c.machine, "done", False) or c is self.writer for c in self.clients)

    # -- events -----------------------------------------------------------------------------
    def _on_tick(self) -> None:
        tick = ev.Ticked(now_ms=self.now)
        for client in list(self.clients):
            if not client.alive:
                continue
            for txn, (bookie, request, deadline) in list(client.inflight.items()):
                if self.now >= deadline:
                    del client.inflight[txn]
                    event = _failure_event(bookie, request, Status.UNREACHABLE, "timeout")
                    if event is not None:
                        client.step(event)
            client.step(tick)
        for bookie in self.bookies.values():
            if bookie.up:
                self._bookie_apply(bookie, bookie.handler.tick(self.now))
        self.at(10, "tick")

    def _on_append(self, count: int) -> None:
        if not self.writer.alive:
            return
        payloads = [f"e{self.appended + i}".encode() for i in range(count)]
        self.appended += count
        self.log(f"writer appends {count} (up to e{self.appended - 1})")
        self.writer.step(ev.AppendRequested(payloads=payloads))

    def _on_writer_close(self) -> None:
        if self.writer.alive:
            self.log("writer closes")
            self.writer.step(ev.CloseRequested())

    def _on_writer_crash(self) -> None:
        if self.writer.alive:
            self.log("writer CRASHES")
            self.writer.alive = False

    def _on_bookie_crash(self, address: str) -> None:
        bookie = self.bookies[address]
        if not bookie.up or not self.faults:
            return
        self.log(f"bookie {address} CRASHES (loses {len(bookie.storage.volatile)} unsynced entries)")
        bookie.up = False
        bookie.storage.crash()
        bookie.held.clear()
        bookie.sync_pending = False
        bookie.incarnation += 1
        self.at(self.rng.randint(20, 400), "bookie_restart", address)

    def _on_bookie_restart(self, address: str) -> None:
        bookie = self.bookies[address]
        if bookie.up:
            return
        self.log(f"bookie {address} restarts")
        bookie.up = True
        bookie.handler = BookieHandler(bookie.storage)

    def _on_quiet(self) -> None:
        self.log("faults stop; every bookie comes back; a final recovery starts")
        self.faults = False
        for address, bookie in self.bookies.items():
            if not bookie.up:
                self._on_bookie_restart(address)
        self._on_recover()

    def _on_recover(self) -> None:
        if self.closed_metadata is not None:
            self._start_read()
            return
        self.recoveries_started += 1
        name = f"recoverer{self.recoveries_started}"
        self.log(f"{name} starts recovery at metadata version {self.version} ({self.metadata.state})")
        machine = self.recovery_cls(self.metadata, self.version, master_key=self.master_key, digest=self.digest,
                                    timeout_ms=3000, add_timeout_ms=self.config.add_timeout_ms, now_ms=self.now)
        client = _SimClient(self, name, machine)
        self.clients.append(client)
        client.execute(machine.start())

    def _start_read(self) -> None:
        md = self.closed_metadata
        name = f"reader{next(self._names)}"
        machine = RangeReader(md, 0, md.last_entry_id, self.digest, timeout_ms=self.request_timeout_ms,
                              now_ms=self.now)
        client = _SimClient(self, name, machine)
        client.read = []
        client.started_quiet = not self.faults
        self.clients.append(client)
        self.log(f"{name} reads 0..{md.last_entry_id}")
        client.execute(machine.start())

    # -- network ----------------------------------------------------------------------------
    def _link_delay(self, client: _SimClient, bookie: str) -> int:
        """_link_delay draws a delay on the client-bookie link; each link has its own top speed."""
        key = (client.name, bookie)
        top = self._links.get(key)
        if top is None:
            top = self._links[key] = self.rng.choice([2, self.config.max_delay_ms, 4 * self.config.max_delay_ms])
        return self.rng.randint(1, top)

    def _send(self, deliver_kind: str, client: _SimClient, bookie: str, message) -> None:
        rng = self.rng
        if self.faults and rng.random() < self.config.drop_rate:
            self.log(f"DROP {deliver_kind} {_describe(message)}")
            return
        self.at(self._link_delay(client, bookie), deliver_kind, client, bookie, message)
        if self.faults and rng.random() < self.config.duplicate_rate:
            self.at(self._link_delay(client, bookie), deliver_kind, client, bookie, message)

    def _on_to_bookie(self, client: _SimClient, address: str, request) -> None:
        bookie = self.bookies[address]
        if not bookie.up:
            return
        self.log(f"{address} <- {client.name}: {_describe(request)}")
        self._bookie_apply(bookie, bookie.handler.step(client.name.encode(), request), client)

    def _bookie_apply(self, bookie: _SimBookie, commands: list, client: _SimClient | None = None) -> None:
        for command in commands:
            kind = type(command)
            if kind is StoreEntries:
                for entry_id, data in command.entries:
                    bookie.storage.volatile[(command.ledger_id, entry_id)] = data
            elif kind is StoreLedgerState:
                bookie.storage.volatile_states[command.ledger_id] = command.state
            elif kind is Reply:
                if command.durable:
                    bookie.held.append(command)
                else:
                    self._reply(bookie, command)
        if (bookie.held or bookie.storage.volatile or bookie.storage.volatile_states) and not bookie.sync_pending:
            bookie.sync_pending = True
            self.at(self.rng.randint(0, self.config.max_sync_ms), "sync", bookie.address, bookie.incarnation)

    def _on_sync(self, address: str, incarnation: int) -> None:
        bookie = self.bookies[address]
        if not bookie.up or bookie.incarnation != incarnation:
            return
        bookie.storage.sync()
        bookie.sync_pending = False
        held, bookie.held = bookie.held, []
        for reply in held:
            self._reply(bookie, reply)

    def _reply(self, bookie: _SimBookie, reply: Reply) -> None:
        client = next((c for c in self.clients if c.name.encode() == reply.peer), None)
        if client is not None:
            self._send("to_client", client, bookie.address, reply.response)

    def _on_to_client(self, client: _SimClient, address: str, response) -> None:
        if not client.alive:
            return
        found = client.inflight.pop(response.txn, None)
        if found is None:
            return
        _, request, _ = found
        self.log(f"{client.name} <- {address}: {_describe(response)}")
        event = _response_event(address, request, response)
        if event is not None:
            client.step(event)

    # -- commands ---------------------------------------------------------------------------
    def command(self, client: _SimClient, command) -> None:
        """command carries out one machine command for `client` (the simulated shell)."""
        kind = type(command)
        request = None
        if kind is ev.SendAdds:
            request = AddRequest(txn=next(self._txns), ledger_id=command.ledger_id, master_key=command.master_key,
                                 entries=command.entries, recovery=command.recovery)
        elif kind is ev.SendRead:
            request = ReadRequest(txn=next(self._txns), ledger_id=command.ledger_id, entry_ids=command.entry_ids,
                                  fence=command.fence, master_key=command.master_key)
        elif kind is ev.SendReadLac:
            request = ReadLacRequest(txn=next(self._txns), ledger_id=command.ledger_id, fence=command.fence,
                                     master_key=command.master_key)
        elif kind is ev.SendWriteLac:
            request = WriteLacRequest(txn=next(self._txns), ledger_id=command.ledger_id,
                                      master_key=command.master_key, lac=command.lac)
        if request is not None:
            client.inflight[request.txn] = (command.bookie, request, self.now + self.request_timeout_ms)
            self._send("to_bookie", client, command.bookie, request)
            return
        if kind is ev.WriteMetadata:
            self.at(self.rng.randint(1, self.config.metadata_delay_ms), "cas", client, command)
        elif kind is ev.ChooseBookies:
            live = [b for b, bookie in self.bookies.items() if bookie.up and b not in command.exclude]
            self.rng.shuffle(live)
            back = frozenset(b for b in command.recheck if self.bookies[b].up)
            self.at(self.rng.randint(1, self.config.metadata_delay_ms), "deliver_event", client,
                    ev.BookiesChosen(ledger_id=command.ledger_id, bookies=live, back=back))
        else:
            self._outcome(client, command)

    def _on_cas(self, client: _SimClient, command: ev.WriteMetadata) -> None:
        if command.expected_version == self.version:
            self.metadata, self.version = command.metadata, self.version + 1
            self.log(f"{client.name} CAS ok -> v{self.version} {_describe_md(self.metadata)}")
            result = ev.MetadataWritten(metadata=self.metadata, version=self.version)
        else:
            self.log(f"{client.name} CAS conflict (expected v{command.expected_version}, at v{self.version})")
            result = ev.MetadataConflict(metadata=self.metadata, version=self.version)
        self.at(self.rng.randint(1, self.config.metadata_delay_ms), "deliver_event", client, result)

    def _on_deliver_event(self, client: _SimClient, event) -> None:
        client.step(event)

    def _outcome(self, client: _SimClient, command) -> None:
        kind = type(command)
        if kind is ev.CompleteAdds:
            if self.writer_failed:
                self.fail(f"the writer completed entry {command.last_entry_id} after it was told LedgerFenced")
            self.log(f"writer: acked up to e{command.last_entry_id}")
            self.acked_upto = max(self.acked_upto, command.last_entry_id)
        elif kind is ev.FailAdds:
            self.log(f"writer: adds fail from e{command.first_entry_id}: {command.error!r}")
            if isinstance(command.error, LedgerFenced):
                self.writer_failed = True
        elif kind in (ev.CompleteClose, ev.FailClose):
            self.log(f"writer: {kind.__name__}")
        elif kind is ev.CompleteRecovery:
            self.log(f"{client.name}: recovered, last entry {command.metadata.last_entry_id}")
            client.alive = False
            self._on_recover()
        elif kind is ev.FailRecovery:
            self.log(f"{client.name}: recovery failed: {command.error}")
            client.alive = False
            self.at(self.rng.randint(10, 200), "recover")
        elif kind is ev.DeliverEntries:
            client.read.extend(e.payload for e in command.entries)
        elif kind is ev.CompleteRead:
            self.reads.append(client.read)
            client.alive = False
            self.log(f"{client.name}: read {len(client.read)} entries")
        elif kind is ev.FailRead:
            self.log(f"{client.name}: read failed: {command.error}")
            client.alive = False
            if client.started_quiet:
                self.fail(f"{client.name} could not read the closed ledger without faults: {command.error}")
            self.at(self.rng.randint(10, 200), "recover")

    # -- invariants -------------------------------------------------------------------------
    def _check(self) -> None:
        md = self.metadata
        for entry_id in range(self.acked_upto + 1):
            write_set = write_set_bookies(entry_id, md.ensemble_at(entry_id), md.write_quorum)
            expected = f"e{entry_id}".encode()
            copies = 0
            for address in write_set:
                data = self.bookies[address].storage.durable.get((LEDGER_ID, entry_id))
                if data is not None and unpack_entry(LEDGER_ID, entry_id, data).payload == expected:
                    copies += 1
            if copies < md.ack_quorum:
                self.fail(f"acknowledged entry {entry_id} is durable on {copies} bookies of its write set "
                          f"{write_set}, fewer than Qa={md.ack_quorum}")
        if md.state == CLOSED:
            if self.closed_metadata is None:
                self.closed_metadata = md
            elif md != self.closed_metadata:
                self.fail(f"metadata changed after CLOSED: {_describe_md(self.closed_metadata)} -> {_describe_md(md)}")
            if self.acked_upto > md.last_entry_id:
                self.fail(f"entry {self.acked_upto} was acknowledged but the ledger closed at {md.last_entry_id}")
        for read in self.reads:
            last = self.closed_metadata.last_entry_id
            expected = [f"e{i}".encode() for i in range(last + 1)]
            if read != expected:
                self.fail(f"a reader read {read[:5]}... ({len(read)} entries), expected e0..e{last}")

    def _check_end(self) -> None:
        if self.closed_metadata is None:
            self.fail(f"the ledger was never closed (state {self.metadata.state}) by t={self.now}")
        if not self.reads:
            self.fail("no reader managed to read the closed ledger")


def _describe(message) -> str:
    name = type(message).__name__
    fields = []
    for attr in ("status", "entries", "entry_ids", "fence", "recovery", "lac"):
        if hasattr(message, attr):
            value = getattr(message, attr)
            if attr == "entries":
                value = [e.entry_id for e in value]
            elif attr == "status":
                value = value.name
            fields.append(f"{attr}={value}")
    return f"{name}({', '.join(fields)})"


def _describe_md(md: LedgerMetadata) -> str:
    return f"{md.state} last={md.last_entry_id} fragments={dict(md.ensembles)}"
