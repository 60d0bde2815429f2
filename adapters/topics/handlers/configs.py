"""walkit.adapters.topics.handlers.configs answers AlterConfigs and IncrementalAlterConfigs for topics.

A topic's configs are part of its record in the metadata store (catalog.py). A change is
validated as at creation (catalog.check_configs: known names, integer ranges, max.message.bytes
at most what a log entry holds) against the record it replaces, and stored by compare-and-set
(Catalog.update_topic), so two brokers changing one topic at once cannot lose a change. Every
broker's ownership thread reads the new record when the metadata watch fires (within about
ownership.REFRESH_S): retention (`retention.ms`, `retention.bytes`) and `max.message.bytes`
follow at once. `segment.bytes` and `segment.ms` are stored too, but a partition's ledgers
roll by the values its node was opened with, until the broker opens it again (a restart, or
taking over a partition it had not run).

AlterConfigs replaces the topic's whole set (configs left out return to their defaults, as in
Kafka); IncrementalAlterConfigs SETs, DELETEs (back to the default), APPENDs to or SUBTRACTs
from the list config `cleanup.policy`. With ValidateOnly nothing is stored. Broker configs
cannot change at runtime (they are `walkit topics serve` options): INVALID_REQUEST.
"""

from __future__ import annotations

from dataclasses import replace

from kafka.protocol.admin import (
    AlterConfigsRequest, AlterConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
)

from walkit.adapters.topics import errors
from walkit.adapters.topics.catalog import check_configs
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.handlers.admin import BROKER_RESOURCE, TOPIC_RESOURCE
from walkit.errors import WalkitError

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
#: Topic configs whose value is a comma-separated list (APPEND and SUBTRACT apply to these only).
LIST_CONFIGS = {"cleanup.policy"}


def incremental(configs: dict[str, str], defaults: dict[str, str], operations) -> dict[str, str]:
    """incremental applies IncrementalAlterConfigs `operations` (name, op, value) to a topic's `configs`."""
    changed = dict(configs)
    for name, op, value in operations:
        if op == SET:
            changed[name] = value
        elif op == DELETE:
            changed.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            if name not in LIST_CONFIGS:
                raise KafkaError(errors.INVALID_CONFIG, f"{name} is not a list config: APPEND and SUBTRACT do not "
                                                        f"apply to it")
            items = [v for v in changed.get(name, defaults.get(name, "")).split(",") if v]
            given = [v for v in (value or "").split(",") if v]
            if op == APPEND:
                items += [v for v in given if v not in items]
            else:
                items = [v for v in items if v not in given]
            changed[name] = ",".join(items)
        else:
            raise KafkaError(errors.INVALID_REQUEST, f"config operation {op} of {name}")
    return changed


async def _alter(broker, resource_type: int, name: str, compute, validate_only: bool) -> tuple[int, str | None]:
    """_alter changes one resource's configs to `compute(current configs)`; it returns (error code, message)."""
    if resource_type == BROKER_RESOURCE:
        return errors.INVALID_REQUEST, "broker configs cannot change at runtime (they are walkit topics serve options)"
    if resource_type != TOPIC_RESOURCE:
        return errors.INVALID_REQUEST, f"resource type {resource_type} is not supported"

    def change(topic):
        return replace(topic, configs=check_configs(compute(topic.configs), broker.largest_message))
    try:
        if validate_only:
            topic = await broker.loop.run_in_executor(None, broker.catalog.topic, name)
            if topic is None:
                raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
            change(topic)
        else:
            await broker.loop.run_in_executor(None, broker.catalog.update_topic, name, change)
            broker.ownership.wake()
    except KafkaError as exc:
        return exc.code, str(exc)
    except WalkitError as exc:
        return errors.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"
    return errors.NONE, None


async def alter_configs(broker, connection, request):
    """alter_configs replaces topics' configs (those not named return to their defaults)."""
    body = request.body
    results = []
    for resource in body.resources or []:
        wanted = {c.name: c.value for c in resource.configs or []}
        code, message = await _alter(broker, resource.resource_type, resource.resource_name,
                                     lambda _current, wanted=wanted: wanted, body.validate_only)
        results.append(AlterConfigsResponse.AlterConfigsResourceResponse(
            error_code=code, error_message=message, resource_type=resource.resource_type,
            resource_name=resource.resource_name))
    return request.response(AlterConfigsResponse, throttle_time_ms=0, responses=results)


async def incremental_alter_configs(broker, connection, request):
    """incremental_alter_configs sets, deletes, appends to or subtracts from topics' configs."""
    body = request.body
    results = []
    for resource in body.resources or []:
        operations = [(c.name, c.config_operation, c.value) for c in resource.configs or []]
        code, message = await _alter(
            broker, resource.resource_type, resource.resource_name,
            lambda current, operations=operations: incremental(current, broker.defaults, operations),
            body.validate_only)
        results.append(IncrementalAlterConfigsResponse.AlterConfigsResourceResponse(
            error_code=code, error_message=message, resource_type=resource.resource_type,
            resource_name=resource.resource_name))
    return request.response(IncrementalAlterConfigsResponse, throttle_time_ms=0, responses=results)


HANDLERS = {
    AlterConfigsRequest.API_KEY: alter_configs,
    IncrementalAlterConfigsRequest.API_KEY: incremental_alter_configs,
}
