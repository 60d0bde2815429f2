"""walkit.testing.sim.unbounded: writers battle for one unbounded ledger across terms.

The rules: docs/internals/protocol.md#unbounded-ledgers.

One `UnboundedSimulation(seed)` runs in the simulated World: an unbounded ledger (guaranteed
write quorum, terms instead of the fence flag) written by a writer in term 1, then taken over
again and again by writer processes that reopen it (LedgerRecovery with reopen: a new term, a
recovery, the truncating no-op, OPEN again) and append in their term, while earlier writers
may still be alive and appending, bookies crash and restart (one may be lost for good), the
network drops, delays and duplicates, and metadata calls fail. At the end the faults stop, a
last writer takes over, appends and closes, and a reader reads the whole ledger.

In half the seeds (drawn from a generator of their own, so the other half run as before) the
writers rotate fragments (small fragment limits: a few entries, a few payload bytes, a few
hundred ms; walkit.core.writer), a client truncates the ledger now and then (up to the highest
entry any writer acknowledged), and the bookies' garbage collection drops their entries below
the ledger's first entry, up to the last fragment's start, a little after it read the metadata
(walkit.bookie.server; kept across crashes, as a storage keeps a trim). Entries below the
first entry are then no longer checked, and the reader starts at it.

After every event the checker verifies the invariants of Vanlightly's TLA+ specification
(ProtocolUnboundedLedgersAndGWQ), on the bookies' durable data and the metadata in the store:

- no two terms acknowledged different payloads under one entry id, and every acknowledged entry
  is durable on at least Qa bookies of its write set with its payload;
- NoLogDivergence: bookies of an entry's write set that hold it at or below their LAC hold the
  same payload;
- NoDirtyReads: a bookie's LAC names an entry held by at least Qa bookies of its write set;
- TailFragmentsReachWriteQuorum: every entry of every fragment but the last is on all Qw
  bookies of its write set (and, once closed, every entry: AllEntriesOfClosedLedgerReachedWriteQuorum);
- a writer told LedgerFenced completes no add afterwards, and no two recoveries reopen the
  ledger in the same term;
- at the end the reader sees every acknowledged payload once, at its entry id, in order, and
  no no-op entries, and nothing but payloads some writer appended; and every writer still
  running answered each append it took, acknowledged or failed (the run waits for that).

`recovery_cls` lets a test remove the truncating no-op (LedgerRecovery.TRUNCATE_ON_REOPEN) and watch
the checker find the log divergence (docs/internals/protocol.md#log-divergence); `writer_cls`
substitutes a broken writer; a subclass with TRIM_UP_TO_LAST_FRAGMENT False trims up to the first
entry alone, and the checker finds the acknowledged entries a recovery then loses.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace

from walkit.core import events as ev
from walkit.core.bookie import is_tombstone, unpack_entry
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.distribution import write_set_bookies
from walkit.core.messages import NOOP_PAYLOAD
from walkit.core.metadata import CLOSED, OPEN, LedgerMetadata, ledger_key
from walkit.core.reader import RangeReader
from walkit.core.recovery import LedgerRecovery
from walkit.core.writer import LedgerWriter
from walkit.errors import LedgerFenced
from walkit.testing.sim.world import Scenario, World

LEDGER_ID = 9
PASSWORD = b"sim"
SHAPES = [(3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (3, 2, 1), (4, 2, 2)]
#: Rotation, truncation and garbage collection are drawn from a generator of their own: seed ^ this.
_ROTATION_SALT = 0x0F4A_6E27


@dataclass(frozen=True)
class UnboundedSimConfig:
    """UnboundedSimConfig sets the cluster's shape and how hostile a battle of writers is."""

    bookies: int = 5
    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    appends: int = 30
    takeovers: int = 3               # writers that reopen the ledger while the faults last
    drop_rate: float = 0.02
    duplicate_rate: float = 0.02
    max_delay_ms: int = 12
    max_sync_ms: int = 4
    metadata_delay_ms: int = 8
    metadata_fault_rate: float = 0.0
    bookie_crashes: int = 2
    lost_bookies: int = 0
    writer_crash_rate: float = 0.3
    fault_window_ms: int = 1500
    append_gap_ms: int = 25
    end_ms: int = 20000
    add_timeout_ms: int = 150
    request_timeout_ms: int = 100
    fragment_max_entries: int = 0    # the writers' fragment limits (0: off)
    fragment_max_bytes: int = 0
    fragment_max_ms: int = 0
    truncations: int = 0             # times a client truncates the ledger while the faults last
    gc_period_ms: int = 0            # how often bookies drop entries below the first one (0: never)

    @classmethod
    def random(cls, rng: random.Random, hard: bool = False) -> "UnboundedSimConfig":
        """random picks a quorum shape and fault rates from `rng`; `hard` draws only from the
        hostile end of each range."""
        e, qw, qa = rng.choice(SHAPES)
        spare = rng.randint(1, 2)
        if hard:
            return cls(bookies=e + spare, ensemble=e, write_quorum=qw, ack_quorum=qa, appends=rng.randint(20, 40),
                       takeovers=rng.randint(2, 4), drop_rate=rng.choice([0.01, 0.05]), duplicate_rate=0.02,
                       max_delay_ms=rng.choice([12, 30]), metadata_fault_rate=rng.choice([0.0, 0.05]),
                       bookie_crashes=rng.randint(1, 3), lost_bookies=1 if qa >= 2 and rng.random() < 0.3 else 0,
                       writer_crash_rate=rng.choice([0.3, 0.6]))
        lost = 1 if qa >= 2 and rng.random() < 0.2 else 0
        return cls(bookies=e + spare, ensemble=e, write_quorum=qw, ack_quorum=qa, appends=rng.randint(8, 40),
                   takeovers=rng.randint(1, 4), drop_rate=rng.choice([0.0, 0.01, 0.05]),
                   duplicate_rate=rng.choice([0.0, 0.02]), max_delay_ms=rng.choice([3, 12, 30]),
                   metadata_fault_rate=rng.choice([0.0, 0.0, 0.05]), bookie_crashes=rng.randint(0, 3),
                   lost_bookies=lost, writer_crash_rate=rng.choice([0.0, 0.3, 0.6]))

    def rotating(self, rng: random.Random, hard: bool = False) -> "UnboundedSimConfig":
        """rotating adds fragment limits, truncations and garbage collection in half the draws of
        `rng` (in every draw when `hard`)."""
        if rng.random() < 0.5 and not hard:
            return self
        entries = rng.choice([0, 2, 3, 5, 8])
        size, age = rng.choice([0, 0, 12, 40]), rng.choice([0, 0, 150, 400])       # payloads are ~4 bytes
        return replace(self, fragment_max_entries=entries or (0 if size or age else 3), fragment_max_bytes=size,
                       fragment_max_ms=age, truncations=rng.randint(0, 4), gc_period_ms=rng.choice([30, 100, 300]))


