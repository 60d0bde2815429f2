"""A real Prometheus server scrapes three bookies and a `walkit kv serve` process (--http-port);
PromQL over the scraped series counts exactly the adds the test made."""

from __future__ import annotations

import pytest

from tests.support.serverprocess import KVProcess
from tests.integration.helpers import wait_until
from tests.ops.helpers import scrape
from tests.ops.prometheus_server import PrometheusServer, prometheus_missing
from walkit.client.api import Client
from walkit.local import LocalCluster, free_port

pytestmark = pytest.mark.slow

BOOKIE_ADDS = 'sum(walkit_bookie_adds_total{job="bookies"})'
KV_APPENDS = 'sum(walkit_client_appends_total{job="kv"})'


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """stack is three bookies, a KV server whose log writes every entry to all three, and Prometheus."""
    missing = prometheus_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    root = tmp_path_factory.mktemp("prometheus")
    with LocalCluster(bookies=3, data_dir=str(root / "cluster"), http=True) as cluster:
        kv_http = f"127.0.0.1:{free_port()}"
        kv = KVProcess(root, metadata=cluster.metadata_url,
                       args=("--name", "prom", "-e", "3", "-w", "3", "-a", "3", "--http-port", kv_http.split(":")[1]))
        kv.start()
        try:
            kv.wait_role(b"master")
            jobs = {"bookies": [cluster.http_address(i) for i in range(3)], "kv": [kv_http]}
            with PrometheusServer(str(root / "prometheus"), jobs) as prometheus:
                yield cluster, kv, kv_http, prometheus
        finally:
            kv.stop()


def settled(prometheus: PrometheusServer, promql: str, expected=None, timeout: float = 30.0) -> float:
    """settled waits until `promql` returns `expected` (or, without it, the same value on two scrapes apart)."""
    if expected is not None:
        return wait_until(lambda: prometheus.value(promql) == expected or None, timeout, interval=0.2,
                          message=lambda: f"{promql} = {prometheus.value(promql)}, expected {expected}") and expected
    previous = {"value": None, "count": 0}

    def stable():
        value = prometheus.value(promql)
        if value is not None and value == previous["value"]:
            previous["count"] += 1
        else:
            previous["value"], previous["count"] = value, 0
        return previous["count"] >= 5                 # unchanged over 5 polls, 2.5 scrape intervals
    wait_until(stable, timeout, interval=0.25, message=lambda: f"{promql} kept changing")
    return previous["value"]


def test_prometheus_scrapes_every_target_with_health_and_metadata(stack):
    cluster, kv, kv_http, prometheus = stack
    wait_until(lambda: prometheus.value('sum(up{job="bookies"})') == 3 and prometheus.value('up{job="kv"}') == 1,
               timeout=30, interval=0.2, message="prometheus did not scrape every target")
    racks = prometheus.query("walkit_bookie_info")
    assert sorted(r["metric"]["address"] for r in racks) == sorted(cluster.addresses)
    assert prometheus.value('sum(walkit_bookie_read_only{job="bookies"})') == 0
    assert prometheus.value('count(walkit_bookie_journal_sync_latency_seconds_bucket{job="bookies"})') > 0


def test_a_promql_query_returns_the_adds_the_test_made_through_the_kv_server_and_a_client(stack):
    cluster, kv, kv_http, prometheus = stack
    bookie_adds = settled(prometheus, BOOKIE_ADDS)
    kv_appends = settled(prometheus, KV_APPENDS)
    connection = kv.redis()
    for i in range(300):
        assert connection.set(f"key-{i}", f"value-{i}")
    appended = scrape(kv_http)["walkit_client_appends_total"] - kv_appends    # records go in batches
    assert 1 <= appended <= 300
    settled(prometheus, KV_APPENDS, kv_appends + appended)
    # Every entry the KV server appended is on all three bookies (E3/Qw3/Qa3): three adds each.
    settled(prometheus, BOOKIE_ADDS, bookie_adds + 3 * appended)
    assert prometheus.value('sum(walkit_client_append_latency_seconds_count{job="kv"})') >= kv_appends + appended

    with Client(cluster.metadata_url) as client:
        writer = client.create_ledger(3, 3, 3)
        for future in [writer.append_async(b"counted %d" % i) for i in range(1000)]:
            future.result()
        writer.close()
    settled(prometheus, BOOKIE_ADDS, bookie_adds + 3 * appended + 3 * 1000)
    rate = prometheus.value(f'sum(rate(walkit_bookie_adds_total{{job="bookies"}}[10s]))')
    assert rate is not None and rate > 0
    assert prometheus.value('sum(walkit_bookie_add_latency_seconds_count{job="bookies"})') > 0
