"""benchmarks/adapters_report.py: the rows of benchmarks/adapters.py, issue 48's targets, the table and the chart.

Nothing here measures. `benchmarks/adapters.py` records named figures per round (``Samples``);
this module turns their medians into `Row`s, one per line of `SPECS`, each walkit's figure beside
its baseline from the same run (a peer, or walkit's own one append in flight), the ratio, the
target issue 48 sets and whether the run met it. It never asserts: a missed target is a line of
the table. A figure that could not be measured says why (a peer that is not installed names what
to install; a failed measurement gives its error).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

#: The groups of rows, in the order they run; `--rows` picks among them.
GROUPS = ("latency", "pipelined", "replicate", "sqlite", "kv", "topics")


@dataclass(frozen=True)
class Target:
    """Target is one of issue 48's bars: walkit's figure at least or at most `bound`.

    The bound applies to the ratio walkit / baseline, or, when `absolute`, to walkit's figure itself.
    """

    at_least: bool
    bound: float
    absolute: bool = False

    def score(self, walkit: float, ratio: float | None) -> float:
        """score is how far the measurement is from the bound: 1 on it, above 1 when it passes."""
        measured = walkit if self.absolute else ratio
        return measured / self.bound if self.at_least else self.bound / measured

    def text(self, unit: str) -> str:
        """text renders the bar, e.g. '>= 0.5x' or '>= 60,000 appends/s'."""
        sign = ">=" if self.at_least else "<="
        return f"{sign} {_figure(self.bound, unit)}" if self.absolute else f"{sign} {self.bound:g}x"


@dataclass(frozen=True)
class Spec:
    """Spec is one row of the table: where its figures come from, and its target (None: reported only).

    `walkit` and `baseline` name figures of `Samples`; the part of a name before its first dot is
    the system it was measured on, which is what `Samples.missing` is keyed by.
    """

    group: str
    label: str
    walkit: str
    unit: str
    baseline_label: str | None = None
    baseline: str | None = None
    target: Target | None = None
    baseline_unit: str | None = None          # when it is not `unit`

    @property
    def units(self) -> tuple[str, str]:
        """units are the units of walkit's figure and of the baseline's."""
        return self.unit, self.baseline_unit or self.unit


def _at_most(bound: float) -> Target:
    return Target(at_least=False, bound=bound)


def _at_least(bound: float, absolute: bool = False) -> Target:
    return Target(at_least=True, bound=bound, absolute=absolute)


FLOOR = "latency floor (ZeroMQ + Python + fdatasync)"
ONE_APPEND = "one append in flight"
REDIS = "redis-server (appendfsync always)"
SQLITE3 = "sqlite3 (WAL, synchronous=FULL)"

#: Every row, in table order. Issue 48 item 6 sets the targets.
SPECS = (
    Spec("latency", "one append in flight, p50", "append1.p50_ms", "ms", f"{FLOOR}, p50", "floor.p50_ms",
         _at_most(1.5)),
    Spec("latency", "one append in flight, p99", "append1.p99_ms", "ms", f"{FLOOR}, p99", "floor.p99_ms",
         _at_most(3.0)),
    Spec("pipelined", "pipelined appends (1,000 in flight)", "append.per_s", "appends/s",
         target=_at_least(60_000, absolute=True)),
    Spec("pipelined", "append_many (batches of 100)", "append.many_per_s", "appends/s",
         target=_at_least(100_000, absolute=True)),
    Spec("replicate", "replicate, 1 submitter: mean per submit", "replicate.1_mean_ms", "ms",
         f"{ONE_APPEND}, mean", "append1.mean_ms", _at_most(1.3)),
    Spec("replicate", "replicate, 1 submitter, leader alone (no followers): mean per submit",
         "replicate.1_alone_mean_ms", "ms", f"{ONE_APPEND}, mean", "append1.mean_ms"),
    Spec("replicate", "replicate, 8 submitters", "replicate.8_per_s", "submits/s",
         ONE_APPEND, "append1.per_s", baseline_unit="appends/s"),
    Spec("replicate", "replicate, 64 submitters", "replicate.64_per_s", "submits/s",
         ONE_APPEND, "append1.per_s", _at_least(20_000, absolute=True), baseline_unit="appends/s"),
    Spec("replicate", "replicate, 64 submitters, linger_ms=2 (as `walkit kv serve`; the default is 0)",
         "replicate.64_linger_per_s", "submits/s", ONE_APPEND, "append1.per_s", baseline_unit="appends/s"),
    Spec("sqlite", "SQLite, 1 writer: mean COMMIT", "sqlite.1_commit_mean_ms", "ms",
         f"{ONE_APPEND}, mean", "append1.mean_ms", _at_most(1.5)),
    Spec("sqlite", "SQLite, 1 writer: mean per transaction (INSERT and COMMIT)", "sqlite.1_mean_ms", "ms",
         f"{ONE_APPEND}, mean", "append1.mean_ms"),
    Spec("sqlite", "SQLite, 1 writer", "sqlite.1_per_s", "tx/s", f"{SQLITE3}, 1 writer", "sqlite3.1_per_s"),
    Spec("sqlite", "SQLite, 4 writers", "sqlite.4_per_s", "tx/s", f"{SQLITE3}, 4 writers", "sqlite3.4_per_s",
         _at_least(0.3)),
    Spec("sqlite", "SQLite, 4 writers, group commit (the default) against none", "sqlite.4_per_s", "tx/s",
         "the same, connect(group_commit=False)", "sqlite.4_alone_per_s"),
    Spec("kv", "KV SET, redis-benchmark -c 50", "kv.set_c50", "req/s", REDIS, "redis.set_c50", _at_least(0.5)),
    Spec("kv", "KV SET, -c 50 -P 16", "kv.set_c50_p16", "req/s", REDIS, "redis.set_c50_p16", _at_least(0.2)),
    Spec("kv", "KV GET, -c 50", "kv.get_c50", "req/s", REDIS, "redis.get_c50", _at_least(0.8)),
    Spec("kv", "KV GET, -c 50 -P 16", "kv.get_c50_p16", "req/s", REDIS, "redis.get_c50_p16"),
    Spec("topics", "topics produce (confluent-kafka, acks=all, 100 B)", "topics.produce_per_s", "records/s",
         target=_at_least(150_000, absolute=True)),
    Spec("topics", "topics consume", "topics.consume_per_s", "records/s", target=_at_least(500_000, absolute=True)),
    Spec("topics", "topics end-to-end, p50 (one record at a time)", "topics.e2e_p50_ms", "ms"),
    Spec("topics", "topics end-to-end, p99", "topics.e2e_p99_ms", "ms"),
    Spec("topics", "topics produce vs Redis Streams", "topics.produce_per_s", "records/s",
         "Redis Streams XADD (appendfsync always)", "streams.produce_per_s"),
    Spec("topics", "topics consume vs Redis Streams", "topics.consume_per_s", "records/s",
         "Redis Streams XREAD", "streams.consume_per_s"),
    Spec("topics", "topics produce vs NATS JetStream R1", "topics.produce_per_s", "records/s",
         "JetStream R1 (acks before fsync)", "nats1.produce_per_s"),
    Spec("topics", "topics consume vs NATS JetStream R1", "topics.consume_per_s", "records/s",
         "JetStream R1, pull consumer", "nats1.consume_per_s"),
    Spec("topics", "topics produce vs NATS JetStream R3", "topics.produce_per_s", "records/s",
         "JetStream R3 (acks before fsync)", "nats3.produce_per_s"),
    Spec("topics", "topics consume vs NATS JetStream R3", "topics.consume_per_s", "records/s",
         "JetStream R3, pull consumer", "nats3.consume_per_s"),
)


@dataclass
class Samples:
    """Samples holds the figures of every round by name, and why a system could not be measured."""

    rounds: dict[str, list[float]] = field(default_factory=dict)
    #: Why a system has no figures, by system, as the table says it: "peer missing: install X",
    #: "missing: install X" (what walkit's side needs), "failed: the error".
    missing: dict[str, str] = field(default_factory=dict)
    #: Measurements that raised, each "systems: failed: the error".
    failures: list[str] = field(default_factory=list)

    def add(self, name: str, value: float) -> None:
        """add records one round's figure `name` (e.g. 'kv.set_c50')."""
        self.rounds.setdefault(name, []).append(value)

    def why_missing(self, name: str) -> str | None:
        """why_missing is why figure `name` has no rounds (its system's entry in `missing`), if it has none."""
        if name in self.rounds:
            return None
        return self.missing.get(name.split(".", 1)[0], "not measured")

    def median(self, name: str | None) -> float | None:
        """median is the median of figure `name` over its rounds (None if it has none)."""
        values = self.rounds.get(name) if name else None
        return statistics.median(values) if values else None


