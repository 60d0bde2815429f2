"""walkit.adapters.topics.coordinator runs the consumer groups this broker coordinates.

Kafka's classic group protocol, broker side: members JoinGroup, the coordinator waits until
every known member has (re)joined or the rebalance timeout passed, then answers all joins at
once with a new generation, the protocol every member supports (most preferred first), and,
to the leader only, the members' subscriptions. The leader computes the assignment on the
client (range, roundrobin, cooperative-sticky: the broker only passes bytes through) and
sends it in SyncGroup; every member's SyncGroup is answered with its share. Heartbeats keep
a member alive; one silent for its session timeout is removed and the group rebalances.

    Empty -> PreparingRebalance -> CompletingRebalance -> Stable -> PreparingRebalance ...

A group that starts from Empty waits `initial_delay_ms` (extended by each new member, at most
the rebalance timeout) so that consumers started together share the first generation, as
Kafka's group.initial.rebalance.delay.ms does.

Memberships are replicated as Kafka's group metadata is: when the leader's SyncGroup brings a
generation's assignment, the coordinator `persist`s the membership (a record of the group's
bucket, offsets.py) and answers the SyncGroups only once it is stored, so every generation a
member was told of is in the bucket's log. A broker that takes the bucket over `load`s the
stored groups as Stable, with every member's session starting then: members that heartbeat or
commit with their generation go on without a rebalance (static members included), and those
that do not are removed after their session timeout, as on any coordinator. A rebalance under
way when the coordinator died is not stored: its members get ILLEGAL_GENERATION or
UNKNOWN_MEMBER_ID from the new coordinator and join again. The committed offsets are durable
(offsets.py). Everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

from walkit.adapters.topics import errors
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.offsets import MemberInfo, Membership, membership_record

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"

log = logging.getLogger("walkit.adapters.topics")


@dataclass
class Member(MemberInfo):
    """Member is one consumer in a group: what its group's membership stores, and its pending requests."""

    join: asyncio.Future | None = None
    sync: asyncio.Future | None = None
    last_seen: float = field(default_factory=time.monotonic)

    def metadata(self, protocol: str) -> bytes:
        """metadata is the member's subscription for `protocol`."""
        return next((data for name, data in self.protocols if name == protocol), b"")


@dataclass
class JoinResult:
    """JoinResult is what a JoinGroup is answered with."""

    error: int
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list = field(default_factory=list)      # (member id, instance id, metadata), leader only


class Group:
    """Group is one consumer group's membership and generation."""

    def __init__(self, group_id: str, bucket: int) -> None:
        self.id = group_id
        self.bucket = bucket
        self.state = EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.not_before = 0.0                # initial delay: no completion before this
        self.deadline = 0.0                  # rebalance timeout
        self.timer: asyncio.TimerHandle | None = None
        self.stored = False                  # a membership of this group is in the bucket's log
        self.storing = False                 # the leader's assignment is being stored

    def membership(self) -> Membership:
        """membership is what the bucket stores of the group (offsets.py)."""
        return Membership(self.generation, self.protocol_type, self.protocol, self.leader, tuple(
            MemberInfo(m.id, m.instance_id, m.client_id, m.client_host, m.session_timeout_ms, m.rebalance_timeout_ms,
                       list(m.protocols), m.assignment) for m in self.members.values()))

    def choose_protocol(self) -> str | None:
        """choose_protocol picks the protocol all members support, by the members' preference votes."""
        members = list(self.members.values())
        common = set(name for name, _ in members[0].protocols)
        for member in members[1:]:
            common &= {name for name, _ in member.protocols}
        if not common:
            return None
        votes = {name: 0 for name in common}
        for member in members:
            preferred = next(name for name, _ in member.protocols if name in common)
            votes[preferred] += 1
        return max(sorted(common), key=lambda name: votes[name])


