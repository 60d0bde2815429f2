"""walkit.adapters.topics.ownership decides which partitions and group buckets this broker leads.

Every partition and every group bucket is a *slot*: a walkit log and an election of the same
name (walkit.election). The ownership thread, every REFRESH_S or sooner when the metadata
changes, reads the live brokers, the topics and every slot's leader into a `ClusterView`
for the event loop, then campaigns for the slots that have no leader and that this broker
should take: those whose preferred broker (a hash of the slot over the live brokers) it is at
once, any other after ORPHAN_S, so a dead broker's slots move to the others within seconds
(its election keys and registration are ephemeral and vanish together). Once the live
brokers stayed the same for HANDOVER_S, a broker gives up (a few at a time) the slots it
leads whose preferred broker is another one, so a broker that joins, or comes back, takes its
share of the partitions and groups.

Winning an election is not yet leading: the winner opens the slot's log, which fences the
previous leader's writer (its next append fails with LedgerFenced), replays the log into the
slot's state machine (partition.py, offsets.py) on a worker thread, and only then hands the
writer and the state to the event loop (broker.py), which starts serving. A leadership ends
when an append fails, the metadata session is lost, or the topic is deleted; the broker then
closes the writer and resigns, and may campaign again later.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import zlib
from dataclasses import dataclass, field

from walkit.election import LeaderElection
from walkit.errors import Timeout, WalkitError
from walkit.adapters.topics.catalog import (
    GROUP_BUCKETS, PREFIX, BrokerInfo, Catalog, Topic, bucket_log, partition_log,
)

log = logging.getLogger("walkit.adapters.topics")

REFRESH_S = 0.5
ORPHAN_S = 1.5
#: How long the set of live brokers must stay the same before slots move to their preferred broker.
HANDOVER_S = 10.0
#: Most slots handed over per second, so clients move a few partitions at a time.
HANDOVERS_PER_S = 2


@dataclass(frozen=True)
class Slot:
    """Slot is a partition (`topic`, `partition`) or a group bucket (topic None, `partition` = bucket)."""

    topic: str | None
    partition: int

    @property
    def log_name(self) -> str:
        """log_name is the slot's walkit log."""
        return bucket_log(self.partition) if self.topic is None else partition_log(self.topic, self.partition)

    @property
    def election_name(self) -> str:
        """election_name is the slot's election (under elections/ in the metadata store)."""
        return f"{PREFIX}/g/{self.partition}" if self.topic is None else f"{PREFIX}/p/{self.topic}/{self.partition}"


def preferred(slot: Slot, live: list[int], default: int) -> int:
    """preferred is the broker that should lead `slot`: a hash of its name over the sorted live brokers."""
    return live[zlib.crc32(slot.log_name.encode()) % len(live)] if live else default


@dataclass
class ClusterView:
    """ClusterView is what the ownership thread last read: brokers, topics and slot leaders."""

    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, Topic] = field(default_factory=dict)
    leaders: dict[Slot, int] = field(default_factory=dict)

    def controller(self) -> int:
        """controller is the broker Metadata names as controller (the lowest live id), -1 if none."""
        return min(self.brokers) if self.brokers else -1


