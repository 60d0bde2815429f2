"""walkit.testing.sim.world is the simulated cluster the scenarios run the real core machines in.

Everything random comes from one seeded `random.Random`, and time is simulated, so a seed
replays exactly. The world has:

- bookies: real BookieHandlers over VolatileStorage (writes are lost on a crash until synced);
  a bookie answers durable requests only after its next sync. Bookies crash and restart, or
  are lost for good, or restart with an empty disk (`crash_bookie(wipe=True)`: what a real
  bookie does after `walkit bookies format-and-rejoin`, or a memory bookie at every restart);
  every answer names the bookie's disk. A crashed bookie's registration lingers a little, as a
  real session does. In half the seeds read answers are bounded by bytes (BP-62) so tightly
  that most hold one to a few entries: each bookie draws its own bound (BookieLimits.
  max_read_bytes), clients may ask for less (ReadRequest.max_bytes), and a bookie may be one
  of an older walkit that ignores the bound and answers every id, so the machines' handling
  of unread ids runs under every fault. The bounds come from a generator of their own, so in
  the other half of the seeds runs are what they were before bounds existed;
- a network that drops, delays (each client-bookie link has its own top speed), reorders and
  duplicates messages, and fails a send at once when the bookie is down, like ZeroMQ's monitor;
- a metadata store with compare-and-swap whose calls are delayed, sometimes fail without
  effect, sometimes take effect and lose their answer (outcome unknown), and fail in flight when
  a process loses its session;
- processes: each runs machines (owners) behind one real `walkit.core.dispatch.Dispatcher`, as
  the threaded client does, and can crash (it then takes no further part).

Scenarios (walkit.testing.sim.ledger, walkit.testing.sim.log) plan what happens and check
their invariants after every event through `World.after_step`.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass, replace

from walkit.core import events as ev
from walkit.core.bookie import BookieHandler, BookieLimits, LedgerState, Reply, StoreEntries, StoreLedgerState
from walkit.core.dispatch import Bookies, Dispatcher, StoreCall
from walkit.core.messages import DEFAULT_MAX_READ_BYTES, ReadRequest
from walkit.errors import BadVersion, MetadataError, NodeExists, NoSuchKey, SessionLost


class InvariantViolation(AssertionError):
    """InvariantViolation reports a broken invariant with the trace that led to it."""

    def __init__(self, seed: int, message: str, trace: list[str]) -> None:
        self.seed = seed
        self.message = message
        self.trace = trace
        tail = "\n".join(trace[-80:])
        super().__init__(f"seed {seed}: {message}\n--- last events ---\n{tail}")


class VolatileStorage:
    """VolatileStorage is a bookie's storage: `put`s are volatile until `sync`, lost on a crash."""

    def __init__(self) -> None:
        self.durable: dict[tuple[int, int], bytes] = {}
        self.durable_states: dict[int, LedgerState] = {}
        self.volatile: dict[tuple[int, int], bytes] = {}
        self.volatile_states: dict[int, LedgerState] = {}
        self._last: dict[int, int] = {}

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        key = (ledger_id, entry_id)
        data = self.volatile.get(key)
        return self.durable.get(key) if data is None else data

    def last_entry(self, ledger_id: int) -> int:
        return self._last.get(ledger_id, -1)

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        state = self.volatile_states.get(ledger_id)
        return self.durable_states.get(ledger_id) if state is None else state

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        self.volatile[(ledger_id, entry_id)] = data
        if entry_id > self._last.get(ledger_id, -1):
            self._last[ledger_id] = entry_id

    def sync(self) -> None:
        self.durable.update(self.volatile)
        self.durable_states.update(self.volatile_states)
        self.volatile.clear()
        self.volatile_states.clear()

    def crash(self) -> None:
        self.volatile.clear()
        self.volatile_states.clear()
        self._last = {}
        for ledger_id, entry_id in self.durable:
            if entry_id > self._last.get(ledger_id, -1):
                self._last[ledger_id] = entry_id


