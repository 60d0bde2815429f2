"""walkit.testing.sim.log: a log with several writers and followers under seeded faults.

One `LogSimulation(seed)` runs real LogMachines (writers) and LogReaders (followers) in a
simulated World. Writers open the log one after another (each fences the one before), append
pipelined records `w<k>-<i>`, roll on their own (`roll_entries`) and on request, truncate
before records they wrote, close, and crash, also at the named failpoints of walkit.core.log.
Followers tail the log from its start and crash too. Bookies crash and restart (one may be lost
for good, or come back on an empty disk with a new disk id), the network drops, delays and duplicates, metadata calls fail or lose their answers
after taking effect, and sessions are lost. When the faults stop, a last writer opens the log,
appends a few records and closes it, perhaps in the middle of a roll, and a last reader reads
the whole log. Each earlier writer still running then either stops, or keeps running and is
asked to close amid whatever it is doing (often while the last writer fences it).

Checked after every event (docs/internals/protocol.md#log-invariants; Vanlightly's LedgerChaining.tla):

- OnlyOneLedgerOpenAtATime: at most two ledgers of the list are not CLOSED, and only the last
  two; every listed ledger exists;
- AllCommittedEntriesReachAckQuorum: every record acknowledged to a writer is durable on Qa
  bookies of its write set under its ledger's current metadata;
- AllNonEmptyLedgersInLedgerList: a ledger leaves the list only once closed (by truncation or
  retention), so no acknowledged record disappears with an unclosed ledger;
- acknowledgements reach each writer in log order, and none after it was told it failed;
- followers get records in strictly increasing positions, each as it was written, and
  LogTruncated only when truncation or retention removed the ledger they were to read next.

At the end: every listed ledger is closed; the last writer, and each earlier writer kept
running, answered its close, and each of its appends, rolls and truncations exactly once; the
history (every ledger ever listed, to its close) holds every acknowledged record, each
writer's records in the order it appended them, writers' records in the order the writers
opened the log; the last reader read exactly the list's part of the
history, and each follower a gap-free slice of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.bookie import unpack_entry
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.distribution import write_set_bookies
from walkit.core.log import LogMachine
from walkit.core.logreader import LogReader
from walkit.core.loglist import LogConfig, LogMetadata, Position, log_key
from walkit.core.metadata import CLOSED, LEDGER_PREFIX, LedgerMetadata, ledger_id_of, ledger_key
from walkit.core.writer import DEFAULT_MAX_BYTES_IN_FLIGHT
from walkit.errors import LogTruncated
from walkit.testing.sim.ledger import SHAPES
from walkit.testing.sim.world import Scenario, World

LOG = "sim-log"
PASSWORD = b"sim-log"
_LOG_KEY = log_key(LOG)


@dataclass(frozen=True)
class LogSimConfig:
    """LogSimConfig sets the shape of a log scenario and how hostile it is."""

    bookies: int = 5
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    roll_entries: int = 3
    retention_age_s: float = 0.0
    writers: int = 3
    appends: int = 10                 # per writer
    append_gap_ms: int = 15
    rolls: int = 1                    # explicit roll requests per writer
    truncations: int = 1              # per writer
    followers: int = 2
    drop_rate: float = 0.02
    duplicate_rate: float = 0.02
    max_delay_ms: int = 10
    max_sync_ms: int = 4
    metadata_delay_ms: int = 8
    metadata_fault_rate: float = 0.05
    session_losses: int = 1
    bookie_crashes: int = 2
    lost_bookies: int = 0
    wiped_bookies: int = 0           # bookies that crash and come back on an empty disk (a new disk id)
    writer_crash_rate: float = 0.3
    failpoint_crash_rate: float = 0.2
    follower_crash_rate: float = 0.2
    fault_window_ms: int = 1500
    end_ms: int = 30000
    add_timeout_ms: int = 150
    request_timeout_ms: int = 100
    max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT   # small: appends queue in the writers (backpressure)

    @classmethod
    def random(cls, rng: random.Random, hard: bool = False) -> "LogSimConfig":
        """random picks a quorum shape, a roll size and fault rates from `rng`; `hard` draws only
        from the hostile end of each range."""
        if hard:
            return cls._hard(rng)
        e, qw, qa = rng.choice(SHAPES)
        spare = rng.randint(1, 2)
        config = cls(bookies=e + spare, ensemble=e, write_quorum=qw, ack_quorum=qa,
                   roll_entries=rng.choice([1, 2, 3, 5, 8]), retention_age_s=rng.choice([0.0, 0.0, 0.3]),
                   writers=rng.randint(1, 4), appends=rng.randint(3, 14), rolls=rng.randint(0, 2),
                   truncations=rng.randint(0, 1), followers=rng.randint(0, 2),
                   drop_rate=rng.choice([0.0, 0.01, 0.04]), duplicate_rate=rng.choice([0.0, 0.02]),
                   max_delay_ms=rng.choice([3, 10, 25]), metadata_fault_rate=rng.choice([0.0, 0.05, 0.15]),
                   session_losses=rng.randint(0, 2), bookie_crashes=rng.randint(0, 3),
                   lost_bookies=1 if qa >= 2 and rng.random() < 0.2 else 0,
                   writer_crash_rate=rng.choice([0.0, 0.3, 0.6]), failpoint_crash_rate=rng.choice([0.0, 0.3]),
                   follower_crash_rate=rng.choice([0.0, 0.3]),
                   max_bytes_in_flight=rng.choice([DEFAULT_MAX_BYTES_IN_FLIGHT] * 2 + [1, 10]))
        if qa >= 2 and not config.lost_bookies and rng.random() < 0.3:     # drawn last: older seeds keep their runs
            config = replace(config, wiped_bookies=1)
        return config

    @classmethod
    def _hard(cls, rng: random.Random) -> "LogSimConfig":
        e, qw, qa = rng.choice(SHAPES)
        spare = rng.randint(1, 2)
        config = cls(bookies=e + spare, ensemble=e, write_quorum=qw, ack_quorum=qa,
                     roll_entries=rng.choice([1, 2, 3]), retention_age_s=rng.choice([0.0, 0.3]),
                     writers=rng.randint(2, 4), appends=rng.randint(8, 14), append_gap_ms=rng.choice([3, 15]),
                     rolls=rng.randint(1, 2), truncations=rng.randint(0, 1), followers=rng.randint(1, 2),
                     drop_rate=rng.choice([0.01, 0.04]), duplicate_rate=0.02,
                     max_delay_ms=rng.choice([10, 25]), metadata_fault_rate=rng.choice([0.0, 0.05, 0.15]),
                     session_losses=rng.randint(0, 2), bookie_crashes=rng.randint(1, 3),
                     lost_bookies=1 if qa >= 2 and rng.random() < 0.3 else 0,
                     writer_crash_rate=rng.choice([0.0, 0.3, 0.6]), failpoint_crash_rate=rng.choice([0.0, 0.3]),
                     follower_crash_rate=rng.choice([0.0, 0.3]),
                     max_bytes_in_flight=rng.choice([DEFAULT_MAX_BYTES_IN_FLIGHT, 1, 10]))
        if qa >= 2 and not config.lost_bookies and rng.random() < 0.5:
            config = replace(config, wiped_bookies=1)
        return config


class _Writer:
    """_Writer is one writer process's LogMachine and what it was told."""

    def __init__(self, sim: "LogSimulation", k: int, machine: LogMachine, process) -> None:
        self.sim = sim
        self.k = k
        self.machine = machine
        self.process = process
        self.payloads: list[bytes] = []       # appended, in order
        self.acked: list[Position] = []       # positions of payloads[:len(acked)]
        self.failed = False
        self.opened = False
        self.closed = False
        self.requests: set[int] = set()      # roll and truncate tokens not answered yet
        self.refused = 0                      # appends refused (the last ones: the writer was not writing)
        self.close_asked = False
        self.close_answered = False           # LogClosed, LogCloseFailed or LogOpenFailed after close_asked

    def settled(self) -> bool:
        """settled: the writer answered its close, each roll and truncation, and each append."""
        return (self.close_answered and not self.requests
                and (self.failed or len(self.acked) + self.refused == len(self.payloads)))

    def outcome(self, command) -> None:
        self.sim._writer_outcome(self, command)


