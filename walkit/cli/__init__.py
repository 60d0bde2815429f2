"""walkit.cli is the `walkit` command line (click): `main` is the entry point.

Every command that needs a cluster takes `--metadata URI` (or WALKIT_METADATA); without it, it
uses the embedded default under ./walkit-data, the one `walkit local` runs. walkit's own commands
live in the modules of this package, one family each; importing them registers them on `main`.
Each adapter owns its command group (adapters/NAME/cli.py): `ADAPTER_COMMANDS` is the one place
walkit names them, and `walkit NAME` imports the adapter only when one of its commands runs.
"""

from walkit.cli import bench, ledgers, logs, security, servers  # noqa: F401  (they register their commands)
from walkit.cli import admin  # noqa: F401  (bookies info|decommission, recover, underreplicated, auditor, ...)
from walkit.cli.common import default_metadata, main

#: `walkit NAME` -> the adapter's click group, "module:attribute" (imported on first use).
ADAPTER_COMMANDS = {
    "kv": "walkit.adapters.kv.cli:kv",
    "spark": "walkit.adapters.spark.cli:spark",
    "sqlite": "walkit.adapters.sqlite.cli:sqlite",
    "topics": "walkit.adapters.topics.cli:topics",
}
for _name, _target in ADAPTER_COMMANDS.items():
    main.add_lazy(_name, _target)

__all__ = ["default_metadata", "main"]