class Ownership:
    """Ownership runs the ownership thread of one broker (see the module doc).

    `install(slot, writer, election)` is called on a worker thread once a won slot's log is
    open; it replays the log and hands the slot to the event loop. `publish(view)` gives each
    new view to the loop; `release(slot)` asks the loop to give a slot up (its topic vanished,
    or it moves to its preferred broker).
    """

    def __init__(self, client, broker_id: int, *, install, publish, release, log_options) -> None:
        self.client = client
        self.catalog = Catalog(client.store)
        self.broker_id = broker_id
        self._install = install
        self._publish = publish
        self._release = release
        self._live: frozenset[int] = frozenset()
        self._live_since = time.monotonic()
        self._handed_at = 0.0
        self._log_options = log_options
        self._elections: dict[Slot, LeaderElection] = {}
        self._orphaned_since: dict[Slot, float] = {}
        self._taking: set[Slot] = set()
        self._handing: set[Slot] = set()          # released, until the resignation is done
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._workers = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="walkit-topics-takeover")
        self._thread = threading.Thread(target=self._run, name="walkit-topics-ownership", daemon=True)
        self._watches = []
        self.view = ClusterView()

    def start(self) -> "Ownership":
        """start starts the ownership thread."""
        store = self.client.store
        for prefix in (f"{PREFIX}/topics", f"{PREFIX}/brokers", f"elections/{PREFIX}"):
            self._watches.append(store.watch(prefix, lambda key: self._changed.set()))
        self._thread.start()
        return self

    def wake(self) -> None:
        """wake makes the thread look again now (a topic was created or a leadership ended)."""
        self._changed.set()

    def stop(self) -> None:
        """stop ends the thread and resigns every election."""
        self._stop.set()
        self._changed.set()
        self._thread.join(15)
        self._workers.shutdown(wait=True)
        for watch in self._watches:
            watch.cancel()
        for election in self._elections.values():
            election.resign()

    def resign(self, slot: Slot, writer) -> None:
        """resign closes a lost or dropped slot's writer and gives up its election (on a worker thread)."""
        def work() -> None:
            if writer is not None:
                try:
                    writer.close(timeout=5)
                except Exception as exc:  # noqa: BLE001 - fenced or deleted: nothing to close
                    log.info("closing the writer of %s: %s: %s", slot.log_name, type(exc).__name__, exc)
            election = self._elections.get(slot)
            if election is not None:
                election.resign()
            self._handing.discard(slot)
            self._changed.set()
        try:
            self._workers.submit(work)
        except RuntimeError:
            work()                              # shutting down: do it here

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except WalkitError as exc:
                log.warning("ownership: %s: %s", type(exc).__name__, exc)
            except Exception:  # noqa: BLE001 - keep the broker's slots moving
                log.exception("ownership round failed")
            self._changed.wait(REFRESH_S)
            self._changed.clear()

    def _round(self) -> None:
        brokers = self.catalog.brokers()
        topics = self.catalog.topics()
        slots = [Slot(None, b) for b in range(GROUP_BUCKETS)]
        slots += [Slot(t.name, p) for t in topics.values() for p in range(t.partitions)]
        leaders: dict[Slot, int] = {}
        for slot in slots:
            election = self._elections.get(slot)
            if election is None:
                election = self._elections[slot] = LeaderElection(self.client.store, slot.election_name,
                                                                    str(self.broker_id))
            leader = election.leader()
            if leader is not None:
                leaders[slot] = int(leader)
        view = ClusterView(brokers, topics, leaders)
        self.view = view
        self._publish(view)
        gone = [slot for slot in self._elections if slot.topic is not None and slot.topic not in topics]
        for slot in gone:
            self._release(slot)
            self._elections.pop(slot).resign()
        now = time.monotonic()
        live = sorted(brokers)
        if frozenset(live) != self._live:
            self._live, self._live_since = frozenset(live), now
        elif now - self._live_since >= HANDOVER_S:
            self._hand_over(slots, live)
        for slot in slots:
            if slot in leaders or slot in self._taking or self._stop.is_set():
                self._orphaned_since.pop(slot, None)
                continue
            since = self._orphaned_since.setdefault(slot, now)
            if preferred(slot, live, self.broker_id) != self.broker_id and now - since < ORPHAN_S:
                continue
            self._campaign(slot, topics.get(slot.topic))

    def _hand_over(self, slots: list[Slot], live: list[int]) -> None:
        """_hand_over gives up a few led slots whose preferred broker is another live one."""
        now = time.monotonic()
        if now - self._handed_at < 1.0:
            return
        moved = 0
        for slot in slots:
            election = self._elections.get(slot)
            if election is None or not election.is_leader or slot in self._taking or slot in self._handing:
                continue
            target = preferred(slot, live, self.broker_id)
            if target == self.broker_id:
                continue
            log.info("broker %d hands %s over to broker %d", self.broker_id, slot.log_name, target)
            self._handing.add(slot)
            self._release(slot)
            self._handed_at = now
            moved += 1
            if moved >= HANDOVERS_PER_S:
                return

    def _campaign(self, slot: Slot, topic: Topic | None) -> None:
        election = self._elections[slot]
        try:
            election.campaign(timeout=0.05)
        except Timeout:
            return
        self._taking.add(slot)
        self._orphaned_since.pop(slot, None)
        options = dict(self._log_options)
        if topic is not None:
            options.update(topic.log_options())
        self._workers.submit(self._take, slot, options)

    def _take(self, slot: Slot, options: dict) -> None:
        """_take opens the slot's log (fencing the previous leader) and installs it (worker thread)."""
        writer = None
        try:
            writer = self.client.open_log(slot.log_name, **options)
            log.info("broker %d leads %s (ledger %d)", self.broker_id, slot.log_name, writer.ledger_id)
            self._install(slot, writer, self._elections[slot])
        except Exception as exc:  # noqa: BLE001 - give the slot up; someone (maybe us) tries again
            log.warning("taking over %s failed: %s: %s", slot.log_name, type(exc).__name__, exc)
            self.resign(slot, writer)
        finally:
            self._taking.discard(slot)
