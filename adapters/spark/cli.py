"""walkit.adapters.spark.cli is `walkit spark`: housekeeping of the Spark data source's state in a cluster.

`walkit spark cleanup` runs the janitor (walkit.adapters.spark.staging.sweep): it deletes the
rows that failed or abandoned writes staged and no commit will publish.
"""

from __future__ import annotations

import re

import click

from walkit.cli.common import client_for, friendly, metadata_option

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(s|m|h|d)?")
_SECONDS = {"s": 1, None: 1, "m": 60, "h": 3600, "d": 86400}


@click.group()
def spark() -> None:
    """Housekeeping for the walkit Spark data source."""


@spark.command()
@metadata_option
@click.option("--older-than", default="6h", show_default=True, metavar="DURATION",
              help="Take the staged rows of batch writes (and of streaming queries that never committed) once "
                   "older than this (30s, 10m, 6h, 1d): a write running longer would lose them.")
@click.option("--sink", default=None, metavar="topic/NAME|log/NAME", help="Only the rows staged for this sink.")
@friendly
def cleanup(metadata, older_than, sink) -> None:
    """Delete staged rows no commit will publish: those of failed or abandoned writes.

    Rows a streaming query staged go once its marker says their micro-batch was written.
    """
    from walkit.adapters.spark.staging import sweep
    match = _DURATION.fullmatch(older_than.strip())
    if not match:
        raise click.BadParameter(f"{older_than!r} is not a duration like 30s, 10m, 6h or 1d", param_hint="--older-than")
    with client_for(metadata) as client:
        deleted = sweep(client, float(match.group(1)) * _SECONDS[match.group(2)], sink)
    click.echo(f"deleted {deleted} staged ledger{'s' if deleted != 1 else ''}")
