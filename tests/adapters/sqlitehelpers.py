"""Helpers of the SQLite replicator's tests: nodes of one database on an in-process cluster."""

from __future__ import annotations

import itertools
import time

import pytest

import walkit.adapters.sqlite as sq
from walkit.testing.memory import MemoryCluster
from walkit.testing.processes import wait_until

_names = itertools.count()


def unique(prefix: str = "db") -> str:
    """unique is a database name no other test of this process uses."""
    return f"{prefix}{next(_names)}"


class Nodes:
    """Nodes opens connections (each its own node, file and Client) to databases on one MemoryCluster."""

    def __init__(self, cluster: MemoryCluster, directory) -> None:
        self.cluster = cluster
        self.directory = directory
        self.opened: list[sq.Connection] = []

    def connect(self, name: str, node_id: str, **options) -> sq.Connection:
        """connect opens node `node_id` of database `name` with its own file."""
        options.setdefault("check_same_thread", False)
        conn = sq.connect(str(self.directory / f"{name}-{node_id}.db"), name=name, node_id=node_id,
                          client=self.cluster.client(own_store=True), **options)
        self.opened.append(conn)
        return conn

    def close(self) -> None:
        """close closes every connection opened here."""
        for conn in reversed(self.opened):
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a test may have closed it
                pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """cluster is a memory_cluster for the tests of one module (import it into the module with `nodes`)."""
    with memory_cluster(tmp_path_factory.mktemp("sqlite")) as made:
        yield made


@pytest.fixture
def nodes(cluster, tmp_path):
    """nodes opens a test's nodes on the module's cluster, each its own file in the test's directory, and closes them."""
    made = Nodes(cluster, tmp_path)
    yield made
    made.close()


def memory_cluster(path) -> MemoryCluster:
    """memory_cluster is 4 in-process bookies; sessions expire after 1 s so failover is quick."""
    return MemoryCluster(f"sqlite://{path}/metadata.db?ttl=1", bookies=4, add_timeout=2.0, request_timeout=2.0)


def log_records(conn) -> list[bytes]:
    """log_records reads every record of a connection's database log, up to the last entry it applied.

    A reader stops at the bookies' last-add-confirmed, which trails the writer's last
    acknowledged entry until the next write or the explicit LAC; so it reads again until it
    reached the connection's `position` (a count taken before that would miss the last commit).
    """
    from walkit.replication import batch
    database = conn._database
    applied = conn.position

    def read() -> tuple[list[bytes]] | None:
        out, last = [], None
        try:
            for entry in database.client.read_log(f"replicated-{database.name}"):
                out.extend(batch.decode(entry.payload))
                last = entry.position
        except Exception as exc:  # noqa: BLE001 - no log yet
            if type(exc).__name__ != "NoSuchLog":
                raise
        if applied is not None and (last is None or last < applied):
            return None
        return (out,)               # truthy also when the log is empty

    return wait_until(read, 10, f"the log of {database.name!r} to reach {applied}")[0]
