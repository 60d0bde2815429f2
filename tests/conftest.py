"""Shared fixtures: an in-process cluster (fast) and a LocalCluster of real bookie processes (slow)."""

from __future__ import annotations

import pytest

from walkit.local import LocalCluster
from walkit.testing.memory import MemoryCluster


@pytest.fixture
def metadata_url(tmp_path) -> str:
    """metadata_url is a fresh SQLite metadata store in the test's temp dir."""
    return f"sqlite://{tmp_path}/metadata.db"


@pytest.fixture
def memory_cluster(metadata_url):
    """memory_cluster is 3 in-process bookies over the in-memory transport."""
    with MemoryCluster(metadata_url, bookies=3, add_timeout=2.0, request_timeout=2.0) as cluster:
        yield cluster


@pytest.fixture
def local_cluster(tmp_path):
    """local_cluster is 3 real bookie processes (memory storage) with SQLite metadata."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory",
                      bookie_args=("--gc-interval", "0.2")) as cluster:
        yield cluster