@dataclass(frozen=True)
class Row:
    """Row is one line of the table: walkit's median, its baseline's, and what stood in the way of either."""

    spec: Spec
    walkit: float | None
    baseline: float | None
    walkit_missing: str | None = None
    baseline_missing: str | None = None

    @property
    def ratio(self) -> float | None:
        """ratio is walkit / baseline (None without both)."""
        if self.walkit is None or not self.baseline:
            return None
        return self.walkit / self.baseline

    @property
    def score(self) -> float | None:
        """score is Target.score of the row (None without a target or the figures it needs)."""
        target = self.spec.target
        if target is None or self.walkit is None or (not target.absolute and self.ratio is None):
            return None
        return target.score(self.walkit, self.ratio)

    @property
    def result(self) -> str:
        """result is 'pass', 'miss', 'reported' (no target) or why a figure of the row is missing."""
        if self.walkit_missing:
            return self.walkit_missing
        if self.baseline_missing:
            return self.baseline_missing
        if self.spec.target is None:
            return "reported"
        verdict = "pass" if self.score >= 1 else "miss"
        if self.spec.target.absolute:
            return f"{verdict} ({self.walkit / self.spec.target.bound:.2f}x the target)"
        return verdict


def build_rows(samples: Samples, groups) -> list[Row]:
    """build_rows gives the rows of `groups`, in table order, from the medians of `samples`."""
    rows = []
    for spec in SPECS:
        if spec.group not in groups:
            continue
        rows.append(Row(spec, samples.median(spec.walkit), samples.median(spec.baseline),
                        samples.why_missing(spec.walkit),
                        samples.why_missing(spec.baseline) if spec.baseline else None))
    return rows


