"""walkit.cli.common holds what every `walkit` command shares: the `main` group, options, errors."""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os

import click

from walkit.allocator import tune_malloc
from walkit.collector import tune_gc
from walkit.errors import WalkitError

DEFAULT_DATA_DIR = "walkit-data"


def default_metadata() -> str:
    """default_metadata is the embedded cluster's metadata URI under ./walkit-data."""
    return f"sqlite://{os.path.abspath(os.path.join(DEFAULT_DATA_DIR, 'metadata.db'))}"


def friendly(fn):
    """friendly turns walkit errors into one-line messages and exit status 1."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except WalkitError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    return wrapper


metadata_option = click.option(
    "--metadata", "metadata", envvar="WALKIT_METADATA", default=None, metavar="URI",
    help="Metadata store: sqlite:///path, zk://host:port/root or etcd://host:port/root "
         "[env WALKIT_METADATA; default: the embedded cluster under ./walkit-data].")
password_option = click.option("--password", default="", help="Ledger password.")


def client_for(metadata: str | None):
    """client_for is a Client of the cluster (with the key pair of `walkit --key`, through WALKIT_KEY)."""
    from walkit.client.api import Client
    return Client(metadata or default_metadata())


class LazyGroup(click.Group):
    """LazyGroup is a click group whose commands may also be named by import path, imported when first asked for.

    `walkit.cli` lists each adapter's command group this way (`add_lazy`): the adapter owns its
    commands, and walkit's own commands run without importing any adapter.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, str] = {}

    def add_lazy(self, name: str, target: str) -> None:
        """add_lazy makes `walkit NAME` the click command at `target`, "package.module:attribute"."""
        self.lazy[name] = target

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = self.lazy.get(name)
        if target is not None and name not in self.commands:
            module, _, attribute = target.partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--key", envvar="WALKIT_KEY", default=None, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False),
              help="Client key pair (a .key_secret file from `walkit keys new`) for a secured cluster; "
                   "every command and server that talks to bookies uses it [env WALKIT_KEY].")
def main(verbose: int, key: str | None) -> None:
    """walkit: a replicated write-ahead log (Apache BookKeeper's protocol in Python).

    Start an embedded cluster with `walkit local`, then create, append to and read ledgers
    from another terminal. Every command has --help.

    On a secured cluster (`walkit local --security`, or bookies started with --curve-key),
    give the client key pair with `walkit --key FILE COMMAND ...`.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tune_malloc()                               # large buffers reused, not page-faulted anew (walkit.allocator)
    tune_gc()                                   # young objects freed before the collector walks them (walkit.collector)
    if key:
        os.environ["WALKIT_KEY"] = key          # walkit.Client's default key, also in child processes


format_option = click.option("--format", "fmt", type=click.Choice(["text", "hex", "json"]), default="text",
                             show_default=True, help="How payloads are printed.")


def echo_payload(key: str, label, payload: bytes, fmt: str) -> None:
    """echo_payload prints one record: `label` (an entry id or position), a tab, then the payload.

    `fmt` is text (UTF-8, undecodable bytes escaped), hex, or json ({key: label, "payload": text}).
    """
    if fmt == "json":
        label = label if isinstance(label, int) else str(label)
        click.echo(json.dumps({key: label, "payload": payload.decode("utf-8", "backslashreplace")}))
    elif fmt == "hex":
        click.echo(f"{label}\t{payload.hex()}")
    else:
        click.echo(f"{label}\t{payload.decode('utf-8', 'backslashreplace')}")
