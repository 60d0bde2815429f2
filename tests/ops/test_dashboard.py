"""The Grafana dashboard and the metric table of docs/operations/metrics.md name only metrics walkit
exports, and the table documents every one of them (fast tier: collectors built over stand-in objects)."""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

from walkit.autorecovery.daemon import AutoRecovery
from walkit.autorecovery.replicator import ReplicationStats
from walkit.metrics import BookieMetrics, ClientMetrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def exported() -> tuple[set[str], set[str]]:
    """exported returns (metric names as scraped, sample names) of every walkit collector.

    A counter's name as scraped ends in _total; a histogram's is its family name.
    """
    service = SimpleNamespace(entries_stored=1, add_replies=1, entries_read=1, read_replies=1, bytes_stored=1,
                              syncs=1, read_only=False)
    server = SimpleNamespace(service=service, storage=SimpleNamespace(path=os.path.join(ROOT, "dashboards")), address="h:1",
                             config=SimpleNamespace(rack="r"), _draining=False)
    auditor = SimpleNamespace(is_leader=True, underreplicated_ledgers=0, underreplicated_entries=0,
                              underreplicated_bytes=0, lost={}, metadata_reads=0, audits=0, checks=0)
    recovery = AutoRecovery._collector(SimpleNamespace(stats=ReplicationStats(), auditor=auditor))
    bookie = BookieMetrics(server)
    bookie.ledgers = 3                  # counted by the serving loop; unknown (left out) before that
    families, samples = set(), set()
    for collector in (bookie, ClientMetrics(), recovery):
        for family in collector.collect():
            families.add(family.name + "_total" if family.type == "counter" else family.name)
            samples.update(sample.name for sample in family.samples)
    return families, samples


def test_every_metric_the_dashboard_queries_is_exported():
    with open(os.path.join(ROOT, "dashboards", "walkit.json")) as f:
        dashboard = json.load(f)
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) >= 15
    named = {name for expr in exprs for name in re.findall(r"\bwalkit_[a-z_]+", expr)}
    _, samples = exported()
    assert named - samples == set()
    assert {"walkit_bookie_adds_total", "walkit_underreplicated_ledgers",
            "walkit_client_append_latency_seconds_bucket"} <= named


def test_the_documented_metric_table_matches_the_exported_metrics():
    with open(os.path.join(ROOT, "docs", "operations", "metrics.md")) as f:
        page = f.read()
    documented = set(re.findall(r"^\| `(walkit_[a-z_]+)`", page, re.MULTILINE))
    families, _ = exported()
    assert documented == families
