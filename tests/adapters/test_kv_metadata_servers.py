"""The store on ZooKeeper and etcd metadata: a leader whose session is lost steps down, another leads."""

from __future__ import annotations

import pytest

from walkit.testing.memory import MemoryCluster

from ..conftest import ETCD_LEASE_S, ZK_SESSION_S, fresh_root
from ..integration.helpers import wait_until
from ..metadata.expiry import expire_session
from .conftest import KVNode

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["zk", "etcd"])
def test_a_leader_whose_session_is_lost_steps_down_and_every_acked_write_survives(backend, request):
    server = request.getfixturevalue(f"{backend}_server")
    url = server.url(fresh_root(), session_timeout=ZK_SESSION_S, timeout=10) if backend == "zk" else \
        server.url(fresh_root(), lease_ttl=ETCD_LEASE_S, timeout=10)
    with MemoryCluster(url, bookies=3, add_timeout=2.0, request_timeout=2.0) as cluster:
        nodes = [KVNode(cluster)]
        try:
            wait_until(lambda: nodes[0].is_leader, 20)
            nodes.append(KVNode(cluster))
            first_epoch = nodes[0].node.election.epoch
            r = nodes[0].redis()
            for i in range(100):
                assert r.set(f"k{i}", i)
            wait_until(lambda: nodes[1].machine.index == 100, 20)
            expire_session(nodes[0].client.store)         # as a network partition would

            def one_new_leader():
                leaders = [n for n in nodes if n.is_leader]
                return len(leaders) == 1 and leaders[0].node.election.epoch > first_epoch and leaders[0]
            leader = wait_until(one_new_leader, 30, message="a new leadership after the session loss")
            follower = next(n for n in nodes if n is not leader)
            assert leader.redis().set("after", "yes")
            wait_until(lambda: follower.node.leader == leader.address and follower.machine.index == 101, 20)
            for node in nodes:
                assert node.redis().mget([f"k{i}" for i in range(100)]) == [b"%d" % i for i in range(100)]
                assert node.redis().get("after") == b"yes"
        finally:
            for node in reversed(nodes):
                node.stop()
