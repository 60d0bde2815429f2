"""walkit.testing.sim.ledger: one ledger written, recovered, tailed and read under seeded faults.

One `Simulation(seed)` is a deterministic run in a simulated World: a writer (LedgerWriter),
recoverers (LedgerRecovery; several may run at once, some while the writer is alive, some crash
midway), LAC readers (LacReader, with and without long poll, while the ledger is OPEN or
IN_RECOVERY) and readers of the closed ledger (RangeReader). Bookies crash and restart, one may
be lost for good or restart on an empty disk (a new disk id: the formatted disk a real bookie
gets after `walkit bookies format-and-rejoin`), the network drops, delays and duplicates,
metadata calls fail or lose their answers, and sessions are lost. After every event the checker
verifies (docs/internals/protocol.md#ack-quorum; TLA+'s AllCommittedEntriesReachAckQuorum):

- every entry acknowledged to the writer is durable on at least Qa bookies of its write set,
  under the metadata currently in the store, with its original payload (a copy a lost or
  emptied disk held counts: it was made, and that one loss is the fault under test);
- once the ledger is CLOSED, no acknowledged entry lies beyond last_entry_id and the metadata
  never changes again;
- no LAC reader reported an entry as confirmed beyond where the ledger closed (no dirty reads);
- all readers of the closed ledger read the same sequence, the one the writer wrote;
- a writer that was told LedgerFenced completes no add afterwards;
- with deferred sync (a fifth of the runs without guaranteed write quorum; bookies sync such
  adds only sometimes, so crashes take back acknowledged, unforced entries): the first check
  holds for every entry a completed force covered instead of every acknowledged one, and every
  LAC a reader reports covers only entries durable on Qa bookies (never what a crash could
  take back);
- with guaranteed write quorum (a third of the random runs): every entry of every fragment but
  the last is durable on all Qw bookies of its write set (TLA+'s TailFragmentsReachWriteQuorum),
  and so is every entry of the closed ledger (AllEntriesOfClosedLedgerReachedWriteQuorum);
- and, at the end (faults stop, bookies return), the ledger is closed and readable, and a live
  writer answered every append, force and close it was asked for, each once (liveness: an
  application waiting on one of them is never left hanging).

A check is re-run only when what it depends on changed (acknowledgements, the metadata, a
close): durable bookie data only grows, so nothing else can break it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from walkit.core import events as ev
from walkit.core.bookie import unpack_entry
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.distribution import write_set_bookies
from walkit.core.metadata import CLOSED, LedgerMetadata, ledger_key
from walkit.core.reader import LacReader, RangeReader
from walkit.core.recovery import LedgerRecovery
from walkit.core.writer import DEFAULT_MAX_BYTES_IN_FLIGHT, LedgerWriter
from walkit.errors import LedgerFenced
from walkit.testing.sim.world import ReadBounds, Scenario, World

LEDGER_ID = 7
PASSWORD = b"sim"
#: Quorum shapes (E, Qw, Qa) a random configuration picks from.
SHAPES = [(3, 2, 2), (3, 3, 2), (3, 3, 3), (4, 3, 2), (4, 2, 2), (5, 3, 2), (2, 2, 1), (3, 2, 1)]


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
    metadata_fault_rate: float = 0.0
    session_losses: int = 0
    bookie_crashes: int = 2
    lost_bookies: int = 0            # bookies that crash and never come back
    wiped_bookies: int = 0           # bookies that crash and come back on an empty disk
    writer_crash_rate: float = 0.4
    writer_close_rate: float = 0.5
    recoverers: int = 2
    recoverer_crash_rate: float = 0.0
    lac_readers: int = 0
    fault_window_ms: int = 1500
    append_gap_ms: int = 20          # appends come 0..append_gap_ms apart
    recovery_window_ms: int = 0      # recoveries start in 0..this (0: the fault window)
    end_ms: int = 15000
    add_timeout_ms: int = 150
    request_timeout_ms: int = 100
    guaranteed_write_quorum: bool = False
    max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT   # small: appends queue in the writer (backpressure)
    deferred_sync: bool = False
    forces: int = 0                  # force requests spread over the appends (deferred sync)
    read_bytes: int = 0              # every bookie's bound on a read answer (0: drawn per seed, world.ReadBounds)

    @classmethod
    def random(cls, rng: random.Random, hard: bool = False) -> "SimConfig":
        """random picks a quorum shape and fault rates from `rng`; `hard` draws only from the
        hostile end of each range (every run has faults of every kind; see HARD in the docs)."""
        if hard:
            return cls._hard(rng)
        e, qw, qa = rng.choice(SHAPES)
        spare = rng.randint(1, 2)
        lost = 1 if qa >= 2 and spare >= 1 and rng.random() < 0.2 else 0
        config = cls(bookies=e + spare, ensemble=e, write_quorum=qw, ack_quorum=qa,
                     entries=rng.randint(5, 40), drop_rate=rng.choice([0.0, 0.01, 0.05]),
                     duplicate_rate=rng.choice([0.0, 0.02]), max_delay_ms=rng.choice([3, 12, 30]),
                     metadata_fault_rate=rng.choice([0.0, 0.0, 0.05, 0.15]), session_losses=rng.choice([0, 0, 1, 2]),
                     bookie_crashes=rng.randint(0, 3), lost_bookies=lost, writer_crash_rate=0.4,
                     recoverers=rng.randint(1, 3), recoverer_crash_rate=rng.choice([0.0, 0.3]),
                     lac_readers=rng.randint(0, 3), guaranteed_write_quorum=rng.random() < 0.33,
                     max_bytes_in_flight=rng.choice([DEFAULT_MAX_BYTES_IN_FLIGHT] * 2 + [1, 8]))
        if not config.guaranteed_write_quorum and rng.random() < 0.2:     # drawn last: older seeds keep their runs
            config = replace(config, deferred_sync=True, forces=rng.randint(0, 4))
        if qa >= 2 and not lost and rng.random() < 0.3:
            config = replace(config, wiped_bookies=1)
        return config

    @classmethod
    def _hard(cls, rng: random.Random) -> "SimConfig":
        e, qw, qa = rng.choice(SHAPES)
        spare = rng.randint(1, 2)
        lost = 1 if qa >= 2 and rng.random() < 0.3 else 0
        config = cls(bookies=e + spare, ensemble=e, write_quorum=qw, ack_quorum=qa,
                     entries=rng.randint(15, 40), drop_rate=rng.choice([0.01, 0.05, 0.1]),
                     duplicate_rate=0.02, max_delay_ms=rng.choice([12, 30]),
                     metadata_fault_rate=rng.choice([0.0, 0.05, 0.15]), session_losses=rng.choice([0, 1, 2]),
                     bookie_crashes=rng.randint(1, 3), lost_bookies=lost, writer_crash_rate=rng.choice([0.4, 0.8]),
                     writer_close_rate=rng.choice([0.2, 0.5]), recoverers=rng.randint(2, 3),
                     recoverer_crash_rate=rng.choice([0.0, 0.3]), lac_readers=rng.randint(1, 3),
                     guaranteed_write_quorum=rng.random() < 0.33, read_bytes=rng.choice([0, 0, 1, 60]),
                     max_bytes_in_flight=rng.choice([DEFAULT_MAX_BYTES_IN_FLIGHT, 1, 8]))
        if not config.guaranteed_write_quorum and rng.random() < 0.3:
            config = replace(config, deferred_sync=True, forces=rng.randint(1, 4))
        if qa >= 2 and not lost and rng.random() < 0.5:
            config = replace(config, wiped_bookies=1)
        return config


class _Owner:
    """_Owner is a machine run by a simulated process, and what happens to its outcomes."""

    def __init__(self, sim: "Simulation", name: str, machine, on_outcome) -> None:
        self.sim = sim
        self.name = name
        self.machine = machine
        self.outcome = on_outcome
        self.read: list[bytes] = []


class Simulation(Scenario):
    """Simulation is one seeded run of the ledger scenario; `run()` returns a summary or raises.

    `recovery_cls` and `writer_cls` let a test substitute deliberately broken machines.
    """

    def __init__(self, seed: int, config: SimConfig | None = None, recovery_cls=LedgerRecovery,
                 writer_cls=LedgerWriter, hard: bool = False) -> None:
        self.seed = seed
        config_rng = random.Random(seed)
        self.config = cfg = config or SimConfig.random(config_rng, hard)
        self.recovery_cls = recovery_cls
        self.world = world = World(
            seed, bookies=cfg.bookies, drop_rate=cfg.drop_rate, duplicate_rate=cfg.duplicate_rate,
            max_delay_ms=cfg.max_delay_ms, max_sync_ms=cfg.max_sync_ms, metadata_delay_ms=cfg.metadata_delay_ms,
            metadata_fault_rate=cfg.metadata_fault_rate, request_timeout_ms=cfg.request_timeout_ms,
            after_step=self._check, read_bounds=ReadBounds({}, every=cfg.read_bytes) if cfg.read_bytes else None)
        world.on_store_change = self._on_store_change
        self.rng = world.rng
        ensemble = tuple(self.rng.sample(sorted(world.bookies), cfg.ensemble))
        self.digest = Digest("crc32c", PASSWORD)
        self.master_key = master_key(PASSWORD)
        metadata = LedgerMetadata(ledger_id=LEDGER_ID, ensemble_size=cfg.ensemble, write_quorum=cfg.write_quorum,
                                  ack_quorum=cfg.ack_quorum, ensembles={0: ensemble},
                                  disks={0: tuple(world.bookies[b].disk for b in ensemble)},
                                  password_check=password_check(PASSWORD),
                                  guaranteed_write_quorum=cfg.guaranteed_write_quorum)
        world.store.data[ledger_key(LEDGER_ID)] = (metadata.to_bytes(), 0)
        self.metadata = metadata
        self.writer_process = world.process("writer")
        machine = writer_cls(metadata, 0, master_key=self.master_key, digest=self.digest,
                               add_timeout_ms=cfg.add_timeout_ms, explicit_lac_ms=50,
                               max_bytes_in_flight=cfg.max_bytes_in_flight, deferred_sync=cfg.deferred_sync)
        self.writer = _Owner(self, "writer", machine, self._writer_outcome)
        self.writer_process.attach(self.writer, [])
        self.acked_upto = -1                 # highest entry acknowledged to the writer
        self.forced_upto = -1                # highest entry a completed force covered (deferred sync)
        self._force_targets: dict[int, int] = {}   # force token -> last entry appended before it
        self._checked_upto = -1              # acknowledged entries checked since the last change
        self.writer_failed = False
        self.appended = 0
        self.failed_from: int | None = None  # the first entry a FailAdds failed (and every later one)
        self.forces_pending: set[int] = set()   # force tokens the writer has not answered yet
        self.close_requested = False
        self.close_answers = 0               # CompleteClose and FailClose the writer gave
        self.closed_metadata: LedgerMetadata | None = None
        self.reads: list[list[bytes]] = []
        self.lacs: list[int] = []            # every LAC a LacReader reported
        self.recoveries_started = 0
        self._names = 0

    # -- the plan -------------------------------------------------------------------------------
    def _plan(self) -> None:
        cfg, rng, world = self.config, self.rng, self.world
        window = cfg.fault_window_ms
        t = 0
        for _ in range(cfg.entries):
            t += rng.randint(0, cfg.append_gap_ms)
            world.at(t, self._append, rng.randint(1, 3))
        for token in range(cfg.forces):
            world.at(rng.randint(0, t + window), self._force, token)
        if rng.random() < cfg.writer_close_rate:
            world.at(t + rng.randint(0, 200), self._writer_close)
        if rng.random() < cfg.writer_crash_rate:
            world.at(rng.randint(0, window), self.writer_process.crash)
        for _ in range(cfg.bookie_crashes):
            world.at(rng.randint(0, window), self._crash_bookie, rng.choice(sorted(world.bookies)), False)
        for _ in range(cfg.lost_bookies):
            world.at(rng.randint(0, window), self._crash_bookie, rng.choice(sorted(world.bookies)), True)
        for _ in range(cfg.wiped_bookies):
            world.at(rng.randint(0, window), self._wipe_bookie, rng.choice(sorted(self.metadata.current_ensemble)))
        for _ in range(cfg.session_losses):
            world.at(rng.randint(0, window), self._lose_session)
        for _ in range(cfg.recoverers):
            world.at(rng.randint(0, cfg.recovery_window_ms or window), self._recover)
        for _ in range(cfg.lac_readers):
            world.at(rng.randint(0, window), self._read_lac, rng.random() < 0.5)
        world.at(window, self._quiet)
        world.tick_every(10)

    def run(self) -> dict:
        """run plays the whole schedule, checking invariants after every event."""
        self._plan()
        world = self.world
        world.run(self.config.end_ms, lambda: self.closed_metadata is not None and self.reads and not world.faults
                  and self._idle() and self._writer_settled())
        self._check_end()
        return {"seed": self.seed, "config": self.config, "acked": self.acked_upto, "durable": self.durable_upto,
                "last_entry_id": self.closed_metadata.last_entry_id, "reads": len(self.reads),
                "recoveries": self.recoveries_started}

    def _idle(self) -> bool:
        return all(not p.alive or p is self.writer_process or all(getattr(o.machine, "done", False) for o in p.owners)
                   for p in self.world.processes.values())

    # -- events ---------------------------------------------------------------------------------
    def _append(self, count: int) -> None:
        if not self.writer_process.alive:
            return
        payloads = [f"e{self.appended + i}".encode() for i in range(count)]
        self.appended += count
        self.log("writer appends %d (up to e%d)", count, self.appended - 1)
        self.writer_process.deliver(self.writer, ev.AppendRequested(payloads=payloads))

    def _force(self, token: int) -> None:
        if not self.writer_process.alive:
            return
        self._force_targets[token] = self.appended - 1
        self.forces_pending.add(token)
        self.log("writer forces (token %d, up to e%d)", token, self.appended - 1)
        self.writer_process.deliver(self.writer, ev.ForceRequested(token=token))

    def _writer_close(self) -> None:
        if self.writer_process.alive:
            self.log("writer closes")
            self.close_requested = True
            self.writer_process.deliver(self.writer, ev.CloseRequested())

    def _crash_bookie(self, address: str, forever: bool) -> None:
        world = self.world
        if not world.faults:
            return
        if forever:
            alive = [b for b in world.bookies.values() if not b.lost]
            if len(alive) <= self.config.ensemble or any(b.lost for b in world.bookies.values()):
                return          # keep enough bookies, and at most one (< Qa) lost for good
        world.crash_bookie(address, forever)

    def _wipe_bookie(self, address: str) -> None:
        if self.world.faults:
            self.world.crash_bookie(address, wipe=True)

    def _lose_session(self) -> None:
        live = [p for p in self.world.processes.values() if p.alive]
        if live and self.world.faults:
            self.world.lose_session(self.rng.choice(live))

    def _quiet(self) -> None:
        world = self.world
        self.log("faults stop; every bookie comes back; a final recovery starts")
        world.faults = False
        for address, bookie in world.bookies.items():
            if not bookie.up and not bookie.lost:
                world.restart_bookie(address)
        self._recover()

    def _new_process(self, prefix: str):
        self._names += 1
        return self.world.process(f"{prefix}{self._names}")

    def _current_metadata(self) -> tuple[LedgerMetadata, int]:
        value, version = self.world.store.data[ledger_key(LEDGER_ID)]
        return LedgerMetadata.from_bytes(value), version

    def _recover(self) -> None:
        if self.closed_metadata is not None:
            self._start_read()
            return
        self.recoveries_started += 1
        process = self._new_process("recoverer")
        metadata, version = self._current_metadata()
        self.log("%s starts recovery at metadata version %d (%s)", process.name, version, metadata.state)
        machine = self.recovery_cls(metadata, version, master_key=self.master_key, digest=self.digest,
                                    timeout_ms=3000, add_timeout_ms=self.config.add_timeout_ms, now_ms=self.world.now)
        owner = _Owner(self, process.name, machine, lambda command: self._recovery_outcome(process, command))
        if self.world.faults and self.rng.random() < self.config.recoverer_crash_rate:
            self.world.at(self.rng.randint(1, 300), process.crash)
        process.attach(owner, machine.start())

    def _read_lac(self, long_poll: bool) -> None:
        metadata, _ = self._current_metadata()
        if metadata.state == CLOSED:
            return
        process = self._new_process("lac")
        previous = self.acked_upto if long_poll else -2
        machine = LacReader(metadata, previous_lac=previous, timeout_ms=200 if long_poll else 0)
        self.log("%s reads the LAC (%s, ledger %s)", process.name, "long poll" if long_poll else "once", metadata.state)

        def outcome(command) -> None:
            if type(command) is ev.CompleteRead:
                self.log("%s: LAC %d", process.name, command.lac)
                self.lacs.append(command.lac)
                self._check_lacs()
        process.attach(_Owner(self, process.name, machine, outcome), machine.start())

    def _start_read(self) -> None:
        md = self.closed_metadata
        process = self._new_process("reader")
        machine = RangeReader(md, 0, md.last_entry_id, self.digest, timeout_ms=self.world.request_timeout_ms,
                              speculative_ms=self.world.request_timeout_ms // 4, now_ms=self.world.now)
        owner = _Owner(self, process.name, machine, None)
        started_quiet = not self.world.faults
        owner.outcome = lambda command: self._reader_outcome(process, owner, started_quiet, command)
        self.log("%s reads 0..%d", process.name, md.last_entry_id)
        process.attach(owner, machine.start())

    # -- outcomes -------------------------------------------------------------------------------
    def _writer_outcome(self, command) -> None:
        kind = type(command)
        if kind is ev.CompleteAdds:
            if self.writer_failed:
                self.fail(f"the writer completed entry {command.last_entry_id} after it was told LedgerFenced")
            self.log("writer: acked up to e%d", command.last_entry_id)
            self.acked_upto = max(self.acked_upto, command.last_entry_id)
        elif kind is ev.CompleteForce:
            if self.writer_failed:
                self.fail(f"the writer completed forces {command.tokens} after it was told LedgerFenced")
            target = max(self._force_targets[t] for t in command.tokens)
            if command.last_entry_id < target:
                self.fail(f"forces {command.tokens} completed at LAC {command.last_entry_id}, below e{target}")
            self.log("writer: forced up to e%d (tokens %s)", command.last_entry_id, command.tokens)
            self.forced_upto = max(self.forced_upto, target)
            self._answered_forces(command.tokens)
        elif kind is ev.FailForce:
            self.log("writer: forces %s fail: %r", command.tokens, command.error)
            self._answered_forces(command.tokens)
        elif kind is ev.FailAdds:
            self.log("writer: adds fail from e%d: %r", command.first_entry_id, command.error)
            if isinstance(command.error, LedgerFenced):
                self.writer_failed = True
            if self.failed_from is None or command.first_entry_id < self.failed_from:
                self.failed_from = command.first_entry_id
        elif kind is ev.CompleteClose or kind is ev.FailClose:
            self.close_answers += 1
            if self.close_answers > 1 or not self.close_requested:
                self.fail(f"the writer answered a close {self.close_answers} times (asked: {self.close_requested})")
            self.log("writer: %s", kind.__name__)
        else:
            self.log("writer: %s", kind.__name__)

    def _answered_forces(self, tokens) -> None:
        for token in tokens:
            if token not in self.forces_pending:
                self.fail(f"the writer answered force {token} twice, or one it was never asked")
            self.forces_pending.discard(token)

    def _writer_settled(self) -> bool:
        """_writer_settled: a live writer answered every append, force and close it was asked for."""
        if not self.writer_process.alive:
            return True
        # every entry is acknowledged, or failed by a FailAdds (which fails every later one too)
        adds_answered = self.acked_upto + 1 >= (self.appended if self.failed_from is None else self.failed_from)
        return adds_answered and not self.forces_pending and (self.close_answers > 0 or not self.close_requested)

    def _recovery_outcome(self, process, command) -> None:
        kind = type(command)
        if kind is ev.CompleteRecovery:
            self.log("%s: recovered, last entry %d", process.name, command.metadata.last_entry_id)
            process.alive = False
            self._recover()
        elif kind is ev.FailRecovery:
            self.log("%s: recovery failed: %s", process.name, command.error)
            process.alive = False
            self.world.at(self.rng.randint(10, 200), self._recover)

    def _reader_outcome(self, process, owner, started_quiet: bool, command) -> None:
        kind = type(command)
        if kind is ev.DeliverEntries:
            owner.read.extend(e.payload for e in command.entries)
            process.deliver(owner, ev.EntriesConsumed(upto=command.entries[-1].entry_id))
        elif kind is ev.CompleteRead:
            self.reads.append(owner.read)
            process.alive = False
            self.log("%s: read %d entries", process.name, len(owner.read))
            last = self.closed_metadata.last_entry_id
            if owner.read != [f"e{i}".encode() for i in range(last + 1)]:
                self.fail(f"a reader read {owner.read[:5]}... ({len(owner.read)} entries), expected e0..e{last}")
        elif kind is ev.FailRead:
            self.log("%s: read failed: %s", process.name, command.error)
            process.alive = False
            if started_quiet:
                self.fail(f"{process.name} could not read the closed ledger without faults: {command.error}")
            self.world.at(self.rng.randint(10, 200), self._recover)

    # -- invariants -------------------------------------------------------------------------------
    def _on_store_change(self, key: str, before, after) -> None:
        if after is None:
            return
        metadata = LedgerMetadata.from_bytes(after[0])
        if self.closed_metadata is not None and metadata != self.closed_metadata:
            self.fail(f"metadata changed after CLOSED: {_describe(self.closed_metadata)} -> {_describe(metadata)}")
        self.log("metadata v%d: %s", after[1], _describe(metadata))
        self.metadata = metadata
        self._checked_upto = -1          # write sets may have changed: check every acked entry again
        if metadata.state == CLOSED and self.closed_metadata is None:
            self.closed_metadata = metadata
            self._check_lacs()
        if metadata.guaranteed_write_quorum:
            self._check_write_quorum(metadata)

    @property
    def durable_upto(self) -> int:
        """durable_upto is the highest entry the writer promised durable: acknowledged, or forced with deferred sync."""
        return self.forced_upto if self.config.deferred_sync else self.acked_upto

    def _check(self) -> None:
        md = self.metadata
        durable_upto = self.durable_upto
        if self._checked_upto < durable_upto:
            bookies = self.world.bookies
            for entry_id in range(self._checked_upto + 1, durable_upto + 1):
                write_set = write_set_bookies(entry_id, md.ensemble_at(entry_id), md.write_quorum)
                expected = f"e{entry_id}".encode()
                copies = 0
                for address in write_set:
                    data = bookies[address].durable_copy((LEDGER_ID, entry_id))
                    if data is not None and unpack_entry(LEDGER_ID, entry_id, data).payload == expected:
                        copies += 1
                if copies < md.ack_quorum:
                    self.fail(f"{'forced' if self.config.deferred_sync else 'acknowledged'} entry {entry_id} is "
                              f"durable on {copies} bookies of its write set {write_set}, fewer than Qa={md.ack_quorum}")
            self._checked_upto = durable_upto
        closed = self.closed_metadata
        if closed is not None:
            if durable_upto > closed.last_entry_id:
                self.fail(f"entry {durable_upto} was acknowledged but the ledger closed at {closed.last_entry_id}")

    def _copies(self, md: LedgerMetadata, entry_id: int) -> tuple[int, tuple[str, ...]]:
        """_copies counts the bookies of an entry's write set that hold it durably, as written."""
        write_set = write_set_bookies(entry_id, md.ensemble_at(entry_id), md.write_quorum)
        expected = f"e{entry_id}".encode()
        copies = 0
        for address in write_set:          # a bookie lost for good, or emptied, still counts: it reached it
            data = self.world.bookies[address].durable_copy((LEDGER_ID, entry_id))
            if data is not None and unpack_entry(LEDGER_ID, entry_id, data).payload == expected:
                copies += 1
        return copies, write_set

    def _check_write_quorum(self, md: LedgerMetadata) -> None:
        """_check_write_quorum checks TailFragmentsReachWriteQuorum, and AllEntriesOfClosedLedgerReachedWriteQuorum once closed."""
        starts = md.fragment_starts
        ranges = [(first, following - 1) for first, following in zip(starts, starts[1:])]
        if md.state == CLOSED:
            ranges.append((starts[-1], md.last_entry_id))
        for first, last in ranges:
            for entry_id in range(first, last + 1):
                copies, write_set = self._copies(md, entry_id)
                if copies < md.write_quorum:
                    what = "the closed ledger" if entry_id >= starts[-1] else f"the fragment at {first}"
                    self.fail(f"guaranteed write quorum: entry {entry_id} of {what} is durable on {copies} "
                              f"bookies of its write set {write_set}, fewer than Qw={md.write_quorum}")

    def _check_lacs(self) -> None:
        closed = self.closed_metadata
        if closed is not None and self.lacs and max(self.lacs) > closed.last_entry_id:
            self.fail(f"a LAC reader reported entry {max(self.lacs)} confirmed, but the ledger closed at "
                      f"{closed.last_entry_id} (a dirty read)")
        if self.lacs and self.config.deferred_sync and closed is None:
            md = self.metadata
            for entry_id in range(max(self.lacs) + 1):
                copies, write_set = self._copies(md, entry_id)
                if copies < md.ack_quorum:
                    self.fail(f"a LAC reader reported entry {max(self.lacs)} confirmed, but entry {entry_id} is "
                              f"durable on {copies} bookies of {write_set}, fewer than Qa={md.ack_quorum}")

    def _check_end(self) -> None:
        if self.closed_metadata is None:
            self.fail(f"the ledger was never closed (state {self.metadata.state}) by t={self.world.now}")
        if not self.reads:
            self.fail("no reader managed to read the closed ledger")
        if not self._writer_settled():
            self.fail(f"the writer left requests unanswered: appended {self.appended}, acknowledged up to "
                      f"e{self.acked_upto}, failed from {self.failed_from}, forces {sorted(self.forces_pending)}, "
                      f"close asked {self.close_requested} and answered {self.close_answers} times")


def _describe(md: LedgerMetadata) -> str:
    return f"{md.state} last={md.last_entry_id} fragments={dict(md.ensembles)}"