class _Owner:
    """_Owner is one machine a simulated process runs, and what happens to its outcomes."""

    def __init__(self, machine, outcome) -> None:
        self.machine = machine
        self.outcome = outcome


class _Writer:
    """_Writer is one writer process: its reopen (a recovery), then its LedgerWriter, and its appends."""

    def __init__(self, name: str, process) -> None:
        self.name = name
        self.process = process
        self.owner: _Owner | None = None         # the LedgerWriter's, once writing
        self.term = 0
        self.payloads: dict[int, bytes] = {}     # entry id -> payload this writer appended there
        self.acked_upto = -1
        self.failed_from: int | None = None      # the first entry of the appends it was told failed
        self.fenced = False
        self.done = False

    def settled(self) -> bool:
        """settled: the writer answered each append it took, acknowledged or failed."""
        failed_from = self.failed_from
        return all(entry_id <= self.acked_upto or (failed_from is not None and entry_id >= failed_from)
                   for entry_id in self.payloads)


class UnboundedSimulation(Scenario):
    """UnboundedSimulation is one seeded battle of writers; `run()` returns a summary or raises."""

    #: Garbage collection never drops entries from the last fragment's start on (walkit.bookie.server).
    TRIM_UP_TO_LAST_FRAGMENT = True

    def __init__(self, seed: int, config: UnboundedSimConfig | None = None, recovery_cls=LedgerRecovery,
                 ensemble: tuple[str, ...] | None = None, writer_cls=LedgerWriter, hard: bool = False) -> None:
        self.seed = seed
        rotation_rng = random.Random(seed ^ _ROTATION_SALT)
        self.config = cfg = config or UnboundedSimConfig.random(random.Random(seed), hard).rotating(rotation_rng, hard)
        self._rotation_rng = rotation_rng          # truncation times and points, GC delays
        self.recovery_cls = recovery_cls
        self.writer_cls = writer_cls
        self._reopened: dict[int, str] = {}            # term -> the writer whose recovery reopened in it
        self.world = world = World(
            seed, bookies=cfg.bookies, drop_rate=cfg.drop_rate, duplicate_rate=cfg.duplicate_rate,
            max_delay_ms=cfg.max_delay_ms, max_sync_ms=cfg.max_sync_ms, metadata_delay_ms=cfg.metadata_delay_ms,
            metadata_fault_rate=cfg.metadata_fault_rate, request_timeout_ms=cfg.request_timeout_ms,
            after_step=self._check)
        world.on_store_change = self._on_store_change
        self._trim_points: dict[str, int] = {}         # bookie -> the entry it dropped the ledger's entries below
        self.trims = 0
        self.fragment_starts: set[int] = set()
        for address, bookie in world.bookies.items():  # bookie data changes only when it syncs
            bookie.storage.sync = self._noting(bookie.storage)
            bookie.storage.put = self._trimming(address, bookie.storage)
        self.rng = world.rng
        self.digest = Digest("crc32c", PASSWORD)
        self.master_key = master_key(PASSWORD)
        ensemble = ensemble or tuple(self.rng.sample(sorted(world.bookies), cfg.ensemble))
        self.metadata = LedgerMetadata(
            ledger_id=LEDGER_ID, ensemble_size=cfg.ensemble, write_quorum=cfg.write_quorum, ack_quorum=cfg.ack_quorum,
            ensembles={0: ensemble}, password_check=password_check(PASSWORD), guaranteed_write_quorum=True,
            unbounded=True, term=1)
        world.store.data[ledger_key(LEDGER_ID)] = (self.metadata.to_bytes(), 0)
        self.writers: list[_Writer] = []
        self.appended: set[bytes] = set()        # every payload handed to some writer
        self.acked: dict[int, tuple[bytes, int]] = {}   # entry id -> (payload, term) acknowledged
        self.acked_upto = -1
        self.closed: LedgerMetadata | None = None
        self.read: list[bytes] | None = None
        self.takeovers_done = 0
        self._values = 0
        self._full = True                      # check every entry (the metadata changed)
        self._changed: set[int] = set()        # entries that changed on some bookie since the last check
        self._new_acks: list[int] = []
        self._lacs: dict[str, int] = {}
        first = self._new_writer()
        self._start_writer(first, self.metadata, 0, -1)

    def _noting(self, storage):
        """_noting wraps a bookie storage's sync to note which entries became durable (to check them)."""
        sync = storage.sync

        def synced() -> None:
            self._changed.update(entry_id for ledger_id, entry_id in storage.volatile if ledger_id == LEDGER_ID)
            sync()
        return synced

    def _trimming(self, address: str, storage):
        """_trimming wraps a bookie storage's put: nothing is stored below its trim point (spi delete_entries)."""
        put = storage.put

        def trimmed_put(ledger_id: int, entry_id: int, data: bytes) -> None:
            if ledger_id != LEDGER_ID or entry_id >= self._trim_points.get(address, 0):
                put(ledger_id, entry_id, data)
        return trimmed_put

    # -- the plan -------------------------------------------------------------------------------
    def _plan(self) -> None:
        cfg, rng, world = self.config, self.rng, self.world
        window = cfg.fault_window_ms
        t = 0
        for _ in range(cfg.appends):
            t += rng.randint(0, cfg.append_gap_ms)
            world.at(t, self._append, rng.randint(1, 3))
        for _ in range(cfg.takeovers):
            world.at(rng.randint(50, window), self._take_over)
        for _ in range(cfg.bookie_crashes):
            world.at(rng.randint(0, window), self._crash_bookie, rng.choice(sorted(world.bookies)), False)
        for _ in range(cfg.lost_bookies):
            world.at(rng.randint(0, window), self._crash_bookie, rng.choice(sorted(world.bookies)), True)
        world.at(window, self._quiet)
        world.tick_every(10)
        for _ in range(cfg.truncations):
            world.at(self._rotation_rng.randint(100, window), self._truncate)
        if cfg.gc_period_ms:
            world.at(cfg.gc_period_ms, self._collect)

    def run(self) -> dict:
        """run plays the battle, checking invariants after every event, then the final read."""
        self._plan()
        self.world.run(self.config.end_ms, lambda: self.read is not None and not self._unsettled())
        if self.read is None:
            self.fail(f"the last writer never closed the ledger and read it back by t={self.world.now} "
                      f"(state {self.metadata.state}, term {self.metadata.term})")
        for writer in self._unsettled():
            waiting = sorted(e for e in writer.payloads if e > writer.acked_upto
                             and (writer.failed_from is None or e < writer.failed_from))
            self.fail(f"{writer.name} (term {writer.term}, still running) never answered its appends of entries "
                      f"{waiting[:5]}: acknowledged up to {writer.acked_upto}, failed from {writer.failed_from}")
        first = self.closed.first_entry_id
        return {"seed": self.seed, "config": self.config, "acked": sum(1 for e in self.acked if e >= first),
                "terms": self.metadata.term, "last_entry_id": self.closed.last_entry_id, "read": len(self.read),
                "takeovers": self.takeovers_done, "first_entry_id": first, "fragments": len(self.fragment_starts),
                "trims": self.trims}

    def _unsettled(self) -> list[_Writer]:
        """_unsettled lists the writers still running that have appends neither acknowledged nor failed."""
        return [w for w in self.writers if w.process.alive and w.owner is not None and not w.settled()]

    # -- writers --------------------------------------------------------------------------------
    def _new_writer(self) -> _Writer:
        name = f"w{len(self.writers) + 1}"
        writer = _Writer(name, self.world.process(name))
        self.writers.append(writer)
        return writer

    def _start_writer(self, writer: _Writer, metadata: LedgerMetadata, version: int, last_entry_id: int) -> None:
        writer.term = metadata.term
        cfg = self.config
        machine = self.writer_cls(metadata, version, master_key=self.master_key, digest=self.digest,
                                  add_timeout_ms=cfg.add_timeout_ms, explicit_lac_ms=50, now_ms=self.world.now,
                                  last_entry_id=last_entry_id, fragment_max_entries=cfg.fragment_max_entries,
                                  fragment_max_bytes=cfg.fragment_max_bytes, fragment_max_ms=cfg.fragment_max_ms)
        writer.owner = _Owner(machine, lambda command: self._writer_outcome(writer, command))
        self.log("%s writes in term %d after entry %d", writer.name, metadata.term, last_entry_id)
        writer.process.attach(writer.owner, [])

    def _take_over(self, final: bool = False) -> None:
        if not self.world.faults and not final:
            return
        writer = self._new_writer()
        value, version = self.world.store.data[ledger_key(LEDGER_ID)]
        metadata = LedgerMetadata.from_bytes(value)
        if metadata.state == CLOSED:
            return
        self.log("%s reopens the ledger (term %d, %s)", writer.name, metadata.term, metadata.state)
        recovery = self.recovery_cls(metadata, version, master_key=self.master_key, digest=self.digest,
                                     timeout_ms=3000, add_timeout_ms=self.config.add_timeout_ms,
                                     now_ms=self.world.now, reopen=True, window=32, holder=writer.name)
        owner = _Owner(recovery, lambda command: self._recovery_outcome(writer, final, command))
        if self.world.faults and self.rng.random() < self.config.writer_crash_rate:
            self.world.at(self.rng.randint(1, 400), writer.process.crash)
        writer.process.attach(owner, recovery.start())

    def _recovery_outcome(self, writer: _Writer, final: bool, command) -> None:
        if type(command) is ev.CompleteRecovery:
            term = command.metadata.term
            if term in self._reopened:
                self.fail(f"{writer.name} and {self._reopened[term]} both reopened the ledger in term {term}")
            self._reopened[term] = writer.name
            self.takeovers_done += 1
            self.log("%s: reopened in term %d after entry %d", writer.name, command.metadata.term,
                     command.last_entry_id)
            self._start_writer(writer, command.metadata, command.version, command.last_entry_id)
            if final:
                self._finish(writer)
        elif type(command) is ev.FailRecovery:
            self.log("%s: reopen failed: %s", writer.name, command.error)
            writer.process.alive = False
            if final:
                self.world.at(self.rng.randint(10, 200), self._take_over, True)

    def _append(self, count: int) -> None:
        live = [w for w in self.writers if w.process.alive and w.owner is not None]
        if not live:
            return
        writer = self.rng.choice(live)
        self._append_to(writer, count)

    def _append_to(self, writer: _Writer, count: int) -> None:
        payloads = []
        for _ in range(count):
            payloads.append(f"v{self._values}".encode())
            self._values += 1
        machine = writer.owner.machine
        first = machine.last_add_pushed + 1
        self.log("%s appends %s", writer.name, b",".join(payloads).decode())
        before = machine.last_add_pushed
        writer.process.deliver(writer.owner, ev.AppendRequested(payloads=payloads))
        if machine.last_add_pushed > before:             # taken (a refused append takes no ids)
            for i, payload in enumerate(payloads):
                writer.payloads[first + i] = payload
                self.appended.add(payload)

    def _writer_outcome(self, writer: _Writer, command) -> None:
        kind = type(command)
        if kind is ev.CompleteAdds:
            if writer.fenced:
                self.fail(f"{writer.name} completed entry {command.last_entry_id} after it was told LedgerFenced")
            for entry_id in range(writer.acked_upto + 1, command.last_entry_id + 1):
                payload = writer.payloads.get(entry_id)
                if payload is None:
                    continue                         # the no-op its recovery wrote, or earlier terms'
                known = self.acked.get(entry_id)
                if known is not None and known[0] != payload:
                    self.fail(f"entry {entry_id} was acknowledged as {known[0]!r} in term {known[1]} and as "
                              f"{payload!r} in term {writer.term}: the log diverged")
                self.acked[entry_id] = (payload, writer.term)
                self.acked_upto = max(self.acked_upto, entry_id)
                self._new_acks.append(entry_id)
            writer.acked_upto = max(writer.acked_upto, command.last_entry_id)
            self.log("%s: acked up to %d", writer.name, command.last_entry_id)
        elif kind is ev.FailAdds:
            self.log("%s: adds fail from %d: %r", writer.name, command.first_entry_id, command.error)
            if writer.failed_from is None or command.first_entry_id < writer.failed_from:
                writer.failed_from = command.first_entry_id
            if isinstance(command.error, LedgerFenced):
                writer.fenced = True
        elif kind is ev.CompleteClose:
            self.log("%s: closed at %d", writer.name, command.metadata.last_entry_id)
            self._read_back(command.metadata)
        elif kind is ev.FailClose:
            self.log("%s: close failed: %s", writer.name, command.error)
            self.world.at(self.rng.randint(10, 200), self._take_over, True)

    def _finish(self, writer: _Writer) -> None:
        """_finish has the last writer append a few payloads, then close the ledger."""
        self._append_to(writer, 3)
        writer.process.deliver(writer.owner, ev.CloseRequested())

    # -- faults ---------------------------------------------------------------------------------
    def _crash_bookie(self, address: str, forever: bool) -> None:
        world = self.world
        if not world.faults:
            return
        if forever:
            alive = [b for b in world.bookies.values() if not b.lost]
            if len(alive) <= self.config.ensemble or any(b.lost for b in world.bookies.values()):
                return
        world.crash_bookie(address, forever)

    def _quiet(self) -> None:
        world = self.world
        self.log("faults stop; every bookie comes back; a last writer takes over")
        world.faults = False
        for address, bookie in world.bookies.items():
            if not bookie.up and not bookie.lost:
                world.restart_bookie(address)
        self._take_over(final=True)

    # -- truncation and garbage collection --------------------------------------------------------
    def _truncate(self) -> None:
        """_truncate is a client's truncate_ledger, before a point no later than the acknowledged entries."""
        key = ledger_key(LEDGER_ID)
        old = self.world.store.data[key]
        metadata = LedgerMetadata.from_bytes(old[0])
        if metadata.state == CLOSED or self.acked_upto < metadata.first_entry_id:
            return
        before = self._rotation_rng.randint(metadata.first_entry_id + 1, self.acked_upto + 1)
        self.log("a client truncates the ledger before entry %d", before)
        self.world.store.apply("put", (key, metadata.truncated(before).to_bytes(), old[1]))
        self._on_store_change(key, old, self.world.store.data[key])

    def _collect(self) -> None:
        """_collect is a garbage collection round of every bookie: the metadata read now, the trims a little later."""
        world = self.world
        metadata = LedgerMetadata.from_bytes(world.store.data[ledger_key(LEDGER_ID)][0])
        point = metadata.first_entry_id
        if metadata.state != CLOSED and self.TRIM_UP_TO_LAST_FRAGMENT:
            point = min(point, metadata.last_fragment_start)
        for address, bookie in world.bookies.items():
            if bookie.up and point > self._trim_points.get(address, 0):
                world.at(self._rotation_rng.randint(0, 40), self._trim, address, point)
        world.at(self.config.gc_period_ms, self._collect)

    def _trim(self, address: str, point: int) -> None:
        """_trim drops a bookie's entries of the ledger below `point`, durably (delete_entries and its sync)."""
        bookie = self.world.bookies[address]
        if not bookie.up or point <= self._trim_points.get(address, 0):
            return
        self._trim_points[address] = point
        self.trims += 1
        storage = bookie.storage
        for held in (storage.durable, storage.volatile):
            for key in [k for k in held if k[0] == LEDGER_ID and k[1] < point]:
                del held[key]
        self.log("bookie %s drops the ledger's entries below %d", address, point)

    # -- the final read -------------------------------------------------------------------------
    def _read_back(self, metadata: LedgerMetadata) -> None:
        self.closed = metadata
        process = self.world.process(f"reader{len(self.writers)}")
        if metadata.first_entry_id > metadata.last_entry_id:
            process.alive = False
            self._check_read(metadata, [])
            return
        reader = _Owner(RangeReader(metadata, metadata.first_entry_id, metadata.last_entry_id, self.digest,
                                    timeout_ms=self.world.request_timeout_ms, now_ms=self.world.now), None)
        got: list[tuple[int, bytes]] = []

        def outcome(command) -> None:
            kind = type(command)
            if kind is ev.DeliverEntries:
                got.extend((e.entry_id, e.payload) for e in command.entries)
                process.deliver(reader, ev.EntriesConsumed(upto=command.entries[-1].entry_id))
            elif kind is ev.CompleteRead:
                process.alive = False
                self._check_read(metadata, got)
            elif kind is ev.FailRead:
                self.fail(f"the reader could not read the closed ledger without faults: {command.error}")
        reader.outcome = outcome
        process.attach(reader, reader.machine.start())

    def _check_read(self, metadata: LedgerMetadata, got: list[tuple[int, bytes]]) -> None:
        records = [(entry_id, payload) for entry_id, payload in got if payload != NOOP_PAYLOAD]
        by_id = dict(records)
        for entry_id, (payload, term) in self.acked.items():
            if entry_id < metadata.first_entry_id:
                continue                              # truncated away
            if by_id.get(entry_id) != payload:
                self.fail(f"the reader read {by_id.get(entry_id)!r} at entry {entry_id}, where {payload!r} "
                          f"was acknowledged in term {term}")
        payloads = [payload for _, payload in records]
        if len(set(payloads)) != len(payloads):
            twice = [p for p, n in Counter(payloads).items() if n > 1]
            self.fail(f"the reader read {twice[:3]} more than once")
        strangers = [p for p in payloads if p not in self.appended]
        if strangers:
            self.fail(f"the reader read payloads no writer appended: {strangers[:3]}")
        self.read = payloads
        self.log("reader: read %d records (%d entries with no-ops)", len(payloads), len(got))

    # -- invariants -----------------------------------------------------------------------------
    def _on_store_change(self, key: str, before, after) -> None:
        if after is None:
            return
        metadata = LedgerMetadata.from_bytes(after[0])
        if self.metadata.state == CLOSED and metadata != self.metadata:
            self.fail(f"the metadata changed after CLOSED: {metadata}")
        if metadata.term < self.metadata.term:
            self.fail(f"the ledger's term went back from {self.metadata.term} to {metadata.term}")
        self.log("metadata v%d: %s term %d first %d fragments %s", after[1], metadata.state, metadata.term,
                 metadata.first_entry_id, dict(metadata.ensembles))
        if metadata.first_entry_id < self.metadata.first_entry_id:
            self.fail(f"the ledger's first entry went back from {self.metadata.first_entry_id} to "
                      f"{metadata.first_entry_id}")
        self.fragment_starts.update(metadata.ensembles)
        self.metadata = metadata
        self._full = True

    def _copies(self, md: LedgerMetadata, entry_id: int) -> list[tuple[str, bytes, int]]:
        """_copies lists (bookie, payload, bookie LAC) of the durable copies in an entry's write set."""
        found = []
        bookies, key = self.world.bookies, (LEDGER_ID, entry_id)
        for address in write_set_bookies(entry_id, md.ensemble_at(entry_id), md.write_quorum):
            bookie = bookies[address]
            data = bookie.storage.durable.get(key)
            if data is not None and not is_tombstone(data):
                found.append((address, data[9 + data[8]:], self._lacs.get(address, -1)))
        return found

    def _check(self) -> None:
        """_check re-checks what the last event could have changed: everything after a metadata
        change, else the entries some bookie synced, newly acknowledged ones, and LAC moves."""
        if not (self._full or self._changed or self._new_acks):
            return                       # a LAC that moved in memory is checked when its add syncs
        md, world = self.metadata, self.world
        lacs = {address: bookie.handler.lac(LEDGER_ID) for address, bookie in world.bookies.items() if bookie.up}
        moved = [(address, self._lacs.get(address, -1), lac) for address, lac in lacs.items()
                 if lac != self._lacs.get(address, -1)]
        self._lacs = lacs
        top = max(self.acked_upto, md.last_entry_id if md.state == CLOSED else -1)
        first = md.first_entry_id                  # entries below it were truncated away
        if self._full:
            ids = set(range(first, top + 1))
            acked = [e for e in self.acked if e >= first]
            watched = set(lacs)
        else:
            ids = {e for e in self._changed if first <= e <= top}
            for _, old, new in moved:
                ids.update(range(max(old + 1, first), min(new, top) + 1))
            acked = [e for e in ids if e in self.acked] + [e for e in self._new_acks if e >= first]
            watched = {address for address, _, _ in moved} | {a for a, lac in lacs.items() if lac in ids}
        self._full, self._changed, self._new_acks = False, set(), []
        qa, qw = self.config.ack_quorum, self.config.write_quorum
        for entry_id in acked:
            payload, term = self.acked[entry_id]
            copies = [c for c in self._copies(md, entry_id) if c[1] == payload]
            if len(copies) < qa:
                self.fail(f"entry {entry_id} ({payload!r}, acknowledged in term {term}) is durable on "
                          f"{len(copies)} bookies of its write set, fewer than Qa={qa}")
        last_start = md.last_fragment_start
        for entry_id in ids:
            copies = self._copies(md, entry_id)
            committed = {payload for _, payload, lac in copies if lac >= entry_id}
            if len(committed) > 1:
                self.fail(f"log divergence: bookies of entry {entry_id}'s write set hold {sorted(committed)} "
                          f"at or below their LAC")
            if entry_id < last_start or md.state == CLOSED:
                agreeing = Counter(payload for _, payload, _ in copies).most_common(1)
                if not agreeing or agreeing[0][1] < qw:
                    self.fail(f"entry {entry_id} is on fewer than Qw={qw} bookies of its write set, but it is "
                              f"not in the last fragment of an open ledger (state {md.state}, fragments "
                              f"{dict(md.ensembles)})")
        for address in watched:
            lac = lacs.get(address, -1)
            if lac < md.first_entry_id or address not in md.ensemble_at(lac):
                continue
            agreeing = Counter(payload for _, payload, _ in self._copies(md, lac)).most_common(1)
            if not agreeing or agreeing[0][1] < qa:
                self.fail(f"dirty read: bookie {address} has LAC {lac}, but that entry is on fewer than "
                          f"Qa={qa} bookies of its write set")


