"""benchmarks/peers_bench.py: a peer that cannot run is refused first; the etcd-go peer reads `etcdctl check perf`."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from walkit.bench import summary_lines
from walkit.errors import ConfigError


def _peers_bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "peers_bench.py"
    spec = importlib.util.spec_from_file_location("peers_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


peers_bench = _peers_bench()
check_peers, parse_check_perf = peers_bench.check_peers, peers_bench.parse_check_perf

# The verdict lines of Debian's etcdctl 3.4.23 against 3 members on this
# 2-core VM: `--load xl`, which it could not meet, and `--load s` (150 puts/s), which it met.
MISSED = """ 60 / 60  100.00% 1m0s
FAIL: Throughput too low: 3359 writes/s
Slowest request took too long: 1.200731s
Stddev too high: 0.182402s
FAIL
"""
MET = """ 60 / 60  100.00% 1m0s
PASS: Throughput is 151 writes/s
PASS: Slowest request took 0.011095s
PASS: Stddev is 0.000502s
PASS
"""


def test_throughput_slowest_and_stddev_are_read_whether_the_load_was_met_or_not():
    assert parse_check_perf(MISSED) == {"entries_per_s": 3359.0, "slowest_s": 1.200731, "stddev_s": 0.182402}
    assert parse_check_perf(MET) == {"entries_per_s": 151.0, "slowest_s": 0.011095, "stddev_s": 0.000502}


def test_a_check_that_printed_no_throughput_is_an_error_not_zero():
    with pytest.raises(RuntimeError, match="no throughput"):
        parse_check_perf("Error: context deadline exceeded\n")


def test_etcd_go_needs_etcdctl(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))         # neither etcd nor etcdctl
    with pytest.raises(ConfigError, match="etcdctl is not installed.*etcd-client"):
        check_peers(["etcd-go"])


def test_a_peer_without_latencies_gets_its_ratio_and_says_so():
    run = {"entries_per_s": 40_000.0, "p50_ms": 19.0, "p99_ms": 31.0, "p999_ms": 32.0}
    result = {
        "config": {"bookies": 3, "ensemble": 3, "write_quorum": 2, "ack_quorum": 2, "size": 1024, "storage": "files",
                   "runs": 1, "window": 1000, "batch": 100, "recovery_entries": 10_000},
        "append": {"median": run}, "one_in_flight": {"median": run}, "append_many": {"median": run},
        "catch_up_read": {"median": run, "cold": True}, "catch_up_read_warm": {"median": run},
        "recovery": {"median": {"seconds": 0.2}},
        "peers": {"etcd-go": {**parse_check_perf(MISSED), "fsync": True, "note": "etcdctl check perf"}},
    }
    line = summary_lines(result)[-1]
    assert line.startswith("  etcd-go: 3,359 ops/s (no latencies) -> walkit is 11.9x; fsyncs before acking")


def test_a_peer_that_cannot_run_is_refused_before_walkits_own_phases(monkeypatch):
    """A peer whose client or server is missing fails at once, not after minutes of walkit's phases."""
    import walkit.bench
    real_find_spec = importlib.util.find_spec

    def without_nats(name, *args, **kwargs):
        return None if name == "nats" else real_find_spec(name, *args, **kwargs)

    def no_phases(*args, **kwargs):
        raise AssertionError("walkit's phases ran before the peers were checked")

    monkeypatch.setattr(importlib.util, "find_spec", without_nats)
    monkeypatch.setattr(walkit.bench, "run", no_phases)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))      # no nats-server either
    result = CliRunner().invoke(peers_bench.main, ["--peers", "nats", "--storage", "memory"])
    assert result.exit_code != 0
    assert "nats" in result.output and "not installed" in result.output, result.output
    unknown = CliRunner().invoke(peers_bench.main, ["--peers", "nats,kafka", "--storage", "memory"])
    assert unknown.exit_code != 0 and "unknown peer(s) kafka" in unknown.output, unknown.output


def test_the_script_takes_every_option_of_walkit_bench():
    from walkit.cli.bench import bench
    ours = {p.name for p in peers_bench.main.params}
    assert {p.name for p in bench.params} <= ours
    assert next(p for p in peers_bench.main.params if p.name == "peers").required