#: Bounds a simulated bookie's read answers may have (bytes; an entry of the scenarios costs
#: about 55): one entry an answer, two, or a handful.
READ_BOUNDS = (1, 120, 300)
#: A generator of its own draws each seed's read bounds (see the module doc): seed ^ this.
_READ_BOUNDS_SALT = 0x5EAD_B0B5


@dataclass(frozen=True)
class ReadBounds:
    """ReadBounds says how read answers are bounded in a run: per bookie, and the clients' ask.

    `bookies` maps an address to its BookieLimits.max_read_bytes (absent: `every`, or if that
    is 0 the default bound); `legacy` bookies predate the bound: they ignore ReadRequest.
    max_bytes and answer every id. `client` is every client's ReadRequest.max_bytes.
    """

    bookies: dict[str, int]
    legacy: frozenset[str] = frozenset()
    client: int = DEFAULT_MAX_READ_BYTES
    every: int = 0

    def limits(self, address: str) -> BookieLimits:
        """limits are the BookieLimits of the bookie at `address`."""
        if address in self.legacy:
            return BookieLimits(max_read_bytes=1 << 62)        # answers every id, never refuses
        bound = self.bookies.get(address, self.every)
        return BookieLimits(max_read_bytes=bound) if bound else BookieLimits()

    @classmethod
    def draw(cls, seed: int, addresses: list[str]) -> "ReadBounds":
        """draw picks the bounds of seed `seed`: none in half the seeds, tight ones in the other half."""
        rng = random.Random(seed ^ _READ_BOUNDS_SALT)
        if rng.random() < 0.5:
            return cls({})
        bookies = {a: rng.choice(READ_BOUNDS) for a in addresses}
        legacy = frozenset(a for a in addresses if rng.random() < 0.2)
        return cls(bookies, legacy, rng.choice([DEFAULT_MAX_READ_BYTES, DEFAULT_MAX_READ_BYTES, 1, 200]))


class SimBookie:
    """SimBookie is one simulated bookie: a real BookieHandler over VolatileStorage.

    `disk` is its storage's identity; a wipe gives it a new one and an empty storage, and keeps
    what the old disk held durably in `wiped` (checkers count such a copy as one that was
    made and then lost, as they count a bookie lost for good). `limits` bound its answers; a
    `legacy` bookie ignores a read's max_bytes, as a bookie of an older walkit does.
    """

    def __init__(self, address: str, disk: int, limits: BookieLimits = BookieLimits(), legacy: bool = False) -> None:
        self.address = address
        self.disk = disk
        self.limits = limits
        self.legacy = legacy
        self.wiped: dict[tuple[int, int], bytes] = {}
        self.wipe_on_restart = False
        self.storage = VolatileStorage()
        self.handler = BookieHandler(self.storage, instance=1, limits=limits)
        self.up = True
        self.lost = False                  # gone for good: never restarts
        self.registered_until: int | None = None   # a crashed bookie's registration lingers until then
        self.held: list[tuple[object, Reply]] = []  # (process, durable reply) waiting for the next sync
        self.sync_pending = False
        self.incarnation = 0

    def durable_copy(self, key: tuple[int, int]) -> bytes | None:
        """durable_copy is what this bookie made durable for `key`: on its disk, or on a disk wiped since."""
        data = self.storage.durable.get(key)
        return self.wiped.get(key) if data is None else data


@dataclass
class _Call:
    process: "Process"
    call: StoreCall
    session: int


