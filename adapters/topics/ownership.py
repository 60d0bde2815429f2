"""walkit.adapters.topics.ownership runs a node of every slot on this broker and says which broker should lead each.

Every partition and every group bucket is a *slot*, a walkit.replicate machine (partition_name,
bucket_name). Every broker runs a node of every slot, so each slot has a hot follower on every
broker; walkit.replicate elects the leader, fences the previous one by opening the log, and
moves leadership when the leader dies (its election key goes with its metadata session, after
the session's TTL). This module only decides where leadership should be:

- a slot's preferred broker is the live broker of the highest weight for it, a hash of the slot and
  the broker (rendezvous hashing: a broker that dies or joins moves only the slots it led or now
  weighs most for, so the others' partitions and group coordinators stay put). A node campaigns
  (walkit.replicate's `campaign_when`) while its broker is the slot's preferred one, or once the
  slot has had no live leader for ORPHAN_S; a dead broker's registration goes with its session
  too, so its slots get new preferred brokers, which take them over at once;
- once the live brokers stayed the same for HANDOVER_S, a broker steps down (a few slots per
  second) from the slots it leads whose preferred broker is another live one, so a broker that
  joins, or comes back, takes its share of the partitions and groups.

The ownership thread, every REFRESH_S or sooner when the metadata changes, opens nodes for new
slots and closes those of deleted topics (through the broker's `open_slot` and `close_slot`),
and hands a ClusterView (brokers, topics, each slot's leader) to the event loop when it changed.
It reads the live brokers and the topics when their watch fired, and a slot's leader when the
watch of the elections named it; the brokers and topics again every FULL_REFRESH_S, every leader
every LEADERS_REFRESH_S. So an idle broker with a thousand partitions makes few metadata requests.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field

from walkit.adapters.topics.catalog import PREFIX, BrokerInfo, Catalog, Topic, bucket_name
from walkit.election import ELECTIONS_PREFIX
from walkit.errors import WalkitError
from walkit.watchhub import watch_shared

log = logging.getLogger("walkit.adapters.topics")

REFRESH_S = 0.5
#: How often the brokers, topics and every slot's leader are read even though no watch fired.
FULL_REFRESH_S = 30.0
#: How often every slot's leader is read again although no watch named it (the watch of the elections
#: tells of each change; this only bounds how long a lost watch event could leave a leader unknown).
LEADERS_REFRESH_S = 30.0
ORPHAN_S = 1.5
#: The metadata prefix of walkit.replicate's elections (watched: a slot's leader is read when its key changes).
ELECTIONS = "elections/replication"
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
    def label(self) -> str:
        """label names the slot in logs, and places it (`preferred` hashes it)."""
        return bucket_name(self.partition) if self.topic is None else f"kafka-{self.topic}-{self.partition}"


def preferred(slot: Slot, live: list[int], default: int) -> int:
    """preferred is the broker that should lead `slot`: the live broker of the highest weight, a hash of the
    slot's label with the broker's id (rendezvous hashing). A broker that dies moves only its own slots,
    each to the survivor of its next weight; one that joins takes only the slots it now weighs most for."""
    if not live:
        return default
    label = slot.label.encode()
    return max(live, key=lambda broker: (_weight(label, broker), broker))


def _weight(label: bytes, broker: int) -> int:
    return int.from_bytes(hashlib.blake2b(label + b"@" + str(broker).encode(), digest_size=8).digest(), "big")


def election_key(name: str) -> str:
    """election_key is the metadata key naming the leader of walkit.replicate machine `name`.

    walkit.replicate elects through walkit.election as ``replication/<name>``, whose leader
    holds the ephemeral key ``elections/<election>/leader``.
    """
    return f"elections/replication/{name}/leader"


@dataclass
class ClusterView:
    """ClusterView is what the ownership thread last read: brokers, topics and slot leaders."""

    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, Topic] = field(default_factory=dict)
    leaders: dict[Slot, int] = field(default_factory=dict)
    epochs: dict[Slot, int] = field(default_factory=dict)     # the leaders' election epochs, where published

    def controller(self) -> int:
        """controller is the broker Metadata names as controller (the lowest live id), -1 if none."""
        return min(self.brokers) if self.brokers else -1


class Ownership:
    """Ownership runs the ownership thread of one broker (see the module doc).

    `open_slot(slot, topic)` starts and returns the slot's walkit.replicate node (topic None
    for a bucket), `close_slot(slot, node)` closes it (on a worker thread), `publish(view)`
    gives each new view to the event loop. `group_buckets` is the cluster's count of buckets.
    """

    def __init__(self, store, broker_id: int, *, group_buckets: int, open_slot, close_slot, publish) -> None:
        self.store = store
        self.catalog = Catalog(store)
        self.broker_id = broker_id
        self.group_buckets = group_buckets
        self._open_slot = open_slot
        self._close_slot = close_slot
        self._publish = publish
        self.nodes: dict[Slot, object] = {}
        self._topic_ids: dict[Slot, str | None] = {}
        self._live: frozenset[int] = frozenset()
        self._live_since = time.monotonic()
        self._handed_at = 0.0
        self._orphaned_since: dict[Slot, float] = {}
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._closing = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="walkit-topics-close")
        self._thread = threading.Thread(target=self._run, name="walkit-topics-ownership", daemon=True)
        self._watches = []
        self.view = ClusterView()
        self._published: ClusterView | None = None
        self._brokers: dict[int, BrokerInfo] = {}
        self._topics: dict[str, Topic] = {}
        self._catalog_dirty = True
        self._next_full = self._next_leaders = 0.0
        self._known: dict[Slot, int | None] = {}      # each slot's leader as last read
        self._epochs: dict[Slot, int | None] = {}     # and its epoch (None: not published when read)
        self._dirty: set[str] = set()                 # election keys changed since they were read
        self._dirty_lock = threading.Lock()
        self._may: dict[Slot, bool] = {}

    def start(self) -> "Ownership":
        """start starts the ownership thread."""
        for prefix in (f"{PREFIX}/topics", f"{PREFIX}/brokers"):
            self._watches.append(self.store.watch(prefix, self._catalog_changed))
        self._watches.append(watch_shared(self.store, ELECTIONS_PREFIX, ELECTIONS, self._election_changed))
        self._thread.start()
        return self

    def wake(self) -> None:
        """wake makes the thread look again now (a topic was created or deleted)."""
        self._changed.set()

    def stop(self) -> None:
        """stop ends the thread and closes every node (leaders step down, so others take over at once)."""
        self._stop.set()
        self._changed.set()
        self._thread.join(15)
        for watch in self._watches:
            watch.cancel()
        for slot in list(self.nodes):
            self._close(slot)
        self._closing.shutdown(wait=True)

    def may_campaign(self, slot: Slot, topic_id: str | None) -> bool:
        """may_campaign tells a node of `slot` (of topic `topic_id`) whether to campaign now (its `campaign_when`)."""
        if self._stop.is_set():
            return False
        view = self.view
        if slot.topic is not None:
            topic = view.topics.get(slot.topic)
            if topic is None or topic.id != topic_id:
                return False                      # deleted, or created again: this node is closing
        if preferred(slot, sorted(view.brokers), self.broker_id) == self.broker_id:
            return True
        since = self._orphaned_since.get(slot)
        return since is not None and time.monotonic() - since >= ORPHAN_S

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
        now = time.monotonic()
        full = now >= self._next_full
        if full:
            self._next_full = now + FULL_REFRESH_S
        if full or self._catalog_dirty:
            self._catalog_dirty = False              # a change during the reads sets it again
            try:
                self._brokers, self._topics = self.catalog.brokers(), self.catalog.topics()
            except WalkitError:
                self._catalog_dirty = True
                raise
        brokers, topics = self._brokers, self._topics
        wanted: dict[Slot, Topic | None] = {Slot(None, b): None for b in range(self.group_buckets)}
        wanted.update({Slot(t.name, p): t for t in topics.values() for p in range(t.partitions)})
        for slot in list(self.nodes):
            topic = wanted.get(slot)
            if slot not in wanted or (topic is not None and topic.id != self._topic_ids[slot]):
                self._close(slot)
        all_leaders = now >= self._next_leaders
        if all_leaders:
            self._next_leaders = now + LEADERS_REFRESH_S
        leaders = self._leaders(all_leaders)
        epochs = {slot: self._epochs[slot] for slot in leaders if self._epochs.get(slot) is not None}
        for slot in wanted:
            if leaders.get(slot) in brokers:
                self._orphaned_since.pop(slot, None)
            else:
                self._orphaned_since.setdefault(slot, now)
        self.view = view = ClusterView(brokers, topics, leaders, epochs)
        if view != self._published:
            self._published = view
            self._publish(view)
        for slot, node in list(self.nodes.items()):  # a node held back by may_campaign looks again at once
            may = self.may_campaign(slot, self._topic_ids.get(slot))
            if self._may.get(slot) != may:
                self._may[slot] = may
                node.recheck_campaign()
        for slot, topic in wanted.items():
            if slot not in self.nodes and not self._stop.is_set():
                self._topic_ids[slot] = topic.id if topic is not None else None
                self.nodes[slot] = self._open_slot(slot, topic)
        live = frozenset(brokers)
        if live != self._live:
            self._live, self._live_since = live, now
        elif now - self._live_since >= HANDOVER_S:
            self._hand_over(sorted(live))

    def _leaders(self, full: bool) -> dict[Slot, int]:
        """_leaders is the leader of every slot this broker runs a node of.

        A slot's leader is read again only when the watch of the elections named its key (or a
        parent of it), every LEADERS_REFRESH_S (`full`), or when it was never read.
        """
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        everything = full or ELECTIONS in dirty or any(not key.endswith("/leader") for key in dirty)
        leaders = {}
        for slot, node in list(self.nodes.items()):
            me = int(node.node_id)
            if node.is_leader:
                self._known[slot], self._epochs[slot] = me, node.election.epoch
            elif (everything or slot not in self._known or node.election.leader_key in dirty
                  or self._known[slot] == me or (self._known[slot] is not None and self._epochs.get(slot) is None)):
                # the last entry: this node led and no longer does; the change of key that told of its
                # successor may have come while it still led (and been taken then), so read it again
                held = node.election.leadership()
                self._known[slot] = None if held is None else int(held[0])
                self._epochs[slot] = None if held is None else held[1]
            if self._known.get(slot) is not None:
                leaders[slot] = self._known[slot]
        return leaders

    def _election_changed(self, key: str) -> None:
        with self._dirty_lock:
            self._dirty.add(key)
        self._changed.set()

    def _catalog_changed(self, key: str) -> None:
        self._catalog_dirty = True
        self._changed.set()

    def _close(self, slot: Slot) -> None:
        node = self.nodes.pop(slot)
        self._topic_ids.pop(slot, None)
        self._orphaned_since.pop(slot, None)
        self._known.pop(slot, None)
        self._epochs.pop(slot, None)
        self._may.pop(slot, None)
        try:
            self._closing.submit(self._close_slot, slot, node)
        except RuntimeError:
            self._close_slot(slot, node)            # shutting down: here

    def _hand_over(self, live: list[int]) -> None:
        """_hand_over steps down from a few led slots whose preferred broker is another live one."""
        now = time.monotonic()
        if now - self._handed_at < 1.0:
            return
        moved = 0
        for slot, node in list(self.nodes.items()):
            target = preferred(slot, live, self.broker_id)
            if not node.is_leader or target == self.broker_id:
                continue
            log.info("broker %d hands %s over to broker %d", self.broker_id, slot.label, target)
            node.step_down()
            self._handed_at = now
            moved += 1
            if moved >= HANDOVERS_PER_S:
                return
