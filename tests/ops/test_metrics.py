"""walkit.metrics: the HTTP endpoint, weighted histograms, client append metrics (fast tier)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from walkit.errors import ConfigError
from walkit.metrics import Collector, Histogram, HttpEndpoint, client_metrics, new_registry
from walkit.testing.memory import MemoryCluster


def get(address: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[str, float]:
    return {(s.name + (str(sorted(s.labels.items())) if s.labels else "")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_histogram_counts_weighted_observations_into_cumulative_buckets():
    histogram = Histogram([0.1, 1.0])
    histogram.observe(0.05)
    histogram.observe(0.5, count=3)
    histogram.observe(5.0)
    assert histogram.count == 5
    family = histogram.family("x_seconds", "x")
    by_bound = {s.labels.get("le"): s.value for s in family.samples if s.name == "x_seconds_bucket"}
    assert by_bound == {"0.1": 1, "1.0": 4, "+Inf": 5}
    assert [s.value for s in family.samples if s.name == "x_seconds_sum"] == [pytest.approx(6.55)]


def test_endpoint_serves_metrics_health_and_ready_and_refuses_other_paths():
    values = {"v": 3}
    collector = Collector()
    collector.counter("demo_things", "things", lambda: values["v"])
    collector.gauge("demo_broken", "raises", lambda: 1 / 0)
    collector.gauge("demo_labelled", "labels", lambda: {("x",): 2}, labels=("name",))
    healthy = {"ok": True}
    endpoint = HttpEndpoint("127.0.0.1", 0, [new_registry(collector, process=False)],
                            health=lambda: (healthy["ok"], "ok" if healthy["ok"] else "stuck"))
    try:
        status, text = get(endpoint.address, "/metrics")
        assert status == 200
        found = samples(text)
        assert found["demo_things_total"] == 3 and found["demo_labelled[('name', 'x')]"] == 2
        assert not any(name.startswith("demo_broken") for name in found)    # left out, the rest served
        values["v"] = 5
        assert samples(get(endpoint.address, "/metrics")[1])["demo_things_total"] == 5
        assert get(endpoint.address, "/health") == (200, "ok\n")
        assert get(endpoint.address, "/ready") == (200, "ready\n")
        healthy["ok"] = False
        assert get(endpoint.address, "/health") == (503, "stuck\n")
        assert get(endpoint.address, "/nope")[0] == 404
    finally:
        endpoint.close()


def test_endpoint_on_a_busy_port_is_a_config_error():
    endpoint = HttpEndpoint("127.0.0.1", 0, [])
    try:
        port = int(endpoint.address.rsplit(":", 1)[1])
        with pytest.raises(ConfigError, match="cannot serve metrics"):
            HttpEndpoint("127.0.0.1", port, [])
    finally:
        endpoint.close()


def test_client_metrics_count_acknowledged_ledger_and_log_appends(tmp_path):
    metrics = client_metrics()
    before, latencies = metrics.appends, metrics.append_latency.count
    with MemoryCluster(f"sqlite://{tmp_path}/meta.db", bookies=3) as cluster:
        client = cluster.client()
        writer = client.create_ledger(3, 2, 2)
        for future in [writer.append_async(b"x") for _ in range(25)]:
            future.result()
        log = client.open_log("counted")
        log.append(b"record")
        log.close()
        unbounded = client.open_log("counted-once", unbounded=True)      # through a WriteHandle: counted once
        unbounded.append(b"record")
        unbounded.close()
    assert metrics.appends - before == 27
    assert metrics.append_latency.count - latencies == 27