class SimStore:
    """SimStore is the metadata store: versioned keys with compare-and-swap, and counters.

    `deleted` keeps the last value of every deleted key, so checkers can still see how a
    truncated ledger ended.
    """

    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, int]] = {}
        self.counters: dict[str, int] = {}
        self.deleted: dict[str, bytes] = {}

    def apply(self, method: str, args: tuple):
        """apply runs one call; it returns its value or raises as a real store does."""
        data = self.data
        if method == "get":
            found = data.get(args[0])
            if found is None:
                raise NoSuchKey(args[0])
            return found
        if method == "put":
            key, value, expected = args
            found = data.get(key)
            if found is None:
                raise NoSuchKey(key)
            if found[1] != expected:
                raise BadVersion(f"{key}: version {found[1]}, not {expected}")
            data[key] = (value, expected + 1)
            return expected + 1
        if method == "create":
            key, value = args
            if key in data:
                raise NodeExists(key)
            data[key] = (value, 0)
            return 0
        if method == "delete":
            found = data.pop(args[0], None)
            if found is None:
                raise NoSuchKey(args[0])
            self.deleted[args[0]] = found[0]
            return None
        if method == "next_id":
            value = self.counters.get(args[0], 0)
            self.counters[args[0]] = value + 1
            return value
        raise AssertionError(f"the simulated store does not do {method}")


class Process:
    """Process is one simulated client process: machines (owners) behind one Dispatcher."""

    def __init__(self, world: "World", name: str) -> None:
        self.world = world
        self.name = name
        self.peer = name.encode()
        self.dispatcher = Dispatcher(world.request_timeout_ms)
        self.owners: list = []
        self.alive = True
        self.session = 0

    def attach(self, owner, commands: list) -> None:
        """attach starts driving `owner` (an object with `.machine` and `.outcome(command)`)."""
        self.owners.append(owner)
        self.execute(owner, commands)

    def deliver(self, owner, event) -> None:
        """deliver feeds an event to an owner's machine and carries out what it asks."""
        if self.alive:
            self.execute(owner, owner.machine.step(event))

    def deliver_all(self, pairs: list) -> None:
        for owner, event in pairs:
            self.deliver(owner, event)

    def execute(self, owner, commands: list) -> None:
        if not self.alive:
            return
        for outcome in self.dispatcher.execute(owner, commands, self.world.now):
            owner.outcome(outcome)
            if not self.alive:
                return
        self.flush()

    def flush(self) -> None:
        world = self.world
        for bookie, requests in self.dispatcher.take_requests().items():
            for request in requests:
                world.send_request(self, bookie, request)
        for call in self.dispatcher.take_calls():
            world.store_call(self, call)
        self.dispatcher.reconnect.clear()

    def tick(self) -> None:
        world = self.world
        self.deliver_all(self.dispatcher.tick(world.now, world.now))
        tick = ev.Ticked(now_ms=world.now, wall_ms=world.now)
        for owner in list(self.owners):
            if not self.alive:
                return
            self.deliver(owner, tick)

    def crash(self) -> None:
        self.world.log("%s CRASHES", self.name)
        self.alive = False


