"""walkit is a replicated write-ahead log: Apache BookKeeper's protocol as a Python SDK.

    import walkit
    with walkit.LocalCluster(bookies=3) as cluster, walkit.Client(cluster.metadata_url) as client:
        w = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        w.append(b"hello")

See the documentation site in docs/ (docs/index.md; `mkdocs serve` to browse it) for concepts,
configuration and the command line.

The names below are imported on first use (PEP 562), so `import walkit.core.writer` loads the
sans-IO core alone, without ZeroMQ, Cap'n Proto or threads.
"""

from __future__ import annotations

import importlib

#: Public name -> the module that defines it.
_EXPORTS = {
    "CLOSED": "walkit.core.metadata", "IN_RECOVERY": "walkit.core.metadata", "OPEN": "walkit.core.metadata",
    "LedgerMetadata": "walkit.core.metadata", "Entry": "walkit.core.messages",
    "LogConfig": "walkit.core.loglist", "LogMetadata": "walkit.core.loglist", "Position": "walkit.core.loglist",
    "Client": "walkit.client.api", "ReadHandle": "walkit.client.api", "WriteHandle": "walkit.client.api",
    "LogRecord": "walkit.client.log", "LogWriter": "walkit.client.log",
    "LeaderElection": "walkit.election", "LocalCluster": "walkit.local",
    "StateMachine": "walkit.replication", "replicate": "walkit.replication", "ReplicatedNode": "walkit.replication",
}

#: Names that stay importable from walkit, outside __all__: process knobs, documented in their own
#: modules (docs/operations/tuning.md), which is where to import them from.
_KEPT = {"tune_malloc": "walkit.allocator", "tune_gc": "walkit.collector"}

__all__ = sorted([*_EXPORTS, "errors"])
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "errors":
        return importlib.import_module("walkit.errors")
    module = _EXPORTS.get(name) or _KEPT.get(name)
    if module is None:
        raise AttributeError(f"module 'walkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
