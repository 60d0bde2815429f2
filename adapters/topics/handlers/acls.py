"""walkit.adapters.topics.handlers.acls answers CreateAcls, DescribeAcls and DeleteAcls.

The bindings are kept in the metadata store and never enforced (acls.py says why and what
that means). A binding Kafka would refuse (an UNKNOWN or ANY type, a principal not of the
form TYPE:NAME) is answered INVALID_REQUEST on its own; the others of the request are stored.
"""

from __future__ import annotations

from kafka.protocol.admin import (
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse,
)

from walkit.adapters.topics import errors
from walkit.adapters.topics.acls import LITERAL, AclBinding, AclFilter, AclStore
from walkit.adapters.topics.errors import KafkaError
from walkit.errors import WalkitError

_DRESOURCE = DescribeAclsResponse.DescribeAclsResource
_DACL = _DRESOURCE.AclDescription
_FRESULT = DeleteAclsResponse.DeleteAclsFilterResult
_MATCHING = _FRESULT.DeleteAclsMatchingAcl


def _filter(source, version: int) -> AclFilter:
    """_filter reads a DescribeAcls request or a DeleteAcls filter (before v1 the pattern type is LITERAL)."""
    return AclFilter(source.resource_type_filter, source.resource_name_filter,
                     source.pattern_type_filter if version >= 1 else LITERAL, source.principal_filter,
                     source.host_filter, source.operation, source.permission_type).check()


async def create_acls(broker, connection, request):
    """create_acls stores ACL bindings."""
    version = request.version
    checked, results = [], []
    for creation in request.body.creations or []:
        try:
            checked.append(AclBinding(creation.resource_type, creation.resource_name,
                                      creation.resource_pattern_type if version >= 1 else LITERAL,
                                      creation.principal, creation.host, creation.operation,
                                      creation.permission_type).check())
            results.append([errors.NONE, None])
        except KafkaError as exc:
            results.append([exc.code, str(exc)])
    if checked:
        try:
            await broker.loop.run_in_executor(None, AclStore(broker.client.store).create, checked)
        except (KafkaError, WalkitError) as exc:
            code = exc.code if isinstance(exc, KafkaError) else errors.UNKNOWN_SERVER_ERROR
            results = [[code, str(exc)] if r[0] == errors.NONE else r for r in results]
    return request.response(CreateAclsResponse, throttle_time_ms=0, results=[
        CreateAclsResponse.AclCreationResult(error_code=code, error_message=message) for code, message in results])


async def describe_acls(broker, connection, request):
    """describe_acls lists the bindings a filter selects, grouped by resource pattern."""
    try:
        wanted = _filter(request.body, request.version)
        found = await broker.loop.run_in_executor(None, AclStore(broker.client.store).describe, wanted)
        code, message = errors.NONE, None
    except KafkaError as exc:
        found, code, message = [], exc.code, str(exc)
    grouped: dict[tuple[int, str, int], list] = {}
    for b in found:
        grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
            _DACL(principal=b.principal, host=b.host, operation=b.operation, permission_type=b.permission))
    return request.response(DescribeAclsResponse, throttle_time_ms=0, error_code=code, error_message=message,
                            resources=[_DRESOURCE(resource_type=t, resource_name=n, pattern_type=p, acls=acls)
                                       for (t, n, p), acls in grouped.items()])


async def delete_acls(broker, connection, request):
    """delete_acls removes the bindings each filter selects and names them."""
    version = request.version
    filters, codes = [], []
    for source in request.body.filters or []:
        try:
            filters.append(_filter(source, version))
            codes.append((errors.NONE, None))
        except KafkaError as exc:
            filters.append(None)
            codes.append((exc.code, str(exc)))
    valid = [f for f in filters if f is not None]
    try:
        deleted = await broker.loop.run_in_executor(None, AclStore(broker.client.store).delete, valid) if valid else []
    except KafkaError as exc:
        deleted, codes = [[] for _ in valid], [(exc.code, str(exc)) if c == errors.NONE else (c, m) for c, m in codes]
    matched = iter(deleted)
    results = []
    for wanted, (code, message) in zip(filters, codes):
        bindings = next(matched) if wanted is not None else []
        results.append(_FRESULT(error_code=code, error_message=message, matching_acls=[
            _MATCHING(error_code=errors.NONE, error_message=None, resource_type=b.resource_type,
                      resource_name=b.resource_name, pattern_type=b.pattern_type, principal=b.principal, host=b.host,
                      operation=b.operation, permission_type=b.permission) for b in bindings]))
    return request.response(DeleteAclsResponse, throttle_time_ms=0, filter_results=results)


HANDLERS = {
    CreateAclsRequest.API_KEY: create_acls,
    DescribeAclsRequest.API_KEY: describe_acls,
    DeleteAclsRequest.API_KEY: delete_acls,
}
