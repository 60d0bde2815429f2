"""benchmarks/adapters_report.py: each row's ratio, target and verdict, and a missing peer said, not failed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _adapters_report():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "adapters_report.py"
    spec = importlib.util.spec_from_file_location("adapters_report", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module                  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


report = _adapters_report()


def rows_of(figures: dict[str, float], missing: dict[str, str] | None = None, groups=report.GROUPS) -> dict:
    samples = report.Samples(missing=dict(missing or {}))
    for name, value in figures.items():
        samples.add(name, value)
    return {row.spec.label: row for row in report.build_rows(samples, groups)}


def test_a_bound_on_the_ratio_passes_or_misses_by_the_median_of_the_rounds():
    samples = report.Samples()
    for walkit, floor in ((1.2, 0.6), (0.9, 0.6), (5.0, 0.6)):       # a noisy round does not decide it
        samples.add("append1.p50_ms", walkit)
        samples.add("floor.p50_ms", floor)
    [row] = [r for r in report.build_rows(samples, {"latency"}) if r.spec.label.endswith("p50")]
    assert row.walkit == 1.2 and row.ratio == 2.0 and row.result == "miss"
    rows = rows_of({"kv.set_c50": 30_000, "redis.set_c50": 50_000, "kv.get_c50": 30_000, "redis.get_c50": 50_000})
    assert rows["KV SET, redis-benchmark -c 50"].result == "pass"            # 0.6x >= 0.5x
    assert rows["KV GET, -c 50"].result == "miss"                            # 0.6x < 0.8x


def test_an_absolute_target_says_how_far_from_it_the_run_was():
    rows = rows_of({"append.per_s": 52_000, "append.many_per_s": 120_000})
    assert rows["pipelined appends (1,000 in flight)"].result == "miss (0.87x the target)"
    assert rows["append_many (batches of 100)"].result == "pass (1.20x the target)"


def test_a_missing_peer_is_a_line_of_the_table_with_what_to_install():
    why = "peer missing: nats-server is not installed (Debian: apt-get install nats-server)"
    rows = rows_of({"topics.produce_per_s": 40_000, "topics.consume_per_s": 300_000,
                    "streams.produce_per_s": 80_000, "streams.consume_per_s": 200_000},
                   {"nats1": why, "nats3": why}, groups={"topics"})
    nats = rows["topics produce vs NATS JetStream R3"]
    assert nats.walkit == 40_000 and nats.ratio is None and nats.result == why
    assert rows["topics consume vs Redis Streams"].ratio == 1.5
    assert rows["topics consume vs Redis Streams"].result == "reported"          # no target: a ratio only
    table = report.markdown(list(rows.values()))
    assert table.count("apt-get install nats-server") == 4
    assert "| topics produce vs NATS JetStream R1 | 40,000 records/s |" in table


def test_a_row_never_measured_says_so_and_only_the_chosen_groups_have_rows():
    rows = rows_of({}, {"kv": "failed: RuntimeError: boom"}, groups={"kv", "sqlite"})
    assert {row.spec.group for row in rows.values()} == {"kv", "sqlite"}
    assert rows["KV SET, -c 50 -P 16"].result == "failed: RuntimeError: boom"
    assert rows["SQLite, 4 writers"].result == "not measured"