# -- the log-divergence counterexample, scripted (docs/internals/protocol.md#log-divergence) -----
SEED_001 = UnboundedSimConfig(bookies=4, ensemble=3, write_quorum=3, ack_quorum=2, appends=0, takeovers=0,
                              drop_rate=0.0, duplicate_rate=0.0, max_delay_ms=2, bookie_crashes=0,
                              writer_crash_rate=0.0, fault_window_ms=1000)


def seed_001_counterexample(recovery_cls=LedgerRecovery) -> UnboundedSimulation:
    """seed_001_counterexample scripts the log divergence Vanlightly's model checker found
    (docs/internals/protocol.md#log-divergence).

    On bookies b0, b1, b2 (Qw 3, Qa 2): w1 writes A as entry 0 to all three, then B as entry 1,
    which reaches b0 only, and crashes. w2 takes over: b0's answers to its recovery reads are
    lost, b1 and b2 say they lack entry 1, so the recovery ends after entry 0. w2 then appends
    C, which b1 and b2 acknowledge while its add to b0 is lost, and D, which reaches all three
    and carries LAC 1 to b0. Without the truncating no-op, b0 now holds B as a confirmed entry 1
    where b1 and b2 hold C: the checker reports log divergence. With it, b0 dropped B when
    recovery wrote the no-op at entry 1 to every bookie, C and D follow the no-op, and the run
    ends with the ledger closed and read back: A, C, D and the last writer's payloads.

    It returns the simulation, ready to `run()`.
    """
    sim = UnboundedSimulation(1, SEED_001, recovery_cls=recovery_cls, ensemble=("b0", "b1", "b2"))
    first, world = sim.writers[0], sim.world
    lost = _scripted_losses(world)

    def w2_reads_from_b0(name, bookie, message) -> bool:
        return name == "w2" and bookie == "b0" and type(message).__name__ == "ReadRequest"

    world.at(1, sim._append_to, first, 1)                                       # A: entry 0 everywhere
    world.at(40, lost.append, _add_of("w1", {"b1", "b2"}, 1))
    world.at(41, sim._append_to, first, 1)                                      # B: entry 1 on b0 only
    world.at(80, first.process.crash)
    world.at(100, lost.append, w2_reads_from_b0)
    world.at(101, sim._take_over)                                               # w2: a new term

    def after_reopen() -> None:
        writer = sim.writers[-1]
        if writer.owner is None:                                          # still recovering
            world.at(10, after_reopen)
            return
        lost.append(_add_of("w2", {"b0"}, writer.owner.machine.last_add_pushed + 1))
        sim._append_to(writer, 1)                                           # C: b1 and b2 only
        world.at(30, sim._append_to, writer, 1)                             # D: everywhere, LAC 1
    world.at(200, after_reopen)
    return sim


