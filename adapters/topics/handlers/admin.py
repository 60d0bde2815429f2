"""walkit.adapters.topics.handlers.admin answers CreateTopics, CreatePartitions, DeleteTopics and DescribeConfigs.

Topics live in the metadata store (catalog.py), so any broker can create or delete one.
CreateTopics waits (up to the request's timeout, at most CREATE_WAIT_S) until every new
partition has a leader, so a producer that starts right after finds them. The replication
factor is accepted and not used: a partition's data is replicated by its ledgers' quorums.
DeleteTopics removes the topic's record, waits (at most DELETE_WAIT_S) until the partitions'
leaders noticed and stepped down, then deletes the partitions' logs and snapshots. A topic
created again under the same name gets a new id, and with it new replicated machines
(catalog.partition_name), whatever the old topic left behind.

CreatePartitions raises a topic's partition count by compare-and-set of its record (only
upwards, at most catalog.MAX_PARTITIONS; manual assignments are refused), then waits like
CreateTopics for the new partitions' leaders. Keys already produced keep their partition only
while the count stays the same, as in Kafka. DescribeConfigs reads the topic's record from the
metadata store, so a change made through any broker (handlers/configs.py) shows at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from kafka.protocol.admin import (
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
)

from walkit.adapters.topics import errors
from walkit.adapters.topics.catalog import (
    DEFAULT_CONFIGS, MAX_PARTITIONS, check_configs, check_topic_name, partition_log, partition_name,
)
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.ownership import Slot, election_key
from walkit.errors import BadVersion, MetadataError, NoSuchKey, NoSuchLedger, NoSuchLog, WalkitError
from walkit.replication.snapshots import pointer_key, read_pointer

CREATE_WAIT_S = 10.0
DELETE_WAIT_S = 15.0
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
_INT_TYPES = {"retention.ms": 5, "retention.bytes": 5, "segment.ms": 5, "segment.bytes": 3, "max.message.bytes": 3}
_RESULT = CreateTopicsResponse.CreatableTopicResult
_RCONFIG = _RESULT.CreatableTopicConfigs
_DRESULT = DescribeConfigsResponse.DescribeConfigsResult
_DCONFIG = _DRESULT.DescribeConfigsResourceResult


async def _wait_for_leaders(broker, name: str, partitions: int, timeout: float) -> None:
    loop = broker.loop
    deadline = loop.time() + timeout
    broker.ownership.wake()
    while loop.time() < deadline:
        if all(broker.leader_of(Slot(name, p)) >= 0 for p in range(partitions)):
            return
        await asyncio.sleep(0.05)


async def create_topics(broker, connection, request):
    """create_topics creates topics (or only validates them, with validateOnly)."""
    body, version = request.body, request.version
    results, created = [], []
    for topic in body.topics or []:
        partitions = broker.settings.default_partitions if topic.num_partitions == -1 else topic.num_partitions
        configs = {c.name: c.value for c in topic.configs or []}
        code, message = errors.NONE, None
        try:
            if topic.assignments:
                raise KafkaError(errors.INVALID_REQUEST, "manual replica assignments are not supported")
            if topic.replication_factor == 0 or topic.replication_factor < -1:
                raise KafkaError(errors.INVALID_REPLICATION_FACTOR, f"replication factor {topic.replication_factor}")
            if not 1 <= partitions <= 10_000:
                raise KafkaError(errors.INVALID_PARTITIONS, f"{partitions} partitions (use 1 to 10000, or -1)")
            if body.validate_only:
                check_topic_name(topic.name)
                check_configs(configs, broker.largest_message)
                if broker.view.topics.get(topic.name) is not None:
                    raise KafkaError(errors.TOPIC_ALREADY_EXISTS, f"topic {topic.name!r} already exists")
            else:
                await broker.loop.run_in_executor(None, broker.catalog.create_topic, topic.name, partitions, configs,
                                                  broker.largest_message)
                created.append((topic.name, partitions))
        except KafkaError as exc:
            code, message = exc.code, str(exc)
        shown = [] if code != errors.NONE else [
            _RCONFIG(name=key, value=configs.get(key, default), read_only=False,
                     config_source=DYNAMIC_TOPIC_CONFIG if key in configs else DEFAULT_CONFIG, is_sensitive=False)
            for key, default in sorted(broker.defaults.items())]
        results.append(_RESULT(name=topic.name, error_code=code, error_message=message,
                               num_partitions=partitions if code == errors.NONE else -1,
                               replication_factor=max(topic.replication_factor, 1) if code == errors.NONE else -1,
                               configs=shown))
    wait = min(max(body.timeout_ms, 0) / 1000, CREATE_WAIT_S)
    for name, partitions in created:
        await _wait_for_leaders(broker, name, partitions, wait)
    return request.response(CreateTopicsResponse, throttle_time_ms=0, topics=results)


def _more_partitions(count: int):
    """_more_partitions is Catalog.update_topic's change to `count` partitions (INVALID_PARTITIONS unless more)."""
    def change(topic):
        if count <= topic.partitions:
            raise KafkaError(errors.INVALID_PARTITIONS, f"topic {topic.name!r} has {topic.partitions} partitions; "
                                                        f"the count can only grow, not to {count}")
        if count > MAX_PARTITIONS:
            raise KafkaError(errors.INVALID_PARTITIONS, f"{count} partitions (at most {MAX_PARTITIONS})")
        return replace(topic, partitions=count)
    return change


