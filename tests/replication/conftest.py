"""Fixtures for walkit.replicate: nodes of a replicated counter over in-process bookies (fast tier)."""

from __future__ import annotations

import pytest

import walkit
from walkit.testing.memory import MemoryCluster

from .machines import Counter


@pytest.fixture
def cluster(tmp_path):
    """cluster is 4 in-process bookies; sessions expire after 1 s so failover is quick."""
    with MemoryCluster(f"sqlite://{tmp_path}/metadata.db?ttl=1", bookies=4, add_timeout=2.0,
                       request_timeout=2.0) as cluster:
        yield cluster


@pytest.fixture
def nodes(cluster):
    """nodes starts counter nodes (`nodes(count, **options)`) and closes them all at the end."""
    started: list = []

    def start(count: int = 3, name: str = "counter", **options) -> list:
        made = [walkit.replicate(Counter(), client=cluster.client(own_store=True), name=name,
                                 node_id=f"node{len(started) + i}", **options) for i in range(count)]
        started.extend(made)
        return made
    yield start
    for node in started:
        node.close()