class _Follower:
    """_Follower is one follower process's LogReader and what it delivered."""

    def __init__(self, sim: "LogSimulation", name: str, machine: LogReader, process) -> None:
        self.sim = sim
        self.name = name
        self.machine = machine
        self.process = process
        self.records: list[tuple[Position, bytes]] = []
        self.ended: Exception | None = None
        self.complete = False

    def outcome(self, command) -> None:
        self.sim._follower_outcome(self, command)


class LogSimulation(Scenario):
    """LogSimulation is one seeded run of the log scenario; `run()` returns a summary or raises.

    `writer_cls` lets a test substitute a deliberately broken LogMachine.
    """

    def __init__(self, seed: int, config: LogSimConfig | None = None, writer_cls=LogMachine, hard: bool = False,
                 reader_cls=LogReader) -> None:
        self.seed = seed
        self.config = cfg = config or LogSimConfig.random(random.Random(seed), hard)
        self.writer_cls = writer_cls
        self.reader_cls = reader_cls
        self.world = world = World(
            seed, bookies=cfg.bookies, drop_rate=cfg.drop_rate, duplicate_rate=cfg.duplicate_rate,
            max_delay_ms=cfg.max_delay_ms, max_sync_ms=cfg.max_sync_ms, metadata_delay_ms=cfg.metadata_delay_ms,
            metadata_fault_rate=cfg.metadata_fault_rate, request_timeout_ms=cfg.request_timeout_ms,
            after_step=self._check)
        world.on_store_change = self._on_store_change
        self.rng = world.rng
        self.log_config = LogConfig(ensemble=cfg.ensemble, write_quorum=cfg.write_quorum, ack_quorum=cfg.ack_quorum,
                                    roll_entries=cfg.roll_entries, retention_age_s=cfg.retention_age_s)
        self.digests = {kind: Digest(kind, PASSWORD) for kind in ("crc32c",)}
        self.writers: list[_Writer] = []
        self.followers: list[_Follower] = []
        self.open_order: list[int] = []          # writer numbers in the order their opens succeeded
        self.listed: LogMetadata | None = None   # the list as the store holds it
        self.ever_listed: dict[int, None] = {}   # every ledger the list ever held, in order
        self.truncated: set[int] = set()
        self.ledgers: dict[int, LedgerMetadata] = {}   # current ledger metadata (or last, if deleted)
        self.acked: dict[Position, bytes] = {}
        self._unchecked: set[Position] = set()   # acked positions to check after this step
        self._recheck: set[int] = set()          # ledgers whose acked records need checking again
        self._chain_dirty = False
        self.final_writer: _Writer | None = None
        self.kept: list[_Writer] = []            # earlier writers left running when the faults stop
        self.final_attempts = 0
        self.final_reader: _Follower | None = None
        self.finished = False

    # -- the plan -------------------------------------------------------------------------------
    def _plan(self) -> None:
        cfg, rng, world = self.config, self.rng, self.world
        window = cfg.fault_window_ms
        starts = sorted(rng.randint(0, window * 2 // 3) for _ in range(cfg.writers))
        for k, start in enumerate(starts, 1):
            world.at(start, self._open_writer, k)
        for i in range(cfg.followers):
            world.at(rng.randint(0, window), self._start_follower, f"follower{i + 1}")
        for _ in range(cfg.bookie_crashes):
            world.at(rng.randint(0, window), self._crash_bookie, rng.choice(sorted(world.bookies)), False)
        for _ in range(cfg.lost_bookies):
            world.at(rng.randint(0, window), self._crash_bookie, rng.choice(sorted(world.bookies)), True)
        for _ in range(cfg.wiped_bookies):
            world.at(rng.randint(0, window), self._wipe_bookie, rng.choice(sorted(world.bookies)))
        for _ in range(cfg.session_losses):
            world.at(rng.randint(0, window), self._lose_session)
        world.at(window, self._quiet)
        world.tick_every(10)

    def run(self) -> dict:
        """run plays the whole schedule, checking invariants after every event."""
        self._plan()
        self.world.run(self.config.end_ms, self._done)
        self._check_end()
        return {"seed": self.seed, "config": self.config, "acked": len(self.acked),
                "ledgers": len(self.ever_listed), "writers": len(self.open_order),
                "followed": sum(len(f.records) for f in self.followers)}

    # -- actors ---------------------------------------------------------------------------------
    def _new_writer(self, k: int) -> _Writer:
        world = self.world
        process = world.process(f"writer{k}")
        # Replacing a bookie that is only slow is fine under faults; afterwards it would fail the
        # last writer needlessly, so the add timeout covers a round trip on the slowest link.
        add_timeout = max(self.config.add_timeout_ms, world.request_timeout_ms)
        machine = self.writer_cls(LOG, master_key=master_key(PASSWORD), password_check=password_check(PASSWORD),
                                  digest_for=self.digests.__getitem__, config=self.log_config,
                                  add_timeout_ms=add_timeout, recovery_timeout_ms=3000,
                                  explicit_lac_ms=50, now_ms=world.now, wall_ms=world.now,
                                  max_bytes_in_flight=self.config.max_bytes_in_flight)
        writer = _Writer(self, k, machine, process)
        self.writers.append(writer)
        return writer

    def _open_writer(self, k: int) -> None:
        writer = self._new_writer(k)
        self.log("writer%d opens the log", k)
        if self.world.faults and self.rng.random() < self.config.writer_crash_rate:
            self.world.at(self.rng.randint(1, self.config.fault_window_ms), writer.process.crash)
        writer.process.attach(writer, writer.machine.start())

    def _writer_plan(self, writer: _Writer) -> None:
        """_writer_plan schedules a writer's appends, rolls, truncations and close once it is open."""
        cfg, rng, world = self.config, self.rng, self.world
        t = 0
        for i in range(cfg.appends):
            t += rng.randint(0, cfg.append_gap_ms)
            world.at(t, self._append, writer, 1 + (rng.random() < 0.3))
        for _ in range(cfg.rolls):
            world.at(rng.randint(0, t + 1), self._request, writer, lev.RollRequested(token=rng.randrange(1 << 30)))
        for _ in range(cfg.truncations):
            world.at(rng.randint(0, t + 1), self._truncate, writer)
        if rng.random() < 0.5:
            world.at(t + rng.randint(0, 100), self._request, writer, ev.CloseRequested())

    def _final_plan(self, writer: _Writer) -> None:
        """_final_plan: the last writer appends a few records and closes, perhaps while a roll runs.

        Its appends cross `roll_entries` and it may ask for a roll and truncate, so the close can
        come at any step of a roll (ledger being created, being added to the list, the previous
        one closing) or of a truncation: the run only ends once that close finished.
        """
        rng, world = self.rng, self.world
        t = 0
        for _ in range(rng.randint(1, 4)):
            world.at(t, self._append, writer, 1)
            t += rng.randint(0, 10)
        if rng.random() < 0.5:
            world.at(rng.randint(0, t), self._request, writer, lev.RollRequested(token=rng.randrange(1 << 30)))
        if rng.random() < 0.3:
            world.at(t + rng.randint(0, 40), self._truncate, writer)
        world.at(t + rng.randint(0, 40), self._request, writer, ev.CloseRequested())

    def _append(self, writer: _Writer, count: int) -> None:
        if not writer.process.alive or writer.machine.state.value != "WRITING":
            return
        first = len(writer.payloads)
        payloads = [f"w{writer.k}-{first + i}".encode() for i in range(count)]
        writer.payloads += payloads
        self.log("writer%d appends %s", writer.k, [p.decode() for p in payloads])
        writer.process.deliver(writer, ev.AppendRequested(payloads=payloads))

    def _request(self, writer: _Writer, event) -> None:
        if writer.process.alive:
            self.log("writer%d: %s", writer.k, type(event).__name__)
            if hasattr(event, "token"):
                writer.requests.add(event.token)
            if type(event) is ev.CloseRequested:
                writer.close_asked = True
            writer.process.deliver(writer, event)

    def _truncate(self, writer: _Writer) -> None:
        if writer.acked:
            before = self.rng.choice(writer.acked)
            self._request(writer, lev.TruncateRequested(token=self.rng.randrange(1 << 30), before=before))

    def _start_follower(self, name: str, follow: bool = True) -> _Follower | None:
        world = self.world
        if not self.open_order:                  # no log yet: start once a writer created it
            world.at(50, self._start_follower, name, follow)
            return None
        process = world.process(name)
        machine = self.reader_cls(LOG, password=PASSWORD, follow=follow, poll_ms=100, read_timeout_ms=world.request_timeout_ms,
                            speculative_ms=world.request_timeout_ms // 4, window=8, now_ms=world.now)
        follower = _Follower(self, name, machine, process)
        self.followers.append(follower)
        self.log("%s starts reading the log", name)
        if follow and world.faults and self.rng.random() < self.config.follower_crash_rate:
            world.at(self.rng.randint(1, self.config.fault_window_ms), process.crash)
        process.attach(follower, machine.start())
        return follower

    def _crash_bookie(self, address: str, forever: bool) -> None:
        world = self.world
        if not world.faults:
            return
        if forever:
            alive = [b for b in world.bookies.values() if not b.lost]
            if len(alive) <= self.config.ensemble or any(b.lost for b in world.bookies.values()):
                return
        world.crash_bookie(address, forever)

    def _wipe_bookie(self, address: str) -> None:
        if self.world.faults:
            self.world.crash_bookie(address, wipe=True)

    def _lose_session(self) -> None:
        live = [p for p in self.world.processes.values() if p.alive]
        if live and self.world.faults:
            self.world.lose_session(self.rng.choice(live))

    def _quiet(self) -> None:
        """_quiet stops the faults and starts the last writer.

        Each earlier writer still running either stops (crashes) or is kept: it is asked to close
        soon, amid whatever it is doing (a roll, a truncation, a recovery, being fenced by the
        last writer), and the run ends only once it answered that close and every request it got.
        """
        world, rng = self.world, self.rng
        self.log("faults stop; every bookie comes back; a last writer opens the log")
        world.faults = False
        for writer in self.writers:
            if writer.process.alive and rng.random() < 0.5:
                self.kept.append(writer)
                self.log("writer%d keeps running and will close", writer.k)
                world.at(rng.randint(0, 60), self._request, writer, ev.CloseRequested())
            else:
                writer.process.crash()
        for address, bookie in world.bookies.items():
            if not bookie.up and not bookie.lost:
                world.restart_bookie(address)
        self._last_writer()

    def _last_writer(self) -> None:
        """_last_writer starts the last writer, or another one if the last failed (a kept writer that was
        still opening took the log over from it: the faults are over, so a few attempts must do)."""
        self.final_attempts += 1
        if self.final_attempts > 5:
            self.fail("the last writer failed 5 times after the faults stopped")
        self.final_writer = self._new_writer(len(self.writers) + 1)
        self.final_writer.process.attach(self.final_writer, self.final_writer.machine.start())

    # -- outcomes -------------------------------------------------------------------------------
    def _writer_outcome(self, writer: _Writer, command) -> None:
        kind = type(command)
        k = writer.k
        if writer.close_asked and kind in (lev.LogClosed, lev.LogCloseFailed, lev.LogOpenFailed):
            writer.close_answered = True
        if kind is lev.CompleteAppends:
            if writer.failed:
                self.fail(f"writer{k} had appends acknowledged after it was told they failed")
            for entry_id in range(command.first_entry_id, command.last_entry_id + 1):
                position = Position(command.ledger_id, entry_id)
                if writer.acked and position <= writer.acked[-1]:
                    self.fail(f"writer{k} was acknowledged {position} after {writer.acked[-1]}: out of log order")
                payload = writer.payloads[len(writer.acked)]
                writer.acked.append(position)
                self.acked[position] = payload
                self._unchecked.add(position)
            self.log("writer%d: acked up to %s", k, writer.acked[-1])
        elif kind is lev.LogOpened:
            writer.opened = True
            self.open_order.append(k)
            self.log("writer%d: opened, list %s", k, command.metadata.ledger_ids)
            if writer is self.final_writer:
                self._final_plan(writer)
            else:
                self._writer_plan(writer)
        elif kind is lev.RefuseAppends:
            writer.refused += command.count
            self.log("writer%d: %d appends refused: %r", k, command.count, command.error)
        elif kind is lev.FailAppends:
            writer.failed = True
            self.log("writer%d: appends fail: %r", k, command.error)
            if writer is self.final_writer:
                self.world.at(100, self._last_writer)
        elif kind is ev.Failpoint:
            if self.world.faults and writer is not self.final_writer and self.rng.random() < self.config.failpoint_crash_rate:
                self.log("writer%d stops at failpoint %s", k, command.name)
                writer.process.crash()
        elif kind is lev.LogClosed:
            writer.closed = True
            self.log("writer%d: closed", k)
            if writer is self.final_writer:
                self.final_reader = self._start_follower("reader", follow=False)
        elif kind in (lev.RollCompleted, lev.RollFailed, lev.TruncateCompleted, lev.TruncateFailed):
            if command.token not in writer.requests:
                self.fail(f"writer{k} answered request {command.token} twice, or one it never got: {_short(command)}")
            writer.requests.discard(command.token)
            self.log("writer%d: %s", k, _short(command))
        elif kind is lev.LogOpenFailed and writer is self.final_writer:
            self.log("writer%d: open failed: %r", k, command.error)
            self.world.at(100, self._last_writer)
        else:
            self.log("writer%d: %s", k, _short(command))

    def _follower_outcome(self, follower: _Follower, command) -> None:
        kind = type(command)
        if kind is lev.DeliverRecords:
            for entry in command.entries:
                position = Position(command.ledger_id, entry.entry_id)
                if follower.records and position <= follower.records[-1][0]:
                    self.fail(f"{follower.name} got {position} after {follower.records[-1][0]}")
                expected = self.acked.get(position)
                if expected is not None and expected != entry.payload:
                    self.fail(f"{follower.name} read {entry.payload!r} at {position}, where {expected!r} was acknowledged")
                follower.records.append((position, entry.payload))
            last = command.entries[-1].entry_id
            follower.process.deliver(follower, ev.EntriesConsumed(upto=last, ledger_id=command.ledger_id))
        elif kind is ev.CompleteRead:
            follower.complete = True
            self.log("%s: read %d records", follower.name, len(follower.records))
        elif kind is ev.FailRead:
            follower.ended = command.error
            self.log("%s: stops: %r", follower.name, command.error)
            nxt = follower.machine.next
            truncated_to = self.listed.truncated_to if self.listed is not None else -1
            if isinstance(command.error, LogTruncated) and (nxt is None or nxt.ledger_id > truncated_to):
                self.fail(f"{follower.name} was told LogTruncated at {nxt}, but the log is truncated only up to "
                          f"ledger {truncated_to}")
            if follower is self.final_reader:
                self.fail(f"the last reader could not read the log without faults: {command.error}")

    def _done(self) -> bool:
        """_done: the last reader read the log, and every live follower got the last record too."""
        if self.final_reader is None or not self.final_reader.complete:
            return False
        if any(w.process.alive and not w.settled() for w in self.kept):
            return False
        final = self.final_writer.acked[-1]
        self.finished = all(not f.process.alive or f.ended is not None or f.complete
                            or (f.records and f.records[-1][0] >= final) for f in self.followers)
        return self.finished

    # -- invariants ------------------------------------------------------------------------------
    def _on_store_change(self, key: str, before, after) -> None:
        if key == _LOG_KEY:
            listed = None if after is None else LogMetadata.from_bytes(after[0])
            old = self.listed
            self.listed = listed
            self._chain_dirty = True
            if listed is not None:
                for ledger_id in listed.ledger_ids:
                    self.ever_listed.setdefault(ledger_id)
                self.log("list v%d: %s", after[1], [(s.ledger_id, s.last_entry_id) for s in listed.segments])
            if old is not None:
                self._check_removals(old, listed)
        elif key.startswith(LEDGER_PREFIX):
            ledger_id = ledger_id_of(key)
            if after is None:
                return                               # deleted: keep its last metadata for the history
            metadata = LedgerMetadata.from_bytes(after[0])
            previous = self.ledgers.get(ledger_id)
            if previous is not None and previous.state == CLOSED and metadata != previous:
                self.fail(f"ledger {ledger_id} changed after it was closed: {metadata}")
            self.ledgers[ledger_id] = metadata
            self._recheck.add(ledger_id)
            self._chain_dirty = True

    def _check_removals(self, old: LogMetadata, new: LogMetadata | None) -> None:
        """_check_removals: a ledger leaves the list only once closed (truncation or retention)."""
        kept = set(new.ledger_ids) if new is not None else set()
        for segment in old.segments:
            if segment.ledger_id in kept:
                continue
            held = [p for p in self.acked if p.ledger_id == segment.ledger_id]
            if held and not segment.is_closed:
                self.fail(f"ledger {segment.ledger_id} left the list unclosed with acknowledged records {held[:3]}")
            if held:
                self.truncated.add(segment.ledger_id)

    def _check(self) -> None:
        if self._chain_dirty:
            self._chain_dirty = False
            self._check_chain()
        if self._unchecked or self._recheck:
            todo = set(self._unchecked)
            if self._recheck:
                todo.update(p for p in self.acked if p.ledger_id in self._recheck)
            self._unchecked.clear()
            self._recheck.clear()
            for position in todo:
                self._check_quorum(position)

    def _check_chain(self) -> None:
        listed = self.listed
        if listed is None:
            return
        ids = listed.ledger_ids
        unclosed = []
        for ledger_id in ids:
            metadata = self.ledgers.get(ledger_id)
            if metadata is None or ledger_key(ledger_id) not in self.world.store.data:
                self.fail(f"ledger {ledger_id} is in the list {ids} but its metadata is gone")
            if metadata.state != CLOSED:
                unclosed.append(ledger_id)
        if len(unclosed) > 2 or any(i not in ids[-2:] for i in unclosed):
            self.fail(f"ledgers {unclosed} of the list {ids} are not closed: at most the last two may be "
                      "(OnlyOneLedgerOpenAtATime, two during a roll)")

    def _check_quorum(self, position: Position) -> None:
        metadata = self.ledgers.get(position.ledger_id)
        if metadata is None or ledger_key(position.ledger_id) not in self.world.store.data:
            return                                   # truncated and deleted
        entry_id = position.entry_id
        write_set = write_set_bookies(entry_id, metadata.ensemble_at(entry_id), metadata.write_quorum)
        copies = sum(1 for address in write_set if self._payload_on(address, position) == self.acked[position])
        if copies < metadata.ack_quorum:
            self.fail(f"acknowledged record {position} is durable on {copies} bookies of its write set {write_set}, "
                      f"fewer than Qa={metadata.ack_quorum}")

    def _payload_on(self, address: str, position: Position) -> bytes | None:
        data = self.world.bookies[address].durable_copy(position)       # a copy on a disk emptied since counts
        return None if data is None else unpack_entry(position.ledger_id, position.entry_id, data).payload

    # -- the end ---------------------------------------------------------------------------------
    def _history(self) -> list[tuple[Position, bytes]]:
        """_history is every record of every ledger ever listed, to where the ledger closed."""
        records = []
        for ledger_id in sorted(self.ever_listed):
            metadata = self.ledgers.get(ledger_id)
            if metadata is None or metadata.state != CLOSED:
                self.fail(f"ledger {ledger_id} was listed but is not closed at the end ({metadata and metadata.state})")
            for entry_id in range(metadata.last_entry_id + 1):
                position = Position(ledger_id, entry_id)
                write_set = write_set_bookies(entry_id, metadata.ensemble_at(entry_id), metadata.write_quorum)
                payloads = {p for p in (self._payload_on(a, position) for a in write_set) if p is not None}
                if len(payloads) != 1:
                    self.fail(f"record {position} of the closed ledger is {payloads or 'nowhere'} on its write set")
                records.append((position, payloads.pop()))
        return records

    def _check_end(self) -> None:
        for writer in self.kept:
            if writer.process.alive and not writer.settled():
                self.fail(f"writer{writer.k}, kept running when the faults stopped, left requests unanswered: "
                          f"close asked {writer.close_asked}, answered {writer.close_answered}; rolls and truncations "
                          f"{sorted(writer.requests)}; {len(writer.payloads)} appended, {len(writer.acked)} "
                          f"acknowledged, {writer.refused} refused, failed {writer.failed}; "
                          f"state {writer.machine.state.value}")
        if not self.finished:
            self.fail(f"the run did not finish by t={self.world.now}: last writer "
                      f"{self.final_writer and self.final_writer.machine.state}, last reader "
                      f"{self.final_reader and (self.final_reader.complete, self.final_reader.ended)}, followers "
                      f"{[(f.name, f.process.alive, f.ended, f.records[-1:] ) for f in self.followers]}")
        final = self.final_writer
        if final.requests:
            self.fail(f"the last writer closed with roll or truncate requests never answered: {sorted(final.requests)}")
        if not final.failed and len(final.acked) + final.refused != len(final.payloads):
            self.fail(f"the last writer closed with appends never answered: {len(final.payloads)} appended, "
                      f"{len(final.acked)} acknowledged, {final.refused} refused")
        history = self._history()
        where = {position: i for i, (position, _) in enumerate(history)}
        for position, payload in self.acked.items():
            if position not in where or history[where[position]][1] != payload:
                self.fail(f"acknowledged record {payload!r} at {position} is not in the log's history")
        rank = {k: i for i, k in enumerate(self.open_order)}
        last_rank, seen = -1, {}
        for position, payload in history:
            k, _, i = payload.decode().lstrip("w").partition("-")
            k, i = int(k), int(i)
            if k not in rank:
                self.fail(f"record {payload!r} at {position} comes from a writer that never opened the log")
            if rank[k] < last_rank:
                self.fail(f"record {payload!r} at {position} of writer{k} comes after a later writer's records")
            last_rank = rank[k]
            if i <= seen.get(k, -1):
                self.fail(f"record {payload!r} at {position} is out of writer{k}'s order (after its #{seen[k]})")
            seen[k] = i
        listed = set(self.listed.ledger_ids) if self.listed else set()
        expected = [(p, v) for p, v in history if p.ledger_id in listed]
        if self.final_reader.records != expected:
            self.fail(f"the last reader read {len(self.final_reader.records)} records, not the {len(expected)} "
                      f"the list holds: {self.final_reader.records[:4]} vs {expected[:4]}")
        for follower in self.followers:
            if not follower.records:
                continue
            start = where.get(follower.records[0][0])
            if start is None or history[start:start + len(follower.records)] != follower.records:
                self.fail(f"{follower.name} read {len(follower.records)} records that are not a gap-free slice "
                          f"of the log: {follower.records[:4]}")
            if follower.ended is not None and not isinstance(follower.ended, LogTruncated):
                self.fail(f"{follower.name} stopped with {follower.ended!r}")


def _short(command) -> str:
    name = type(command).__name__
    error = getattr(command, "error", None)
    return f"{name}({error!r})" if error is not None else name