class GroupCoordinator:
    """GroupCoordinator holds the groups of the buckets this broker coordinates."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, initial_delay_ms: int = 1000, persist=None,
                 bucket_of=None) -> None:
        """`persist(group_id, record)` appends a record to the group's bucket and returns a Future of it
        (KafkaError if this broker does not coordinate the group); `bucket_of(group_id)` is its bucket.
        Without them (a coordinator alone, in tests) records are dropped and every group is in bucket 0."""
        self.loop = loop
        self.initial_delay_s = initial_delay_ms / 1000
        self.groups: dict[str, Group] = {}
        self._persist = persist or self._drop_record
        self._bucket_of = bucket_of or (lambda group_id: 0)

    def _drop_record(self, group_id: str, record: bytes) -> asyncio.Future:
        done = self.loop.create_future()
        done.set_result(None)
        return done

    def _store(self, group: Group, membership: Membership | None) -> asyncio.Future:
        """_store appends the group's membership (None: it emptied) to its bucket; the Future fails with KafkaError."""
        try:
            return self._persist(group.id, membership_record(group.id, membership, int(time.time() * 1000)))
        except KafkaError as exc:
            failed = self.loop.create_future()
            failed.set_exception(exc)
            return failed

    # -- join ---------------------------------------------------------------------------------
    def join(self, group_id: str, member_id: str, instance_id: str | None, client_id: str, client_host: str,
             session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
             protocols: list[tuple[str, bytes]]) -> asyncio.Future:
        """join handles a JoinGroup; the Future resolves to a JoinResult once the rebalance completes."""
        answer = self.loop.create_future()
        if not protocols:
            answer.set_result(JoinResult(errors.INCONSISTENT_GROUP_PROTOCOL))
            return answer
        if not 1000 <= session_timeout_ms <= 1_800_000:
            answer.set_result(JoinResult(errors.INVALID_SESSION_TIMEOUT))
            return answer
        group = self.groups.get(group_id)
        if group is None:
            if member_id:                               # a stranger's rejoin creates no group (as Kafka)
                answer.set_result(JoinResult(errors.UNKNOWN_MEMBER_ID, member_id=member_id))
                return answer
            group = self.groups[group_id] = Group(group_id, self._bucket_of(group_id))
        if group.members and protocol_type != group.protocol_type:
            answer.set_result(JoinResult(errors.INCONSISTENT_GROUP_PROTOCOL))
            return answer
        if group.members and not ({n for n, _ in protocols} & self._common(group, exclude=member_id)):
            answer.set_result(JoinResult(errors.INCONSISTENT_GROUP_PROTOCOL))
            return answer
        if not member_id and instance_id:
            member_id = next((m.id for m in group.members.values() if m.instance_id == instance_id), "")
        if member_id and member_id not in group.members:
            answer.set_result(JoinResult(errors.UNKNOWN_MEMBER_ID, member_id=member_id))
            return answer
        now = time.monotonic()
        if not member_id:
            member = Member(f"{client_id or 'member'}-{uuid.uuid4()}", instance_id, client_id, client_host,
                            session_timeout_ms, rebalance_timeout_ms, list(protocols))
            group.members[member.id] = member
            changed = True
        else:
            member = group.members[member_id]
            # As Kafka: the leader's rejoin rebalances a Stable group (it may assign anew), but in
            # CompletingRebalance it is a member that missed its JoinGroup answer, answered again;
            # rebalancing then would start over each time a slow leader asks again, without end.
            changed = member.protocols != list(protocols) or (member.id == group.leader and group.state == STABLE)
            member.protocols = list(protocols)
            member.session_timeout_ms, member.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        member.last_seen = now
        if member.join is not None and not member.join.done():
            member.join.set_result(JoinResult(errors.UNKNOWN_MEMBER_ID, member_id=member.id))
        group.protocol_type = protocol_type
        if group.state in (STABLE, COMPLETING) and not changed:
            answer.set_result(self._join_result(group, member))
            return answer
        member.join = answer
        if group.state == EMPTY:
            group.not_before = now + self.initial_delay_s
            group.deadline = now + rebalance_timeout_ms / 1000
        elif group.state == PREPARING and group.not_before > now:
            group.not_before = min(now + self.initial_delay_s, group.deadline)
        self._prepare(group, f"{member.id} joins")
        return answer

    def _common(self, group: Group, exclude: str) -> set[str]:
        names = None
        for member in group.members.values():
            if member.id == exclude:
                continue
            mine = {n for n, _ in member.protocols}
            names = mine if names is None else names & mine
        return names if names is not None else {n for m in group.members.values() for n, _ in m.protocols}

    def _prepare(self, group: Group, reason: str) -> None:
        """_prepare moves the group to PreparingRebalance (if it is not there) and checks for completion."""
        if group.state != PREPARING:
            log.info("group %s rebalances (generation %d): %s", group.id, group.generation, reason)
            if group.state != EMPTY:
                now = time.monotonic()
                group.not_before = now
                group.deadline = now + max(m.rebalance_timeout_ms for m in group.members.values()) / 1000
            group.state = PREPARING
            for member in group.members.values():
                if member.sync is not None and not member.sync.done():
                    member.sync.set_result((errors.REBALANCE_IN_PROGRESS, b""))
                member.sync = None
        self._check(group)

    def _check(self, group: Group) -> None:
        """_check completes the rebalance when everyone joined (after the initial delay) or time is up."""
        if group.state != PREPARING:
            return
        now = time.monotonic()
        everyone = all(m.join is not None and not m.join.done() for m in group.members.values())
        if (everyone and now >= group.not_before) or now >= group.deadline:
            self._complete(group)
            return
        if group.timer is not None:
            group.timer.cancel()
        wake = group.not_before if everyone else group.deadline
        group.timer = self.loop.call_at(self.loop.time() + max(wake - now, 0.001), self._check, group)

    def _complete(self, group: Group) -> None:
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        for member in [m for m in group.members.values() if m.join is None or m.join.done()]:
            del group.members[member.id]                    # did not rejoin in time
        group.generation += 1
        group.storing = False                               # a store of the last generation answers nobody
        if not group.members:
            self._forget(group)
            return
        group.protocol = group.choose_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = COMPLETING
        log.info("group %s: generation %d, protocol %s, leader %s, %d members", group.id, group.generation,
                 group.protocol, group.leader, len(group.members))
        now = time.monotonic()
        for member in group.members.values():
            member.last_seen = now
            member.assignment = b""
            join, member.join = member.join, None
            join.set_result(self._join_result(group, member))

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        members = []
        if member.id == group.leader:
            members = [(m.id, m.instance_id, m.metadata(group.protocol)) for m in group.members.values()]
        return JoinResult(errors.NONE, group.generation, group.protocol_type, group.protocol, group.leader or "",
                          member.id, members)

    # -- sync, heartbeat, leave ------------------------------------------------------------
    def sync(self, group_id: str, generation: int, member_id: str,
             assignments: list[tuple[str, bytes]]) -> asyncio.Future:
        """sync handles a SyncGroup; the Future resolves to (error code, assignment)."""
        answer = self.loop.create_future()
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group else None
        if member is None:
            answer.set_result((errors.UNKNOWN_MEMBER_ID, b""))
        elif generation != group.generation:
            answer.set_result((errors.ILLEGAL_GENERATION, b""))
        elif group.state == PREPARING:
            answer.set_result((errors.REBALANCE_IN_PROGRESS, b""))
        elif group.state == STABLE:
            answer.set_result((errors.NONE, member.assignment))
        else:
            member.last_seen = time.monotonic()
            member.sync = answer
            if member_id == group.leader and not group.storing:
                given = dict(assignments)
                for each in group.members.values():
                    each.assignment = given.get(each.id, b"")
                group.storing = True
                generation = group.generation
                stored = self._store(group, group.membership())
                stored.add_done_callback(lambda done: self._stored(group, generation, done))
        return answer

    def _stored(self, group: Group, generation: int, done: asyncio.Future) -> None:
        """_stored answers a generation's SyncGroups once its membership is stored (or could not be)."""
        error = done.exception()
        if self.groups.get(group.id) is not group:
            return                                          # dropped (syncs answered)
        group.stored = group.stored or error is None
        if group.generation != generation or group.state != COMPLETING:
            return                                          # rebalancing again (syncs answered)
        group.storing = False
        if error is not None:
            log.warning("group %s: generation %d not stored: %s", group.id, generation, error)
            code = error.code if isinstance(error, KafkaError) else errors.NOT_COORDINATOR
            for each in group.members.values():
                if each.sync is not None and not each.sync.done():
                    each.sync.set_result((code, b""))
                each.sync = None
            return
        group.state = STABLE
        for each in group.members.values():
            if each.sync is not None and not each.sync.done():
                each.sync.set_result((errors.NONE, each.assignment))
            each.sync = None

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        """heartbeat handles a Heartbeat and returns its error code."""
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group else None
        if member is None:
            return errors.UNKNOWN_MEMBER_ID
        member.last_seen = time.monotonic()
        if group.state == PREPARING:
            return errors.REBALANCE_IN_PROGRESS
        if generation != group.generation:
            return errors.ILLEGAL_GENERATION
        return errors.NONE

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[int]:
        """leave removes members (id, instance id) and rebalances; it returns an error code per member."""
        group = self.groups.get(group_id)
        codes = []
        removed = False
        for member_id, instance_id in members:
            if group is not None and not member_id and instance_id:
                member_id = next((m.id for m in group.members.values() if m.instance_id == instance_id), "")
            member = group.members.pop(member_id, None) if group else None
            if member is None:
                codes.append(errors.UNKNOWN_MEMBER_ID)
                continue
            for pending in (member.join, member.sync):
                if pending is not None and not pending.done():
                    pending.set_result(JoinResult(errors.UNKNOWN_MEMBER_ID) if pending is member.join
                                       else (errors.UNKNOWN_MEMBER_ID, b""))
            codes.append(errors.NONE)
            removed = True
        if removed:
            self._after_removal(group, "members left")
        return codes

    def _after_removal(self, group: Group, reason: str) -> None:
        if not group.members:
            self._forget(group)
        else:
            self._prepare(group, reason)

    def _forget(self, group: Group) -> None:
        """_forget drops a group without members (Kafka's Dead state): a join starts it again at generation 0.

        Its committed offsets stay (offsets.py), and ListGroups still shows it as Empty. Keeping
        empty groups would let any client grow the coordinator's memory by naming new groups.
        """
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        group.state, group.leader, group.protocol = EMPTY, None, None
        if self.groups.get(group.id) is group:
            del self.groups[group.id]
            if group.stored:                                  # else a new coordinator would bring it back
                self._store(group, None).add_done_callback(lambda done: done.exception())

    def check_commit(self, group_id: str, generation: int, member_id: str) -> int:
        """check_commit returns the error code of an OffsetCommit's membership, NONE if it may commit."""
        group = self.groups.get(group_id)
        if generation < 0 and not member_id:
            return errors.NONE                             # a consumer outside group management
        member = group.members.get(member_id) if group else None
        if member is None:
            return errors.UNKNOWN_MEMBER_ID
        member.last_seen = time.monotonic()
        if generation != group.generation:
            return errors.ILLEGAL_GENERATION
        if group.state == COMPLETING:
            return errors.REBALANCE_IN_PROGRESS          # as Kafka: commits in PreparingRebalance are allowed
        return errors.NONE

    # -- time and ownership -----------------------------------------------------------------
    def expire(self) -> None:
        """expire removes members silent for longer than their session timeout (called periodically)."""
        now = time.monotonic()
        for group in list(self.groups.values()):
            gone = [m.id for m in group.members.values()
                    if (m.join is None or m.join.done()) and now - m.last_seen > m.session_timeout_ms / 1000]
            if gone:
                for member_id in gone:
                    member = group.members.pop(member_id)
                    if member.sync is not None and not member.sync.done():
                        member.sync.set_result((errors.UNKNOWN_MEMBER_ID, b""))
                self._after_removal(group, f"session timeout of {', '.join(gone)}")

    def load(self, bucket: int, memberships: dict[str, Membership]) -> None:
        """load takes up the groups a bucket stored (this broker leads it now) as Stable; each member's
        session starts now."""
        now = time.monotonic()
        for group_id, kept in memberships.items():
            if group_id in self.groups or not kept.members:
                continue
            group = self.groups[group_id] = Group(group_id, bucket)
            group.generation, group.protocol_type, group.protocol = kept.generation, kept.protocol_type, kept.protocol
            group.leader, group.state, group.stored = kept.leader, STABLE, True
            for m in kept.members:
                group.members[m.id] = Member(m.id, m.instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                                             m.rebalance_timeout_ms, list(m.protocols), m.assignment, last_seen=now)
            log.info("group %s: generation %d loaded from bucket %d, %d members", group_id, group.generation, bucket,
                     len(group.members))

    def drop(self, bucket: int) -> None:
        """drop forgets the groups of a bucket whose coordination moved away; waiting members get NOT_COORDINATOR."""
        for group_id in [g.id for g in self.groups.values() if g.bucket == bucket]:
            group = self.groups.pop(group_id)
            if group.timer is not None:
                group.timer.cancel()
            for member in group.members.values():
                if member.join is not None and not member.join.done():
                    member.join.set_result(JoinResult(errors.NOT_COORDINATOR))
                if member.sync is not None and not member.sync.done():
                    member.sync.set_result((errors.NOT_COORDINATOR, b""))
