"""walkit.cli.bench: `walkit bench`, the benchmark harness with peers side by side."""

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
@click.option("--peers", default="", metavar="LIST",
              help="Also run peers: comma-separated etcd,etcd-go,nats,zookeeper (etcd-go: etcd's own Go client "
                   "through `etcdctl check perf`, a fixed 60 s load).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw throughput over time and latency to this PNG (needs matplotlib).")
@friendly
def bench(bookies, ensemble, write_quorum, ack_quorum, size, entries, window, storage, runs, batch, duration,
          interval, peers, json_path, plot_path) -> None:
    """Benchmark appends (throughput, latency), catch-up reads and recovery on a LocalCluster.

    Every phase runs RUNS times on fresh bookie processes (warmed by one untimed WINDOW of
    appends to a ledger of their own); medians are printed. Phases: appends
    with WINDOW in flight, the same through append_many, one append in flight, the appends on a
    deferred-sync ledger then one force (and one such append in flight), a catch-up read with a
    cold page cache (dropped when run as root) and warm, recovery of an open ledger, and with
    --duration a sustained run, which per --interval also gives the CPU per entry and a speed
    probe of the machine (CPU ms of a fixed piece of Python; higher is a slower machine), and
    the entries per probe (entries/s x the probe's seconds, an estimate: it stays about the
    same when only the machine's speed moves, and falls when walkit slows down). With
    --peers, etcd (3 members, over gRPC), NATS JetStream (R3) and ZooKeeper run the same
    appends, back to back, and a table of ratios is printed; etcd-go drives such an etcd
    cluster with etcd's own Go client instead (`etcdctl check perf --load xl`, Debian's
    etcd-client: its own fixed load of 1 KiB puts from 1,000 clients for 60 s).
    """
    from walkit import bench as harness
    config = harness.BenchConfig(bookies=bookies, ensemble=ensemble, write_quorum=write_quorum,
                                 ack_quorum=ack_quorum, size=size, entries=entries, window=window,
                                 storage=storage, runs=runs, batch=batch, duration=duration, interval=interval)
    config.validate()
    peer_names = [p.strip() for p in peers.split(",") if p.strip()]
    if peer_names:
        from walkit.bench_peers import check_peers
        check_peers(peer_names)             # before walkit's phases: a missing peer fails at once
    total = runs * (entries + config.latency_entries)
    with click.progressbar(length=total, label="walkit appends", file=sys.stderr) as bar:
        result = harness.run(config, progress=bar.update)
    if peer_names:
        from walkit.bench_peers import run_peers
        try:
            result["peers"] = run_peers(peer_names, config)
        except BaseException:
            click.echo("a peer failed; walkit's own results:", err=True)     # minutes of work, kept
            for line in harness.summary_lines(result):
                click.echo(line, err=True)
            raise
    for line in harness.summary_lines(result):
        click.echo(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    if plot_path:
        harness.plot(result, plot_path)
        click.echo(f"plot: {plot_path}")
