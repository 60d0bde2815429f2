"""walkit.adapters.topics.handlers.groups answers the consumer group APIs: Join, Sync, Heartbeat, Leave, List, Describe.

A group is served by the broker that leads its bucket (Broker.bucket_of); any other
broker answers NOT_COORDINATOR, and clients ask FindCoordinator again. The membership rules
are in coordinator.py; the handlers translate requests and answers.
"""

from __future__ import annotations

from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    SyncGroupRequest, SyncGroupResponse,
)

from walkit.adapters.topics import errors
from walkit.adapters.topics.coordinator import EMPTY
from walkit.adapters.topics.errors import KafkaError

_MEMBER = JoinGroupResponse.JoinGroupResponseMember
#: Longest a rebalance waits for members to rejoin (Kafka's max.poll.interval.ms default is 300 s).
MAX_REBALANCE_MS = 300_000
_DGROUP = DescribeGroupsResponse.DescribedGroup
_DMEMBER = _DGROUP.DescribedGroupMember


def _coordinated(broker, group: str) -> int:
    """_coordinated returns NONE if this broker coordinates `group`, else its error code."""
    try:
        broker.bucket_for(group)
    except KafkaError as exc:
        return exc.code
    return errors.NONE


async def join_group(broker, connection, request):
    """join_group adds or refreshes a member and answers once the group's rebalance completes."""
    body, version = request.body, request.version
    code = _coordinated(broker, body.group_id)
    if code != errors.NONE:
        return request.response(JoinGroupResponse, throttle_time_ms=0, error_code=code, generation_id=-1,
                                protocol_name=None, leader="", member_id=body.member_id, members=[])
    rebalance_ms = min(body.rebalance_timeout_ms if version >= 1 else body.session_timeout_ms, MAX_REBALANCE_MS)
    instance = body.group_instance_id if version >= 5 else None
    result = await broker.coordinator.join(
        body.group_id, body.member_id, instance, request.client_id or "", connection.host, body.session_timeout_ms,
        rebalance_ms, body.protocol_type, [(p.name, bytes(p.metadata or b"")) for p in body.protocols or []])
    return request.response(
        JoinGroupResponse, throttle_time_ms=0, error_code=result.error, generation_id=result.generation,
        protocol_type=result.protocol_type, protocol_name=result.protocol, leader=result.leader,
        skip_assignment=False, member_id=result.member_id or body.member_id,
        members=[_MEMBER(member_id=m, group_instance_id=i, metadata=d) for m, i, d in result.members])


async def sync_group(broker, connection, request):
    """sync_group takes the leader's assignment and answers each member with its share."""
    body = request.body
    code = _coordinated(broker, body.group_id)
    assignment = b""
    group = broker.coordinator.groups.get(body.group_id)
    if code == errors.NONE:
        code, assignment = await broker.coordinator.sync(
            body.group_id, body.generation_id, body.member_id,
            [(a.member_id, bytes(a.assignment or b"")) for a in body.assignments or []])
    return request.response(SyncGroupResponse, throttle_time_ms=0, error_code=code,
                            protocol_type=group.protocol_type if group else None,
                            protocol_name=group.protocol if group else None, assignment=assignment)


async def heartbeat(broker, connection, request):
    """heartbeat keeps a member alive and tells it when the group rebalances."""
    body = request.body
    code = _coordinated(broker, body.group_id)
    if code == errors.NONE:
        code = broker.coordinator.heartbeat(body.group_id, body.generation_id, body.member_id)
    return request.response(HeartbeatResponse, throttle_time_ms=0, error_code=code)


async def leave_group(broker, connection, request):
    """leave_group removes members (one before v3, a list from v3) and rebalances the group."""
    body, version = request.body, request.version
    leaving = [(body.member_id, None)] if version < 3 else [(m.member_id, m.group_instance_id) for m in body.members or []]
    code = _coordinated(broker, body.group_id)
    codes = broker.coordinator.leave(body.group_id, leaving) if code == errors.NONE else [code] * len(leaving)
    if version < 3:
        return request.response(LeaveGroupResponse, throttle_time_ms=0, error_code=codes[0])
    members = [LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=c)
               for (m, i), c in zip(leaving, codes)]
    return request.response(LeaveGroupResponse, throttle_time_ms=0, error_code=code, members=members)


def known_groups(broker) -> dict[str, str]:
    """known_groups maps each group this broker coordinates (members or committed offsets) to its state."""
    found = {}
    led = {b for b, bucket in broker.buckets.items() if bucket.active}
    for bucket in led:
        for group in broker.buckets[bucket].state.group_ids():
            found[group] = EMPTY
    for group in broker.coordinator.groups.values():
        if group.bucket in led:
            found[group.id] = group.state
    return found


async def list_groups(broker, connection, request):
    """list_groups lists the groups this broker coordinates (clients ask every broker)."""
    states = set(request.body.states_filter or []) if request.version >= 4 else set()
    listed = []
    for group_id, state in sorted(known_groups(broker).items()):
        if states and state not in states:
            continue
        group = broker.coordinator.groups.get(group_id)
        listed.append(ListGroupsResponse.ListedGroup(
            group_id=group_id, protocol_type=(group.protocol_type if group else None) or "consumer",
            group_state=state))
    return request.response(ListGroupsResponse, throttle_time_ms=0, error_code=errors.NONE, groups=listed)


async def describe_groups(broker, connection, request):
    """describe_groups describes the state, protocol and members of groups this broker coordinates."""
    described = []
    known = known_groups(broker)
    for group_id in request.body.groups or []:
        code = _coordinated(broker, group_id)
        group = broker.coordinator.groups.get(group_id)
        state = known.get(group_id, "Dead") if code == errors.NONE else ""
        members = []
        if group is not None and code == errors.NONE:
            members = [_DMEMBER(member_id=m.id, group_instance_id=m.instance_id, client_id=m.client_id,
                                client_host=m.client_host, member_metadata=m.metadata(group.protocol or ""),
                                member_assignment=m.assignment) for m in group.members.values()]
        described.append(_DGROUP(
            error_code=code, error_message=None, group_id=group_id, group_state=state,
            protocol_type=(group.protocol_type if group else "") or "",
            protocol_data=(group.protocol if group else "") or "", members=members,
            authorized_operations=None))
    return request.response(DescribeGroupsResponse, throttle_time_ms=0, groups=described)


HANDLERS = {
    JoinGroupRequest.API_KEY: join_group,
    SyncGroupRequest.API_KEY: sync_group,
    HeartbeatRequest.API_KEY: heartbeat,
    LeaveGroupRequest.API_KEY: leave_group,
    ListGroupsRequest.API_KEY: list_groups,
    DescribeGroupsRequest.API_KEY: describe_groups,
}
