"""walkit.cli.bench: `walkit bench`, the benchmark harness (benchmarks/peers_bench.py runs peers through it)."""

from __future__ import annotations

import json
import sys

import click

from walkit.cli.common import friendly, main


# -- bench -----------------------------------------------------------------------------------
@main.command()
@click.option("--bookies", type=int, default=3, show_default=True, help="Bookie processes.")
@click.option("--ensemble", "-e", type=int, default=3, show_default=True, help="Ensemble size E.")
@click.option("--write-quorum", "-w", type=int, default=2, show_default=True, help="Write quorum Qw.")
@click.option("--ack-quorum", "-a", type=int, default=2, show_default=True, help="Ack quorum Qa.")
@click.option("--size", type=int, default=1024, show_default=True, help="Payload bytes per entry.")
@click.option("--entries", type=int, default=50000, show_default=True, help="Appends in the throughput phase.")
@click.option("--window", type=int, default=1000, show_default=True, help="Appends in flight.")
@click.option("--storage", default="files", show_default=True, help="Bookie storage: files, sqlite, memory.")
@click.option("--runs", type=int, default=3, show_default=True, help="Runs per phase; medians are reported.")
@click.option("--batch", type=int, default=100, show_default=True,
              help="Records per append_many call in the append_many phase.")
@click.option("--duration", type=float, default=0, show_default=True, metavar="SECONDS",
              help="Also run a sustained phase this long (e.g. 300), with throughput, p99, CPU per entry and "
                   "a speed probe of the machine per --interval.")
@click.option("--interval", type=float, default=10, show_default=True, metavar="SECONDS",
              help="Reporting interval of the sustained phase.")
@click.option("--peers", default="", hidden=True,
              help="Moved: peers run from benchmarks/peers_bench.py, which is not installed with walkit.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw throughput over time and latency to this PNG (needs matplotlib).")
@friendly
def bench(peers, json_path, plot_path, **options) -> None:
    """Benchmark appends (throughput, latency), catch-up reads and recovery on a LocalCluster.

    Every phase runs RUNS times on fresh bookie processes (warmed by one untimed WINDOW of
    appends to a ledger of their own); medians are printed. Phases: appends
    with WINDOW in flight, the same through append_many, one append in flight, the appends on a
    deferred-sync ledger then one force (and one such append in flight), a catch-up read with a
    cold page cache (dropped when run as root) and warm, recovery of an open ledger, and with
    --duration a sustained run, which per --interval also gives the CPU per entry and a speed
    probe of the machine (CPU ms of a fixed piece of Python; higher is a slower machine), and
    the entries per probe (entries/s x the probe's seconds, an estimate: it stays about the
    same when only the machine's speed moves, and falls when walkit slows down). To run etcd,
    NATS JetStream and ZooKeeper through the same harness beside walkit, use
    benchmarks/peers_bench.py from a checkout of walkit (it takes these options and --peers).
    """
    if peers:
        raise click.UsageError("--peers moved out of the installed walkit: from a checkout, run "
                               f"python benchmarks/peers_bench.py --peers {peers} with the same options")
    result = run_walkit(bench_config(**options))
    report(result, json_path, plot_path)


def bench_config(bookies, ensemble, write_quorum, ack_quorum, size, entries, window, storage, runs, batch, duration,
                 interval):
    """bench_config is the validated harness configuration of `walkit bench`'s options (ConfigError if not valid)."""
    from walkit import bench as harness
    config = harness.BenchConfig(bookies=bookies, ensemble=ensemble, write_quorum=write_quorum,
                                 ack_quorum=ack_quorum, size=size, entries=entries, window=window,
                                 storage=storage, runs=runs, batch=batch, duration=duration, interval=interval)
    config.validate()
    return config


def run_walkit(config) -> dict:
    """run_walkit runs the harness's phases on walkit, with a progress bar on stderr, and returns their results."""
    from walkit import bench as harness
    total = config.runs * (config.entries + config.latency_entries)
    with click.progressbar(length=total, label="walkit appends", file=sys.stderr) as bar:
        return harness.run(config, progress=bar.update)


def report(result: dict, json_path: str | None, plot_path: str | None) -> None:
    """report prints the summary of `result` (peers included), and writes it as JSON and a plot when asked."""
    from walkit import bench as harness
    for line in harness.summary_lines(result):
        click.echo(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    if plot_path:
        harness.plot(result, plot_path)
        click.echo(f"plot: {plot_path}")