def _figure(value: float, unit: str) -> str:
    return f"{value:.2f} ms" if unit == "ms" else f"{value:,.0f} {unit}"


def markdown(rows: list[Row]) -> str:
    """markdown renders the rows as a markdown table."""
    lines = ["| row | walkit | baseline, same run | walkit / baseline | target | result |",
             "| --- | ---: | --- | ---: | --- | --- |"]
    for row in rows:
        spec = row.spec
        walkit = "-" if row.walkit is None else _figure(row.walkit, spec.unit)
        if spec.baseline is None:
            baseline = "-"
        elif row.baseline is None:
            baseline = f"{spec.baseline_label}: -"
        else:
            baseline = f"{spec.baseline_label}: {_figure(row.baseline, spec.units[1])}"
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        target = "-" if spec.target is None else spec.target.text(spec.unit)
        lines.append(f"| {spec.label} | {walkit} | {baseline} | {ratio} | {target} | {row.result} |")
    return "\n".join(lines) + "\n"


#: The chart's colours: a met target, a missed one, a row without a target.
COLOURS = {"pass": "#2e7d32", "miss": "#c62828", "reported": "#9e9e9e"}


def chart(rows: list[Row], path: str, title: str) -> str | None:
    """chart draws each row's ratio (absolute targets: walkit / target) and its target to a PNG at `path`.

    It returns None, or why it drew nothing (matplotlib missing, no row with a ratio).
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'walkit[bench]')"
    drawn = []
    for row in rows:
        target = row.spec.target
        if target is not None and target.absolute and row.walkit is not None:
            drawn.append((row.spec.label + " (vs target)", row.walkit / target.bound, 1.0, row))
        elif row.ratio is not None:
            drawn.append((row.spec.label, row.ratio, target.bound if target else None, row))
    if not drawn:
        return "no row has a ratio to draw"
    figure, axes = plt.subplots(figsize=(10, 0.42 * len(drawn) + 1.6))
    positions = range(len(drawn))[::-1]
    for y, (label, value, bound, row) in zip(positions, drawn):
        verdict = row.result.split(" ", 1)[0] if row.spec.target else "reported"
        axes.barh(y, value, color=COLOURS.get(verdict, COLOURS["reported"]))
        if bound is not None:
            axes.plot([bound, bound], [y - 0.42, y + 0.42], color="black", linewidth=2)
        axes.text(value, y, f" {value:.2f}x", va="center", fontsize=8)
    axes.set_yticks(list(positions), [label for label, *_ in drawn], fontsize=8)
    axes.set_xscale("log")
    axes.axvline(1.0, color="#616161", linewidth=0.6, linestyle=":")
    axes.set_xlabel("walkit / baseline in the same run (rows with an absolute target: walkit / target)")
    axes.set_title(title + "\ngreen: target met, red: missed, grey: no target; black mark: the target", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None