class World:
    """World is the simulated cluster: clock, event queue, network, bookies, store and processes."""

    def __init__(self, seed: int, *, bookies: int, drop_rate: float, duplicate_rate: float, max_delay_ms: int,
                 max_sync_ms: int, metadata_delay_ms: int, metadata_fault_rate: float, request_timeout_ms: int,
                 after_step, read_bounds: ReadBounds | None = None) -> None:
        """`read_bounds` bound read answers (default: drawn for the seed, see ReadBounds.draw)."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.drop_rate = drop_rate
        self.duplicate_rate = duplicate_rate
        self.max_delay_ms = max_delay_ms
        self.max_sync_ms = max_sync_ms
        self.metadata_delay_ms = metadata_delay_ms
        self.metadata_fault_rate = metadata_fault_rate
        # A request must be able to outlive a round trip on the slowest link (see _link_delay).
        self.request_timeout_ms = max(request_timeout_ms, 8 * max_delay_ms + 2 * max_sync_ms + 10)
        self.after_step = after_step
        self.faults = True
        #: drops(process, bookie, message) -> True drops a message on purpose (scripted scenarios).
        self.drops = None
        addresses = [f"b{i}" for i in range(bookies)]
        self.read_bounds = bounds = read_bounds or ReadBounds.draw(seed, addresses)
        self.bookies = {a: SimBookie(a, disk=1000 + i, limits=bounds.limits(a), legacy=a in bounds.legacy)
                        for i, a in enumerate(addresses)}
        self._disks = itertools.count(2000)
        self.store = SimStore()
        self.processes: dict[str, Process] = {}
        self.events = 0
        self._queue: list = []
        self._seq = itertools.count()
        self._links: dict[tuple[str, str], int] = {}
        self._trace: deque = deque(maxlen=400)

    # -- scheduling and tracing -----------------------------------------------------------------
    def at(self, delay: int, fn, *args) -> None:
        """at runs `fn(*args)` `delay` ms from now."""
        heapq.heappush(self._queue, (self.now + max(0, delay), next(self._seq), fn, args))

    def log(self, fmt: str, *args) -> None:
        """log records a trace line; it is formatted only if a violation needs it."""
        self._trace.append((self.now, fmt, args))

    @property
    def trace(self) -> list[str]:
        return [f"{t:6d} {fmt % args if args else fmt}" for t, fmt, args in self._trace]

    def fail(self, message: str) -> None:
        raise InvariantViolation(self.seed, message, self.trace)

    def run(self, end_ms: int, stop) -> None:
        """run plays events until `end_ms` or until `stop()` is true, checking after every event."""
        queue = self._queue
        while queue:
            self.now, _, fn, args = heapq.heappop(queue)
            if self.now > end_ms:
                return
            fn(*args)
            self.events += 1
            self.after_step()
            if stop():
                return

    def process(self, name: str) -> Process:
        process = self.processes[name] = Process(self, name)
        process.dispatcher.max_read_bytes = self.read_bounds.client
        return process

    def tick_every(self, period_ms: int) -> None:
        """tick_every passes time to every live process and bookie every `period_ms`."""
        def tick() -> None:
            for process in list(self.processes.values()):
                if process.alive:
                    process.tick()
            for bookie in self.bookies.values():
                if bookie.up:
                    self._bookie_apply(bookie, bookie.handler.tick(self.now), None)
            self.at(period_ms, tick)
        self.at(0, tick)

    # -- bookies --------------------------------------------------------------------------------
    def crash_bookie(self, address: str, forever: bool = False, wipe: bool = False) -> None:
        """crash_bookie stops a bookie; it restarts later unless `forever`, on a new empty disk if `wipe`."""
        bookie = self.bookies[address]
        if not bookie.up:
            return
        self.log("bookie %s CRASHES%s (loses %d unsynced entries)", address,
                 " FOR GOOD" if forever else " AND ITS DISK IS EMPTIED" if wipe else "", len(bookie.storage.volatile))
        bookie.wipe_on_restart = wipe
        bookie.up = False
        bookie.lost = forever
        bookie.storage.crash()
        bookie.held.clear()
        bookie.sync_pending = False
        bookie.incarnation += 1
        bookie.registered_until = self.now + self.rng.randint(0, 150)
        if not forever:
            self.at(self.rng.randint(20, 400), self.restart_bookie, address)

    def restart_bookie(self, address: str) -> None:
        bookie = self.bookies[address]
        if bookie.up or bookie.lost:
            return
        if bookie.wipe_on_restart:
            bookie.wipe_on_restart = False
            bookie.wiped.update(bookie.storage.durable)
            bookie.storage = VolatileStorage()
            bookie.disk = next(self._disks)
            self.log("bookie %s restarts on a new, empty disk %d", address, bookie.disk)
        else:
            self.log("bookie %s restarts", address)
        bookie.up = True
        bookie.registered_until = None
        bookie.handler = BookieHandler(bookie.storage, instance=bookie.incarnation + 1, limits=bookie.limits)

    def registered(self) -> Bookies:
        """registered lists the bookies a registry lookup returns now, in random order, with their disks."""
        live = [a for a, b in self.bookies.items()
                if b.up or (b.registered_until is not None and self.now < b.registered_until)]
        self.rng.shuffle(live)
        return Bookies(live, {a: self.bookies[a].disk for a in live})

    def _bookie_apply(self, bookie: SimBookie, commands: list, process: Process | None) -> None:
        storage = bookie.storage
        for command in commands:
            kind = type(command)
            if kind is StoreEntries:
                for entry_id, data in command.entries:
                    storage.put(command.ledger_id, entry_id, data)
            elif kind is StoreLedgerState:
                storage.volatile_states[command.ledger_id] = command.state
            elif kind is Reply:
                target = self.processes.get(command.peer.decode())
                if target is None:
                    continue
                if command.durable:
                    bookie.held.append((target, command))
                else:
                    self._send_reply(target, bookie.address, command.response)
        if bookie.sync_pending or not (bookie.held or storage.volatile or storage.volatile_states):
            return
        # Deferred-sync entries alone (no durable reply waits) are synced only sometimes, so
        # crashes take back acknowledged, unforced entries as a real bookie's would.
        if bookie.held or storage.volatile_states or self.rng.random() < 0.02:
            bookie.sync_pending = True
            self.at(self.rng.randint(0, self.max_sync_ms), self._sync, bookie.address, bookie.incarnation)

    def _sync(self, address: str, incarnation: int) -> None:
        bookie = self.bookies[address]
        if not bookie.up or bookie.incarnation != incarnation:
            return
        bookie.storage.sync()
        bookie.sync_pending = False
        held, bookie.held = bookie.held, []
        for process, reply in held:
            self._send_reply(process, address, reply.response)

    # -- network --------------------------------------------------------------------------------
    def _link_delay(self, process: Process, bookie: str) -> int:
        key = (process.name, bookie)
        top = self._links.get(key)
        if top is None:
            top = self._links[key] = self.rng.choice([2, self.max_delay_ms, 4 * self.max_delay_ms])
        return self.rng.randint(1, top)

    def _transmit(self, process: Process, bookie: str, fn, message) -> None:
        if self.drops is not None and self.drops(process, bookie, message):
            self.log("DROP (scripted) %s %s %s", process.name, bookie, _describe(message))
            return
        rng = self.rng
        if self.faults and rng.random() < self.drop_rate:
            self.log("DROP %s %s", process.name, _describe(message))
            return
        self.at(self._link_delay(process, bookie), fn, process, bookie, message)
        if self.faults and rng.random() < self.duplicate_rate:
            self.at(self._link_delay(process, bookie), fn, process, bookie, message)

    def send_request(self, process: Process, address: str, request) -> None:
        bookie = self.bookies[address]
        if not bookie.up and self.rng.random() < 0.5:      # the connection is known to be down
            self.at(1, self._refused, process, address, request)
            return
        self._transmit(process, address, self._to_bookie, request)

    def _refused(self, process: Process, address: str, request) -> None:
        if process.alive:
            process.deliver_all(process.dispatcher.unreachable(address, [request], f"bookie {address} is down"))

    def _to_bookie(self, process: Process, address: str, request) -> None:
        bookie = self.bookies[address]
        if not bookie.up:
            return
        self.log("%s <- %s: %s", address, process.name, _describe(request))
        if bookie.legacy and type(request) is ReadRequest and request.max_bytes:
            request = replace(request, max_bytes=0)          # an older bookie never sees the field
        self._bookie_apply(bookie, bookie.handler.step(process.peer, request), process)

    def _send_reply(self, process: Process, address: str, response) -> None:
        response = replace(response, disk=self.bookies[address].disk)     # the frame names the disk
        self._transmit(process, address, self._to_client, response)

    def _to_client(self, process: Process, address: str, response) -> None:
        if not process.alive:
            return
        self.log("%s <- %s: %s", process.name, address, _describe(response))
        process.deliver_all(process.dispatcher.on_response(address, response))

    # -- metadata -------------------------------------------------------------------------------
    def store_call(self, process: Process, call: StoreCall) -> None:
        self.at(self.rng.randint(1, self.metadata_delay_ms), self._apply_call, _Call(process, call, process.session))

    def _apply_call(self, pending: _Call) -> None:
        process, call = pending.process, pending.call
        if process.session != pending.session:        # the session was lost before the call ran
            self._answer(pending, None, SessionLost(f"{call.method}: session lost"))
            return
        if self.faults and call.method != "live_bookies" and self.rng.random() < self.metadata_fault_rate:
            if self.rng.random() < 0.5:
                self.log("%s: metadata %s fails without effect", process.name, call.method)
                self._answer(pending, None, MetadataError(f"{call.method}: store unreachable"))
                return
            self.log("%s: metadata %s takes effect, its answer is lost", process.name, call.method)
            try:
                self._apply(call)
            except InvariantViolation:
                raise
            except Exception:  # noqa: BLE001 - the answer is lost either way
                pass
            self._answer(pending, None, MetadataError(f"{call.method}: answer lost"))
            return
        try:
            value, error = self._apply(call), None
        except InvariantViolation:
            raise                     # a checker run by on_store_change found a violation
        except Exception as exc:  # noqa: BLE001 - a store answers with its typed error
            value, error = None, exc
        self._answer(pending, value, error)

    def _apply(self, call: StoreCall):
        if call.method == "live_bookies":
            return self.registered()
        before = self.store.data.get(call.args[0]) if call.args else None
        value = self.store.apply(call.method, call.args)
        if call.method in ("put", "create", "delete"):
            self.on_store_change(call.args[0], before, self.store.data.get(call.args[0]))
        return value

    def on_store_change(self, key: str, before, after) -> None:
        """on_store_change is called after a key changed (the scenario replaces it to check)."""

    def _answer(self, pending: _Call, value, error) -> None:
        def answer() -> None:
            process = pending.process
            if not process.alive:
                return
            result_error = error
            if process.session != pending.session and error is None:
                result_error = SessionLost(f"{pending.call.method}: session lost before the answer")
            process.deliver_all(process.dispatcher.store_result(pending.call.call_id, value, result_error))
            process.flush()
        self.at(self.rng.randint(1, self.metadata_delay_ms), answer)

    def lose_session(self, process: Process) -> None:
        """lose_session ends a process's metadata session: calls in flight fail with SessionLost."""
        if process.alive:
            self.log("%s loses its metadata session", process.name)
            process.session += 1


def _describe(message) -> str:
    name = type(message).__name__
    parts = []
    status = getattr(message, "status", None)
    if status is not None:
        parts.append(status.name)
    entries = getattr(message, "entries", None)
    if entries:
        parts.append(f"L{entries[0].ledger_id} e{[e.entry_id for e in entries]}")
    ids = getattr(message, "entry_ids", None)
    if ids:
        parts.append(f"L{message.ledger_id} ids={ids}")
    elif hasattr(message, "ledger_id"):
        parts.append(f"L{message.ledger_id}")
    for flag in ("fence", "recovery", "truncate"):
        if getattr(message, flag, False):
            parts.append(flag)
    if getattr(message, "unread", 0):
        parts.append(f"unread={message.unread}")
    return f"{name}({' '.join(parts)})"


class Scenario:
    """Scenario is the base of a simulation run over `self.world`: its trace, log lines and failure."""

    world: World

    @property
    def trace(self) -> list[str]:
        """trace is the run's recent events, formatted."""
        return self.world.trace

    def log(self, fmt: str, *args) -> None:
        self.world.log(fmt, *args)

    def fail(self, message: str) -> None:
        self.world.fail(message)
