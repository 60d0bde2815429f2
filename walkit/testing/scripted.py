"""walkit.testing.scripted runs the real core machines over a network that a test drives by hand.

ScriptedCluster is the deterministic counterpart of walkit.testing.sim: the same real machines
(LedgerWriter, LedgerRecovery, RangeReader) talk to real BookieHandler instances, but nothing
moves unless the test says so. Every request a machine sends waits in a queue until the test
delivers, fails or drops it; a bookie's durable answers wait for `sync(bookie)` (a bookie
answers an add only after the sync that covers it, docs/internals/protocol.md#sync-before-ack); every
metadata write waits for `cas()` and every request for bookies waits for `choose()`. A scenario therefore reads as
a script, in the spirit of etcd raft's interaction tests:

    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = cluster.writer()
    writer.append()                                  # e0 goes to b1, b2 and b3
    cluster.deliver(to="b1", kind="add", entry=0)    # b1 stores e0 (not yet durable)
    cluster.sync("b1")                               # b1's answer leaves once e0 is durable
    cluster.deliver(to="writer", from_="b1")         # one ack: below Qa, nothing completes
    cluster.deliver_all()                            # the rest of the network, synced
    assert writer.confirmed == 0

Messages are matched by `to`, `from_`, `client` (either end), `kind` ("add", "read", "lac" for
ReadLac, "write_lac"), `entry` (an entry id the message carries or asks for) and `status` (of an
answer); `deliver`, `drop` and `fail` take the oldest message that matches. The cluster holds
one ledger, whose first ensemble is b1..bE.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Callable

from walkit.core import events as ev
from walkit.core.dispatch import Bookies, Dispatcher, StoreCall
from walkit.core.bookie import BookieHandler, Reply, StoreEntries, StoreLedgerState, unpack_entry
from walkit.core.digest import Digest, master_key
from walkit.core.distribution import write_set_bookies
from walkit.core.messages import AddRequest, ForceRequest, ReadLacRequest, ReadRequest, Status, WriteLacRequest
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import BadVersion, NoSuchKey
from walkit.core.reader import RangeReader
from walkit.core.recovery import LedgerRecovery
from walkit.core.writer import LedgerWriter
from walkit.testing.sim.world import VolatileStorage

LEDGER_ID = 7
PASSWORD = b"scripted"

#: The `kind` of a message, named after the request it is or answers.
KINDS = {AddRequest: "add", ReadRequest: "read", ReadLacRequest: "lac", WriteLacRequest: "write_lac",
         ForceRequest: "force"}
#: The metadata commands the test runs by hand with cas() and choose().
_METADATA_OPS = (ev.WriteMetadata, ev.ChooseBookies)


@dataclass(frozen=True)
class Failure:
    """Failure is the answer the shell makes up for a request it could not get answered."""

    status: Status
    message: str


@dataclass
class Message:
    """Message is one request on its way to a bookie, or one answer on its way back to a client."""

    sender: str
    receiver: str
    request: object
    response: object | None = None        # None while the message is a request; or a Failure

    @property
    def kind(self) -> str:
        """kind names the request the message is or answers ("add", "read", "lac", "write_lac", "force")."""
        return KINDS[type(self.request)]

    @property
    def entry_ids(self) -> list[int]:
        """entry_ids lists the entries the request carries or asks for."""
        if isinstance(self.request, AddRequest):
            return [e.entry_id for e in self.request.entries]
        return list(getattr(self.request, "entry_ids", []))

    def matches(self, to=None, from_=None, client=None, kind=None, entry=None, status=None) -> bool:
        """matches tells whether the message fits every filter that is not None."""
        return ((to is None or self.receiver == to) and (from_ is None or self.sender == from_)
                and (client is None or client in (self.sender, self.receiver))
                and (kind is None or self.kind == kind) and (entry is None or entry in self.entry_ids)
                and (status is None or (self.response is not None and self.response.status == status)))

    def __str__(self) -> str:
        ids = self.entry_ids
        shown = "" if not ids else f" {ids}" if len(ids) <= 4 else f" [{ids[0]}..{ids[-1]}]"
        flags = "".join(f" {flag}" for flag in ("fence", "recovery") if getattr(self.request, flag, False))
        answer = "" if self.response is None else f" -> {self.response.status.name}"
        return f"{self.sender} -> {self.receiver}: {self.kind}{shown}{flags}{answer}"


class ScriptedBookie:
    """ScriptedBookie is a BookieHandler over dict storage whose writes are volatile until `sync`."""

    def __init__(self, address: str, disk: int) -> None:
        self.address = address
        self.disk = disk                   # the identity of its storage; `wipe` gives it a new one
        self.storage = VolatileStorage()
        self.handler = BookieHandler(self.storage, instance=1)
        self.starts = 1
        self.up = True
        self.held: list[Reply] = []        # durable answers waiting for the next sync

    @property
    def fenced(self) -> bool:
        """fenced tells whether the bookie durably recorded the ledger as fenced."""
        state = self.storage.durable_states.get(LEDGER_ID)
        return state is not None and state.fenced


class ScriptedMetadataStore:
    """ScriptedMetadataStore holds the ledger's metadata and does compare-and-swap on its version.

    `history` lists every version written, as (version, metadata), oldest first.
    """

    def __init__(self, metadata: LedgerMetadata) -> None:
        self.metadata = metadata
        self.version = 0
        self.history: list[tuple[int, LedgerMetadata]] = [(0, metadata)]

    def cas(self, proposed: LedgerMetadata, expected_version: int):
        """cas writes `proposed` if the version is still `expected_version`; it returns the event to report."""
        if expected_version != self.version:
            return ev.MetadataConflict(metadata=self.metadata, version=self.version)
        self._write(proposed)
        return ev.MetadataWritten(metadata=self.metadata, version=self.version)

    def run(self, call: StoreCall):
        """run answers the dispatcher's get or put of the ledger's key as (value, error)."""
        key = ledger_key(self.metadata.ledger_id)
        if call.args[0] != key:
            return None, NoSuchKey(call.args[0])
        if call.method == "get":
            return (self.metadata.to_bytes(), self.version), None
        if call.method == "put":
            _, value, expected = call.args
            if expected != self.version:
                return None, BadVersion(f"{key} is at version {self.version}, not {expected}")
            self._write(LedgerMetadata.from_bytes(value))
            return self.version, None
        raise AssertionError(f"the scripted store does not do {call.method}")

    def transform(self, change: Callable[[LedgerMetadata], LedgerMetadata]) -> None:
        """transform applies `change` as another client's successful write would (BookKeeper's
        ClientUtil.transformMetadata)."""
        self._write(change(self.metadata))

    def _write(self, metadata: LedgerMetadata) -> None:
        self.metadata, self.version = metadata, self.version + 1
        self.history.append((self.version, metadata))


class ScriptedClient:
    """ScriptedClient wraps one core machine and records what it emits besides I/O.

    `outcomes` lists, in order, the commands the shell would hand to the application
    (CompleteAdds, FailAdds, CompleteRecovery, DeliverEntries, ...). A stopped client (a crash)
    gets no more events; answers addressed to it are discarded.
    """

    def __init__(self, cluster: "ScriptedCluster", name: str, machine) -> None:
        self.cluster = cluster
        self.name = name
        self.machine = machine
        self.alive = True
        self.outcomes: list = []

    def step(self, event) -> list:
        """step feeds `event` to the machine and returns the outcomes it emitted."""
        if not self.alive:
            return []
        return self.cluster._execute(self, self.machine.step(event))

    def stop(self) -> None:
        """stop crashes the client: it takes no further part; messages it sent stay on the network."""
        self.alive = False

    def outcomes_of(self, kind: type) -> list:
        """outcomes_of lists the outcomes of exactly type `kind`, in order."""
        return [o for o in self.outcomes if type(o) is kind]

    @property
    def result(self):
        """result is the last CompleteRecovery/FailRecovery/CompleteClose/FailClose/CompleteRead/FailRead."""
        ends = (ev.CompleteRecovery, ev.FailRecovery, ev.CompleteClose, ev.FailClose, ev.CompleteRead, ev.FailRead)
        found = [o for o in self.outcomes if type(o) in ends]
        return found[-1] if found else None

    # -- writer views ---------------------------------------------------------------------
    def append(self, count: int = 1) -> list:
        """append asks the writer to add `count` entries with payloads b"e<entry id>"."""
        first = self.machine.last_add_pushed + 1
        return self.step(ev.AppendRequested(payloads=[f"e{first + i}".encode() for i in range(count)]))

    def close(self) -> list:
        """close asks the writer to close the ledger."""
        return self.step(ev.CloseRequested())

    @property
    def completions(self) -> list[int]:
        """completions lists the last_entry_id of every CompleteAdds, in order."""
        return [o.last_entry_id for o in self.outcomes_of(ev.CompleteAdds)]

    @property
    def confirmed(self) -> int:
        """confirmed is the highest entry acknowledged to the application (-1 if none)."""
        return max(self.completions, default=-1)

    @property
    def errors(self) -> list[Exception]:
        """errors lists the errors of every FailAdds, in order."""
        return [o.error for o in self.outcomes_of(ev.FailAdds)]

    @property
    def payloads(self) -> list[bytes]:
        """payloads lists the payloads a reader delivered, in order."""
        return [e.payload for o in self.outcomes_of(ev.DeliverEntries) for e in o.entries]


class ScriptedCluster:
    """ScriptedCluster is N scripted bookies, one ledger's metadata store and the clients under test.

    The ledger has quorums (ensemble, write_quorum, ack_quorum) and starts OPEN on b1..bE at
    version 0; bookies b(E+1)..bN are spares. `trace` records every step, for failure messages.
    """

    def __init__(self, bookies: int = 3, ensemble: int = 3, write_quorum: int = 3, ack_quorum: int = 2) -> None:
        self.bookies = {f"b{i}": ScriptedBookie(f"b{i}", disk=i) for i in range(1, bookies + 1)}
        first = tuple(f"b{i}" for i in range(1, ensemble + 1))
        self.store = ScriptedMetadataStore(LedgerMetadata(
            ledger_id=LEDGER_ID, ensemble_size=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
            ensembles={0: first}, disks={0: tuple(self.bookies[b].disk for b in first)}))
        self.digest = Digest("crc32c", PASSWORD)
        self.master_key = master_key(PASSWORD)
        self.network: list[Message] = []
        self.dispatcher = Dispatcher()
        self.metadata_ops: list[tuple[ScriptedClient, object]] = []   # WriteMetadata / ChooseBookies
        self.clients: dict[str, ScriptedClient] = {}
        self.now = 0
        self.trace: list[str] = []
        self._txns = itertools.count(1)
        self._sent: dict[int, Message] = {}     # txn -> the request as it left its client

    # -- clients --------------------------------------------------------------------------
    def writer(self, name: str = "writer", **options) -> ScriptedClient:
        """writer opens a LedgerWriter on the stored metadata (which must be OPEN)."""
        machine = LedgerWriter(self.store.metadata, self.store.version, master_key=self.master_key,
                               digest=self.digest, now_ms=self.now, **options)
        return self._client(name, machine, None)

    def recovery(self, name: str = "recovery", cls: type = LedgerRecovery, **options) -> ScriptedClient:
        """recovery starts a recovery (`cls`, LedgerRecovery by default) from the stored metadata
        (of an unbounded ledger: holding its term as `name`)."""
        if self.store.metadata.unbounded:
            options.setdefault("holder", name)
        machine = cls(self.store.metadata, self.store.version, master_key=self.master_key, digest=self.digest,
                      now_ms=self.now, **options)
        return self._client(name, machine, machine.start)

    def read(self, first: int, last: int) -> list[bytes]:
        """read reads entries [first, last] with a RangeReader on the stored metadata, settling the
        cluster, and returns their payloads; it fails the test if the read fails."""
        machine = RangeReader(self.store.metadata, first, last, self.digest, now_ms=self.now)
        reader = self._client(f"reader{len(self.clients)}", machine, machine.start)
        self.settle()
        assert isinstance(reader.result, ev.CompleteRead), f"read failed: {reader.result}\n{self.dump()}"
        return reader.payloads

    def _client(self, name: str, machine, start) -> ScriptedClient:
        assert name not in self.clients, f"a client named {name} exists already"
        client = self.clients[name] = ScriptedClient(self, name, machine)
        if start:
            self._execute(client, start())
        return client

    def _execute(self, client: ScriptedClient, commands: list) -> list:
        """_execute carries out a machine's commands: requests are queued on the network through the
        dispatcher, metadata operations wait for cas() and choose(), outcomes are recorded."""
        outcomes = []
        for command in commands:
            if isinstance(command, _METADATA_OPS):
                self.metadata_ops.append((client, command))
                continue
            for outcome in self.dispatcher.execute(client, [command], self.now):
                self.log(f"{client.name}: {_describe(outcome)}")
                outcomes.append(outcome)
        for bookie, requests in self.dispatcher.take_requests().items():
            for request in requests:
                message = self._sent[request.txn] = Message(client.name, bookie, request)
                if self.bookies[bookie].up:
                    self.network.append(message)
                else:                                  # the shell sees the connection down at once
                    self._unreachable(message, f"bookie {bookie} is down")
        client.outcomes += outcomes
        return outcomes

    def _answer_client(self, client: ScriptedClient, events: list) -> list:
        outcomes: list = []
        for _, event in events:
            outcomes += client.step(event)          # a stopped client ignores it
        return outcomes

    # -- network --------------------------------------------------------------------------
    def queued(self, **match) -> list[Message]:
        """queued lists the messages on the network that match, oldest first."""
        return [m for m in self.network if m.matches(**match)]

    def _take(self, **match) -> Message:
        for index, message in enumerate(self.network):
            if message.matches(**match):
                return self.network.pop(index)
        raise AssertionError(f"no queued message matches {match}\n{self.dump()}")

    def deliver(self, **match) -> list:
        """deliver hands the oldest matching message to its receiver and returns the outcomes a
        client emitted on it (a bookie's answers are queued, durable ones only at its next sync)."""
        return self._deliver(self._take(**match))

    def deliver_all(self, **match) -> list:
        """deliver_all delivers matching messages, and the matching messages that follow from them,
        until none is left; each bookie that takes a message syncs right after it."""
        outcomes: list = []
        while self.queued(**match):
            message = self._take(**match)
            outcomes += self._deliver(message)
            if message.receiver in self.bookies:
                self.sync(message.receiver)
        return outcomes

    def drop(self, **match) -> Message:
        """drop loses the oldest matching message; its sender is never told."""
        message = self._take(**match)
        self.log(f"DROP {message}")
        return message

    def drop_all(self, **match) -> list[Message]:
        """drop_all loses every queued message that matches."""
        return [self.drop(**match) for _ in self.queued(**match)]

    def fail(self, status: Status = Status.UNREACHABLE, **match) -> Message:
        """fail answers the oldest matching request with `status` instead of delivering it, as the
        shell does for a request that timed out or whose bookie could not be reached."""
        message = self._take(**match)
        assert message.response is None, f"fail takes a request, not the answer {message}"
        self._unreachable(message, "failed by the test", status)
        return message

    def _unreachable(self, request: Message, why: str, status: Status = Status.UNREACHABLE) -> None:
        self.network.append(Message(request.receiver, request.sender, request.request, Failure(status, why)))

    def _deliver(self, message: Message) -> list:
        self.log(f"deliver {message}")
        bookie = self.bookies.get(message.receiver)
        if bookie is not None:       # up: crash() answered whatever was queued for it
            self._apply(bookie, bookie.handler.step(message.sender.encode(), message.request))
            return []
        client = self.clients[message.receiver]
        answer = message.response
        if isinstance(answer, Failure):
            events = self.dispatcher.unreachable(message.sender, [message.request], answer.message, answer.status)
        else:
            events = self.dispatcher.on_response(message.sender, answer)
        return self._answer_client(client, events)

    def _apply(self, bookie: ScriptedBookie, commands: list) -> None:
        """_apply carries out a BookieHandler's commands: stores are volatile, durable replies wait."""
        for command in commands:
            if type(command) is StoreEntries:
                for entry_id, data in command.entries:
                    bookie.storage.put(command.ledger_id, entry_id, data)
            elif type(command) is StoreLedgerState:
                bookie.storage.volatile_states[command.ledger_id] = command.state
            elif command.durable:
                bookie.held.append(command)
            else:
                self._answer(bookie, command)

    def _answer(self, bookie: ScriptedBookie, reply: Reply) -> None:
        request = self._sent[reply.response.txn]
        response = replace(reply.response, disk=bookie.disk)     # the frame names the disk, as a bookie's does
        self.network.append(Message(bookie.address, request.sender, request.request, response))

    def sync(self, address: str) -> None:
        """sync makes the bookie's stores durable, then sends the answers that waited for them."""
        bookie = self.bookies[address]
        if not bookie.up:
            return
        bookie.storage.sync()
        held, bookie.held = bookie.held, []
        for reply in held:
            self._answer(bookie, reply)

    def crash(self, address: str) -> None:
        """crash takes a bookie down: it loses what was not synced, and every request to it (queued,
        or taken but unanswered) is answered UNREACHABLE, as the shell does on a lost connection."""
        bookie = self.bookies[address]
        self.log(f"CRASH {address}")
        bookie.up = False
        bookie.storage.crash()
        for message in [m for m in self.network if m.receiver == address]:
            self.network.remove(message)
            self._unreachable(message, f"bookie {address} crashed")
        for reply in bookie.held:
            self._unreachable(self._sent[reply.response.txn], f"bookie {address} crashed")
        bookie.held = []

    def restart(self, address: str, empty: bool = False) -> None:
        """restart brings a crashed bookie back with its durable state, or with `empty` storage as a new disk
        (a wiped disk formatted again: what `walkit bookies format-and-rejoin` lets start, or memory storage)."""
        bookie = self.bookies[address]
        self.log(f"RESTART {address}" + (" ON A NEW, EMPTY DISK" if empty else ""))
        bookie.up = True
        bookie.starts += 1
        if empty:
            bookie.storage = VolatileStorage()
            bookie.disk = 100 + max(b.disk for b in self.bookies.values())
        bookie.handler = BookieHandler(bookie.storage, instance=bookie.starts)

    # -- metadata -------------------------------------------------------------------------
    def cas(self, client: str | ScriptedClient | None = None) -> list:
        """cas runs the oldest queued metadata write (of `client`, if given) as a compare-and-swap
        and returns the outcomes the client emitted on the answer."""
        owner, command = self._take_op(ev.WriteMetadata, client)
        events = self._run_metadata(owner, command, bookies=None)
        self.log(f"{owner.name} CAS v{command.expected_version} {_describe(command.metadata)}: "
                 f"{type(events[0][1]).__name__} (now v{self.store.version})")
        return self._answer_client(owner, events)

    def choose(self, client: str | ScriptedClient | None = None, bookies: list[str] | None = None) -> list:
        """choose answers the oldest request for bookies (of `client`, if given) with `bookies`, by
        default every live bookie outside the request's exclusions, in address order."""
        owner, command = self._take_op(ev.ChooseBookies, client)
        if bookies is None:
            bookies = [b for b, bookie in self.bookies.items() if bookie.up]
        events = self._run_metadata(owner, command, bookies)
        chosen = events[0][1]
        self.log(f"{owner.name} is offered bookies {chosen.bookies}"
                 + (f", {sorted(chosen.back)} back" if chosen.back else ""))
        return self._answer_client(owner, events)

    def _run_metadata(self, owner: ScriptedClient, command, bookies: list[str] | None) -> list:
        """_run_metadata hands a metadata command to the dispatcher and runs its store calls at once
        (a re-read after a conflict included) until the event for the machine comes out."""
        self.dispatcher.execute(owner, [command], self.now)
        events: list = []
        calls = self.dispatcher.take_calls()
        while calls and not events:
            for call in calls:
                if call.method == "live_bookies":
                    value, error = Bookies(bookies, {b: self.bookies[b].disk for b in bookies}), None
                else:
                    value, error = self.store.run(call)
                events += self.dispatcher.store_result(call.call_id, value, error)
            calls = self.dispatcher.take_calls()
        assert events, f"{command} produced no event"
        return events

    def transform_metadata(self, change: Callable[[LedgerMetadata], LedgerMetadata]) -> None:
        """transform_metadata has another client write `change(metadata)` successfully."""
        self.store.transform(change)
        self.log(f"another client writes v{self.store.version} {_describe(self.store.metadata)}")

    def _take_op(self, kind: type, client) -> tuple[ScriptedClient, object]:
        name = client.name if isinstance(client, ScriptedClient) else client
        for index, (owner, command) in enumerate(self.metadata_ops):
            if type(command) is kind and (name is None or owner.name == name):
                del self.metadata_ops[index]
                return owner, command
        raise AssertionError(f"no queued {kind.__name__} from {name or 'any client'}\n{self.dump()}")

    # -- time and quiescence ----------------------------------------------------------------
    def tick(self, ms: int) -> None:
        """tick advances time by `ms` and tells every live client and bookie."""
        self.now += ms
        self.log(f"tick to {self.now} ms")
        for client in list(self.clients.values()):
            client.step(ev.Ticked(now_ms=self.now))
        for bookie in self.bookies.values():
            if bookie.up:
                self._apply(bookie, bookie.handler.tick(self.now))

    def settle(self, max_steps: int = 10000) -> None:
        """settle runs the network, bookie syncs, bookie choices and metadata writes, oldest first,
        until nothing is left to do."""
        for _ in range(max_steps):
            if self.network:
                self.deliver_all()
            elif self.metadata_ops:
                owner, command = self.metadata_ops[0]
                if type(command) is ev.WriteMetadata:
                    self.cas(owner)
                else:
                    self.choose(owner)
            elif any(b.held for b in self.bookies.values() if b.up):
                for address in self.bookies:
                    self.sync(address)
            else:
                return
        raise AssertionError(f"the cluster did not settle in {max_steps} steps\n{self.dump()}")

    # -- views ----------------------------------------------------------------------------
    def write_set(self, entry_id: int) -> tuple[str, ...]:
        """write_set is the bookies that store `entry_id` under the stored metadata."""
        md = self.store.metadata
        return write_set_bookies(entry_id, md.ensemble_at(entry_id), md.write_quorum)

    def payload_on(self, address: str, entry_id: int) -> bytes | None:
        """payload_on is the payload of `entry_id` the bookie stores durably, or None."""
        data = self.bookies[address].storage.durable.get((LEDGER_ID, entry_id))
        return None if data is None else unpack_entry(LEDGER_ID, entry_id, data).payload

    def log(self, text: str) -> None:
        """log appends a line to the trace."""
        self.trace.append(f"{self.now:5d} {text}")

    def dump(self) -> str:
        """dump describes the trace's tail and everything queued, for failure messages."""
        queued = [f"  {m}" for m in self.network] + [f"  {o.name}: {_describe(c)}" for o, c in self.metadata_ops]
        return "\n".join(["--- trace ---", *self.trace[-40:], "--- queued ---", *queued])


def _describe(value) -> str:
    if isinstance(value, LedgerMetadata):
        return f"{value.state} last={value.last_entry_id} fragments={dict(value.ensembles)}"
    if hasattr(value, "metadata"):
        return f"{type(value).__name__}({_describe(value.metadata)})"
    if isinstance(value, ev.DeliverEntries):
        return f"DeliverEntries({[e.entry_id for e in value.entries]})"
    return repr(value)