def _scripted_losses(world) -> list:
    """_scripted_losses makes `world` drop every message a rule of the returned list matches."""
    lost: list = []

    def drops(process, bookie, message) -> bool:
        return any(rule(process.name, bookie, message) for rule in lost)
    world.drops = drops
    return lost


def _add_of(writer: str, bookies: set[str], entry_id: int | None = None):
    """_add_of is a rule matching `writer`'s adds carrying entries (of `entry_id`, if given) to `bookies`."""
    def rule(name, bookie, message) -> bool:
        entries = getattr(message, "entries", None)
        return (name == writer and bookie in bookies and type(message).__name__ == "AddRequest" and bool(entries)
                and (entry_id is None or any(e.entry_id == entry_id for e in entries)))
    return rule


# -- a stale bookie brought back by an ensemble change, scripted (docs/internals/protocol.md#stale-bookie) --
STALE_BOOKIE = UnboundedSimConfig(bookies=4, ensemble=3, write_quorum=3, ack_quorum=2, appends=0, takeovers=0,
                                  drop_rate=0.0, duplicate_rate=0.0, max_delay_ms=2, bookie_crashes=0,
                                  writer_crash_rate=0.0, fault_window_ms=1500)


def stale_bookie_counterexample(writer_cls=LedgerWriter) -> UnboundedSimulation:
    """stale_bookie_counterexample scripts the loss that cleaning the bookies a change brings in prevents.

    On b0, b1, b2 (Qw 3, Qa 2), spare b3: w1 writes A as entry 0 everywhere, then B and C as
    entries 1 and 2, which reach b2 only, and crashes. w2 takes over while b2 hears nothing from
    it: entry 1 is absent, b2 is replaced by b3, and the no-op at entry 1 goes to b0, b1 and b3,
    not b2, which keeps w1's C at entry 2. w2 writes D as entry 2; b0 and b1 acknowledge it, its
    add to b3 is lost, so b3 is replaced by b2 in a fragment from entry 2, and the re-send of D
    to b2 is lost too. w3 takes over with its reads from b0 and b1 held for a while: b2 answers
    first. Without the cleaning, b2 still holds C, the recovery writes C back over D, and D,
    acknowledged, is gone: the checker reports it. With it, b2 dropped C when it joined, answers
    that it lacks entry 2, and the recovery waits for b0 and b1, which hold D.

    It returns the simulation, ready to `run()`.
    """
    sim = UnboundedSimulation(2, STALE_BOOKIE, ensemble=("b0", "b1", "b2"), writer_cls=writer_cls)
    first, world = sim.writers[0], sim.world
    lost = _scripted_losses(world)

    def w2_to_b2(name, bookie, message) -> bool:
        return name == "w2" and bookie == "b2"

    def w3_reads_from_b0_b1(name, bookie, message) -> bool:
        return name == "w3" and bookie in ("b0", "b1") and type(message).__name__ == "ReadRequest"

    world.at(1, sim._append_to, first, 1)                                       # A: entry 0 everywhere
    world.at(40, lost.append, _add_of("w1", {"b0", "b1"}))
    world.at(41, sim._append_to, first, 2)                                      # B, C: entries 1, 2 on b2 only
    world.at(80, first.process.crash)
    world.at(100, lost.append, w2_to_b2)
    world.at(101, sim._take_over)                                               # w2: term 2

    def after_reopen() -> None:
        writer = sim.writers[-1]
        if writer.owner is None:                                          # still recovering
            world.at(10, after_reopen)
            return
        lost.remove(w2_to_b2)                  # b2 is reachable again: the change can choose it
        lost.append(_add_of("w2", {"b3"}))      # D never reaches b3: b3 is replaced, by b2
        lost.append(_add_of("w2", {"b2"}))      # and D's re-send to b2 is lost
        sim._append_to(writer, 1)                                           # D: entry 2
    world.at(150, after_reopen)
    world.at(690, lost.append, w3_reads_from_b0_b1)
    world.at(700, sim._take_over)                                               # w3: term 3
    world.at(1000, lost.remove, w3_reads_from_b0_b1)
    return sim
