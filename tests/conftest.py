"""Shared fixtures: in-process clusters (fast), LocalClusters of real bookie processes, and real
ZooKeeper and etcd servers (started once per session on 127.0.0.1; a missing binary fails the
test with a message saying to run scripts/test.sh, which installs them)."""

from __future__ import annotations

import gc
import itertools
import subprocess
import uuid

import pytest

from walkit.local import LocalCluster
from walkit.testing.memory import MemoryCluster
from walkit.testing.servers import EtcdServer, ZooKeeperServer, etcd_missing, zookeeper_missing

#: Session and lease lengths for clusters on ZooKeeper and etcd: short, so that a killed
#: bookie's registration expires quickly, yet long enough for a loaded 2-core machine.
ZK_SESSION_S = 4.0
ETCD_LEASE_S = 3


def pytest_addoption(parser) -> None:
    parser.addoption("--seed", type=int, default=None, help="simulate only this seed (tests/sim)")
    parser.addoption("--seeds", type=int, default=1000,
                     help="number of random seeds to simulate per scenario (default 1000)")
    parser.addoption("--sim-draw", choices=("hard", "any"), default="hard",
                     help="how the simulator draws a seed's configuration: hard (default, CI) from the hostile "
                          "end of every range, any from the whole range (the long runs)")
    parser.addoption("--replica-seeds", type=int, default=500,
                     help="number of random seeds of walkit.replicate nodes under faults (default 500)")
    parser.addoption("--nemesis-seeds", type=int, default=1,
                     help="seeds of each nemesis test across network namespaces (tests/network; default 1)")
    parser.addoption("--nemesis-seed", type=int, default=None, help="replay only this nemesis seed (tests/network)")
    parser.addoption("--nemesis-seconds", type=float, default=30.0,
                     help="seconds of faults per nemesis run (tests/network; default 30)")
    parser.addoption("--unbounded-seeds", type=int, default=1000,
                     help="number of random seeds of writers battling for an unbounded ledger (default 1000)")


#: Tests of one file run on one xdist worker (their module fixtures start once); files of more
#: tests than this (the simulator's seeds) are cut into groups of this many, spread over workers.
GROUP_SIZE = 1000


#: Test tiers, by what a test needs. The markers are set here, from where a test lives and which
#: fixtures it uses, so a test file cannot forget them; `fast` is every test that needs none.
TIER_BY_DIRECTORY = {"tests/sim/": "sim", "tests/spark/": "spark", "tests/network/": "network"}
SERVER_FIXTURES = {"zk_server", "etcd_server", "etcd_cluster", "zk_factory", "etcd_factory"}
PROCESS_FIXTURES = {"local_cluster", "redis_pair"}
#: Tests of the public conformance suites (walkit.testing) that start a process, by name: the suites
#: carry no tier markers of their own, since third-party plugins run them with their own settings.
PROCESS_TESTS = {"test_the_registration_of_a_killed_process_expires"}
TIERS = ("servers", "processes", "spark", "sim", "network")