async def create_partitions(broker, connection, request):
    """create_partitions adds partitions to existing topics (or only validates, with validateOnly)."""
    body = request.body
    results, grown = [], []
    for topic in body.topics or []:
        code, message = errors.NONE, None
        try:
            if topic.assignments:
                raise KafkaError(errors.INVALID_REQUEST, "manual replica assignments are not supported")
            change = _more_partitions(topic.count)
            if body.validate_only:
                known = await broker.loop.run_in_executor(None, broker.catalog.topic, topic.name)
                if known is None:
                    raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic.name!r}")
                change(known)
            else:
                await broker.loop.run_in_executor(None, broker.catalog.update_topic, topic.name, change)
                grown.append((topic.name, topic.count))
        except KafkaError as exc:
            code, message = exc.code, str(exc)
        except WalkitError as exc:
            code, message = errors.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"
        results.append(CreatePartitionsResponse.CreatePartitionsTopicResult(name=topic.name, error_code=code,
                                                                            error_message=message))
    wait = min(max(body.timeout_ms, 0) / 1000, CREATE_WAIT_S)
    for name, partitions in grown:
        await _wait_for_leaders(broker, name, partitions, wait)
    return request.response(CreatePartitionsResponse, throttle_time_ms=0, results=results)


def _delete_partitions(client, topic) -> None:
    """_delete_partitions deletes a deleted topic's logs and snapshots (walkit.replicate's pointer and ledger).

    It retries a log while a stepping-down leader still updates its metadata.
    """
    store = client.store
    for partition in range(topic.partitions):
        name = partition_name(topic, partition)
        for _ in range(50):
            try:
                client.delete_log(partition_log(topic, partition))
            except NoSuchLog:
                pass
            except BadVersion:
                time.sleep(0.1)
                continue
            break
        pointer, version = read_pointer(store, name)
        if pointer is not None:
            _quietly(lambda: store.delete(pointer_key(name), version))
            _quietly(lambda: client.delete_ledger(pointer.ledger_id))


def _quietly(action) -> None:
    """_quietly runs a clean-up step that another broker may have done already."""
    try:
        action()
    except (NoSuchKey, NoSuchLedger, BadVersion, MetadataError):
        pass


def _wait_for_no_leaders(store, topic, timeout: float) -> None:
    """_wait_for_no_leaders waits until no broker holds the election of a deleted topic's partitions.

    Until then a leader may still append to a log about to be deleted. (A topic created again
    has new logs and elections, so it never meets the old topic's nodes.)
    """
    deadline = time.monotonic() + timeout
    for partition in range(topic.partitions):
        key = election_key(partition_name(topic, partition))
        while time.monotonic() < deadline:
            try:
                store.get(key)
            except NoSuchKey:
                break
            time.sleep(0.05)


async def delete_topics(broker, connection, request):
    """delete_topics deletes topics and their partitions' logs, once their leaders stepped down."""
    results = []
    for name in request.body.topic_names or []:
        code, message = errors.NONE, None
        try:
            topic = await broker.loop.run_in_executor(None, broker.catalog.delete_topic, name)
            broker.ownership.wake()
            await broker.loop.run_in_executor(None, _wait_for_no_leaders, broker.client.store, topic, DELETE_WAIT_S)
            await broker.loop.run_in_executor(None, _delete_partitions, broker.client, topic)
        except KafkaError as exc:
            code, message = exc.code, str(exc)
        except WalkitError as exc:
            code, message = errors.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"
        results.append(DeleteTopicsResponse.DeletableTopicResult(name=name, error_code=code, error_message=message))
    broker.ownership.wake()
    return request.response(DeleteTopicsResponse, throttle_time_ms=0, responses=results)


async def describe_configs(broker, connection, request):
    """describe_configs returns topic configs (set and default); brokers have none to show."""
    results = []
    for resource in request.body.resources or []:
        code, message, configs = errors.NONE, None, []
        if resource.resource_type == TOPIC_RESOURCE:
            topic = await broker.loop.run_in_executor(None, broker.catalog.topic, resource.resource_name)
            if topic is None:
                code, message = errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {resource.resource_name!r}"
            else:
                keys = resource.configuration_keys or sorted(DEFAULT_CONFIGS)
                for key in keys:
                    if key not in DEFAULT_CONFIGS:
                        continue
                    explicit = key in topic.configs
                    configs.append(_DCONFIG(
                        name=key, value=topic.configs.get(key, broker.defaults[key]), read_only=False,
                        is_default=not explicit,
                        config_source=DYNAMIC_TOPIC_CONFIG if explicit else DEFAULT_CONFIG, is_sensitive=False,
                        synonyms=[], config_type=_INT_TYPES.get(key, 2), documentation=None))
        elif resource.resource_type != BROKER_RESOURCE:
            code, message = errors.INVALID_REQUEST, f"resource type {resource.resource_type} is not supported"
        results.append(_DRESULT(error_code=code, error_message=message, resource_type=resource.resource_type,
                                resource_name=resource.resource_name, configs=configs))
    return request.response(DescribeConfigsResponse, throttle_time_ms=0, results=results)


HANDLERS = {
    CreateTopicsRequest.API_KEY: create_topics,
    CreatePartitionsRequest.API_KEY: create_partitions,
    DeleteTopicsRequest.API_KEY: delete_topics,
    DescribeConfigsRequest.API_KEY: describe_configs,
}
