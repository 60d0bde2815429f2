"""walkit.cli is the `walkit` command line (click): `main` is the entry point.

Every command that needs a cluster takes `--metadata URI` (or WALKIT_METADATA); without it, it
uses the embedded default under ./walkit-data, the one `walkit local` runs. The commands live
in the modules of this package, one family each; importing them registers them on `main`.
"""

from walkit.cli import bench, ledgers, logs, security, servers  # noqa: F401  (they register their commands)
from walkit.cli import topics  # noqa: F401  (walkit topics)
from walkit.cli import sqlite  # noqa: F401  (walkit sqlite)
from walkit.cli import admin  # noqa: F401  (bookies info|decommission, recover, underreplicated, auditor, ...)
from walkit.cli.common import default_metadata, main
from walkit.adapters.kv.cli import kv as _kv

main.add_command(_kv)

__all__ = ["default_metadata", "main"]
