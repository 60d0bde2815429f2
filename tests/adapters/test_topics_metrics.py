"""`walkit topics serve --http-port`: the broker serves Prometheus /metrics, /health and /ready (issue 18)."""

from __future__ import annotations

import urllib.request

import pytest
from kafka import KafkaProducer

from walkit.local import free_port

from ..integration.helpers import wait_until
from tests.support.serverprocess import TopicsProcess

pytestmark = pytest.mark.slow


def scrape(url: str) -> dict[str, float]:
    """scrape reads a Prometheus text page into {sample name with labels: value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_the_broker_counts_its_appends_on_its_metrics_endpoint(tmp_path):
    port = free_port()
    broker = TopicsProcess(tmp_path, data_dir=tmp_path / "data", args=("--http-port", str(port)))
    broker.start().wait_ready()
    try:
        base = f"http://127.0.0.1:{port}"
        for path in ("/health", "/ready"):
            with urllib.request.urlopen(base + path, timeout=10) as response:
                assert response.status == 200
        before = scrape(base + "/metrics").get("walkit_client_appends_total", 0)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        for i in range(20):
            producer.send("measured", value=b"m%d" % i).get(timeout=30)
        producer.close()
        after = wait_until(lambda: scrape(base + "/metrics").get("walkit_client_appends_total", 0) >= before + 20
                           and scrape(base + "/metrics"), timeout=10)
        assert after["walkit_client_append_latency_seconds_count"] >= 20
        assert after.get("walkit_client_append_failures_total", 0) == 0
    finally:
        broker.stop()
