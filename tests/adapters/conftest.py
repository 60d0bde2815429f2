"""Fixtures for the key-value adapter: in-process servers on an in-process cluster (fast tier)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from walkit.adapters.kv.machine import KVMachine
from walkit.adapters.kv.server import KVServer
from walkit.adapters.kv.service import ENTRIES_IN_FLIGHT, LINGER_MS, start_node
from walkit.testing.memory import MemoryCluster
from walkit.testing.processes import wait_until


class KVNode:
    """KVNode is one `walkit kv serve` inside the test process: its own event loop thread and client.

    Its walkit Client uses the in-memory transport of a MemoryCluster with its own metadata
    store (an election needs one per candidate). `machine`, `node` and `server` are the
    store's KVMachine, its walkit.replicate node and its RESP server.
    """

    def __init__(self, cluster: MemoryCluster, *, name: str = "test", snapshot_every: int = 100_000,
                 roll_entries: int = 10_000, **options) -> None:
        self.cluster = cluster
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kv-node-loop", daemon=True)
        self._thread.start()
        self.machine = KVMachine()
        self.server = KVServer(self.machine, self.loop, host="127.0.0.1", port=0, snapshot_every=snapshot_every)
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        self.address = f"127.0.0.1:{self.server.port}"
        self.client = self.new_client()
        options.setdefault("max_entries_in_flight", ENTRIES_IN_FLIGHT)
        options.setdefault("linger_ms", LINGER_MS)
        self.node = start_node(self.server, self.client, name=name, node_id=self.address, ensemble=3,
                               write_quorum=2, ack_quorum=2, roll_entries=roll_entries,
                               snapshot_every_records=snapshot_every, **options)
        self._stopped = False

    def new_client(self):
        """new_client is a walkit Client on the memory cluster with its own metadata store."""
        return self.cluster.client(own_store=True)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def is_leader(self) -> bool:
        return self.node.is_leader

    def redis(self, **options):
        """redis is a redis-py client of this node."""
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=20, **options)

    def stop(self) -> None:
        """stop shuts the node down cleanly (like SIGTERM)."""
        if self._stopped:
            return
        self._stopped = True
        self.server.stopping = True
        self.node.close()
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def kv_nodes(memory_cluster):
    """kv_nodes starts KVNodes on one memory cluster (`kv_nodes(**options)`) and stops them all."""
    nodes: list[KVNode] = []

    def start(**options) -> KVNode:
        node = KVNode(memory_cluster, **options)
        nodes.append(node)
        return node
    yield start
    for node in reversed(nodes):
        node.stop()


@pytest.fixture(scope="module")
def redis_pair(tmp_path_factory):
    """redis_pair is a RedisPair (tests/support/redis_compare.py): a real redis-server and a walkit
    KV node on a MemoryCluster, one of each per test module, emptied before each use (`reset`)."""
    from tests.support.redis_compare import RedisPair, RedisServer
    server = RedisServer()
    directory = tmp_path_factory.mktemp("redis-pair")
    with MemoryCluster(f"sqlite://{directory}/metadata.db", bookies=3, add_timeout=2.0,
                       request_timeout=2.0) as cluster:
        node = KVNode(cluster)
        try:
            client = node.redis()
            wait_until(lambda: _pong(client), 30, message="the walkit node never answered PONG")
            pair = RedisPair(server.port, node.port)
            yield pair
            pair.close()
        finally:
            node.stop()
            server.stop()


def serving(node: KVNode):
    """serving waits until `node` answers PONG (it leads and takes writes) and returns a redis-py client of it."""
    client = node.redis()
    wait_until(lambda: _pong(client), 30, message=f"{node.address} never answered PONG")
    return client


def _pong(client) -> bool:
    """_pong tells whether PING answers PONG (a KV server does once it leads and can take writes)."""
    import redis
    try:
        return client.ping()
    except redis.exceptions.BusyLoadingError:
        return False
