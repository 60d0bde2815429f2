"""walkit.cli.topics is `walkit topics`: the Kafka-compatible broker and commands that talk to it.

`serve` runs a broker (walkit.adapters.topics). The other commands are Kafka clients
(kafka-python) of a running broker, given by --bootstrap HOST:PORT (or WALKIT_BOOTSTRAP).
"""

from __future__ import annotations

import json
import logging
import sys

import click

from walkit.cli.common import main

bootstrap_option = click.option(
    "--bootstrap", "-b", envvar="WALKIT_BOOTSTRAP", default="127.0.0.1:9092", show_default=True,
    metavar="HOST:PORT", help="A broker of the cluster (walkit topics serve) [env WALKIT_BOOTSTRAP].")


def _parse_configs(values: tuple[str, ...]) -> dict[str, str]:
    configs = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r}: use NAME=VALUE, e.g. retention.ms=60000", param_hint="--config")
        configs[name] = value
    return configs


def _kafka_errors(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from kafka.errors import KafkaError
        try:
            return fn(*args, **kwargs)
        except KafkaError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    return wrapper


@main.group()
def topics() -> None:
    """Kafka-compatible topics: a broker storing partitions as walkit logs, and its tools.

    Start a broker with `walkit topics serve`; kafka-python, confluent-kafka and kcat work
    against it unchanged (e.g. `kcat -b 127.0.0.1:9092 -L`).
    """


@topics.command()
@click.option("--port", type=int, default=9092, show_default=True, help="Kafka port (0 picks a free one).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--advertise", default=None, metavar="HOST:PORT",
              help="Address clients are told to use for this broker [default: HOST:PORT].")
@click.option("--data-dir", default="walkit-data", show_default=True,
              help="Where the embedded cluster keeps its data (without --metadata).")
@click.option("--metadata", envvar="WALKIT_METADATA", default=None, metavar="URI",
              help="Join the cluster of this metadata store instead of running an embedded one; brokers "
                   "on one cluster share its topics [env WALKIT_METADATA].")
@click.option("--bookies", type=int, default=3, show_default=True, help="Bookies of the embedded cluster.")
@click.option("--broker-id", type=int, default=None, help="Kafka broker id [default: a new one from the cluster].")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Partitions of topics created automatically (on first use).")
@click.option("--auto-create/--no-auto-create", default=True, show_default=True,
              help="Create unknown topics when a client asks for them (Kafka's auto.create.topics.enable).")
@click.option("--ensemble", "-e", type=int, default=None, help="Ensemble of the partitions' ledgers [default: 3].")
@click.option("--write-quorum", "-w", type=int, default=None, help="Write quorum [default: 2].")
@click.option("--ack-quorum", "-a", type=int, default=None,
              help="Ack quorum: a produce (acks=1 or all) is answered once this many bookies hold it [default: 2].")
@click.option("--cache-mb", type=click.IntRange(min=1), default=32, show_default=True,
              help="Recent batches kept in memory per partition, so tailing consumers skip the bookies.")
@click.option("--retention-check-ms", type=click.IntRange(min=100), default=5000, show_default=True,
              help="How often retention.ms and retention.bytes are applied.")
@click.option("--rebalance-delay-ms", type=click.IntRange(min=0), default=1000, show_default=True,
              help="How long a new group waits for more members before its first rebalance "
                   "(Kafka's group.initial.rebalance.delay.ms).")
@click.option("--password", default="", help="Password of the partitions' ledgers.")
def serve(**options) -> None:
    """Serve the Kafka protocol from walkit logs until Ctrl-C.

    Each topic partition is a walkit log; record batches are stored as producers sent them,
    with dense offsets. Several brokers on one cluster (--metadata URI) elect a leader per
    partition and per group coordinator; a dead broker's partitions move within seconds.

    Example: walkit topics serve, then: echo hello | kcat -b 127.0.0.1:9092 -t greetings -P
    """
    from walkit.adapters.topics.service import ServeOptions, run
    from walkit.errors import WalkitError
    logging.getLogger("walkit.adapters.topics").setLevel(min(logging.getLogger().level, logging.INFO))
    try:
        status = run(ServeOptions(**options), echo=lambda line: click.echo(line, err=True))
    except (WalkitError, OSError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    sys.exit(status)