def tiers_of(item) -> set[str]:
    """tiers_of names what `item` needs: real metadata servers, processes, Spark, the simulator, namespaces."""
    path = item.nodeid.split("::", 1)[0]
    found = {marker for prefix, marker in TIER_BY_DIRECTORY.items() if path.startswith(prefix)}
    fixtures = set(item.fixturenames)
    params = getattr(getattr(item, "callspec", None), "params", {})
    if fixtures & SERVER_FIXTURES or any(value in ("zk", "etcd") for value in params.values()):
        found.add("servers")                # (a backend parameter picks its server with getfixturevalue)
    if (fixtures & PROCESS_FIXTURES or item.get_closest_marker("slow") or item.get_closest_marker("processes")
            or getattr(item, "originalname", item.name) in PROCESS_TESTS):
        found.add("processes")
    return found | {m for m in TIERS if item.get_closest_marker(m)}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Marks each test with its tiers (`fast` when it needs nothing: the guard below holds it to that).

    Under `-n N --dist loadgroup` (scripts/test.sh), each test file is one group: tests that share a
    module's cluster run on the same worker, and the simulator's long seed lists are cut in chunks."""
    for item in items:
        needs = tiers_of(item)
        for marker in sorted(needs):
            item.add_marker(marker)
        if not needs:
            item.add_marker("fast")
    if config.getoption("dist", "no") != "loadgroup":
        return
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    for path, tests in by_file.items():
        for index, item in enumerate(tests):
            chunk = f"#{index // GROUP_SIZE}" if len(tests) > GROUP_SIZE else ""
            if path.startswith("tests/spark/"):
                chunk, path = "", "tests/spark"     # one SparkSession and broker for every Spark test
            if item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(path + chunk))
    # With --no-loadscope-reorder (scripts/test.sh) xdist hands groups out in this order. Long
    # indivisible groups (the network tier's nemesis runs, Spark, real processes) go to the
    # workers first, the simulator's many short seed groups and the fast tier last, so both
    # workers finish together instead of one waiting for the other's last long group. Network
    # files alternate with the others (two ten-host nemesis runs at once would starve both), and
    # a file's tests stay together (its module fixtures start once).
    def group(item) -> str:
        return item.get_closest_marker("xdist_group").args[0]
    rank_of_group: dict[str, int] = {}
    for item in items:
        rank_of_group[group(item)] = min(rank_of_group.get(group(item), START_LAST), _start_rank(item))
    network = [name for name, rank in rank_of_group.items() if rank == 0]
    others = sorted((name for name, rank in rank_of_group.items() if rank > 0), key=rank_of_group.get)
    order = [name for pair in itertools.zip_longest(network, others) for name in pair if name is not None]
    position = {name: i for i, name in enumerate(order)}
    items.sort(key=lambda item: position[group(item)])


#: The order in which the tiers' groups start on the xdist workers (the rest after them).
START_ORDER = ("network", "spark", "processes", "servers", "sim")
START_LAST = len(START_ORDER)


def _start_rank(item) -> int:
    for rank, marker in enumerate(START_ORDER):
        if item.get_closest_marker(marker) is not None:
            return rank
    return START_LAST


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request, monkeypatch):
    """A test of the fast tier starts no process: one that does fails here, naming what it started, and
    belongs in the `processes` tier (mark it slow, or use a fixture that says so)."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return

    def refuse(self, args, *rest, **options):
        raise AssertionError(f"{request.node.nodeid} is in the fast tier but starts a process: {args!r}; "
                             f"mark it @pytest.mark.slow (tier 'processes')")
    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    yield


@pytest.fixture(autouse=True)
def _collector_thresholds():
    """Tests that run a walkit command in process (click's CliRunner) raise the collector's
    threshold (walkit.collector.tune_gc); the next test starts with this process's own again."""
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)


def fresh_root() -> str:
    """fresh_root is a metadata root path no other test uses."""
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def zk_server():
    """zk_server is a ZooKeeper server shared by the test session."""
    missing = zookeeper_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture(scope="session")
def etcd_server():
    """etcd_server is an etcd server shared by the test session."""
    missing = etcd_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with EtcdServer() as server:
        yield server


BACKENDS = ["sqlite", "zk", "etcd"]


def fresh_metadata_url(request, backend: str, directory) -> str:
    """fresh_metadata_url is a fresh metadata store on `backend` (an SQLite file in `directory`, or a
    fresh root on the session's real ZooKeeper or etcd server)."""
    if backend == "sqlite":
        return f"sqlite://{directory}/metadata.db"
    if backend == "zk":
        return request.getfixturevalue("zk_server").url(fresh_root(), session_timeout=ZK_SESSION_S, timeout=10)
    return request.getfixturevalue("etcd_server").url(fresh_root(), lease_ttl=ETCD_LEASE_S, timeout=10)


@pytest.fixture(params=BACKENDS)
def backend_metadata_url(request, tmp_path) -> str:
    """backend_metadata_url is a fresh metadata store on each backend in turn (real servers)."""
    return fresh_metadata_url(request, request.param, tmp_path)


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
