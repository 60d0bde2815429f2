"""walkit.adapters.sqlite.status gathers what `walkit sqlite status NAME` shows, from the metadata store alone.

The leader comes from the election, the nodes from what each publishes while it runs
(walkit.adapters.sqlite.database), the log's ledgers, entries and bytes from the log's
metadata, and the current snapshot from its pointer. Nothing here joins the cluster as a node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from walkit.errors import NoSuchKey, NoSuchLog
from walkit.replication.snapshots import read_pointer

from walkit.adapters.sqlite.database import status_prefix


@dataclass
class Status:
    """Status is a replicated SQLite database as the metadata store describes it."""

    name: str
    leader: str | None
    nodes: list[dict] = field(default_factory=list)
    ledgers: int = 0
    entries: int | None = 0
    log_bytes: int | None = 0
    log_exists: bool = False
    snapshot: dict | None = None

    def lines(self) -> list[str]:
        """lines renders the status as text, one fact per line, nodes as a table."""
        out = [f"database  {self.name}", f"leader    {self.leader or '(none)'}"]
        if not self.log_exists:
            out.append(f"log       replicated-{self.name} does not exist yet (nothing committed)")
        else:
            entries = "?" if self.entries is None else str(self.entries)
            size = "?" if self.log_bytes is None else _size(self.log_bytes)
            out.append(f"log       replicated-{self.name}: {self.ledgers} ledgers, {entries} entries, {size}")
        if self.snapshot:
            out.append(f"snapshot  at {self.snapshot['position']} in ledger {self.snapshot['ledger_id']} "
                       f"({_size(self.snapshot['size'])})")
        else:
            out.append("snapshot  (none)")
        rows = [["node", "role", "applied", "lag", "file"]]
        for node in self.nodes:
            role = node.get("role", "?") + (" STOPPED" if node.get("stopped") else "")
            rows.append([node.get("node_id", "?"), role, node.get("applied") or "-",
                         "?" if node.get("lag") is None else str(node["lag"]), node.get("file", "")])
        out.append("nodes")
        out.extend("  " + line for line in table(rows))
        for node in self.nodes:
            if node.get("stopped"):
                out.append(f"  {node['node_id']}: {node['stopped']}")
            forwarding = node.get("forwarding") or ""
            if forwarding.startswith("none: ") and node.get("role") in ("leader", "follower"):
                out.append(f"  {node['node_id']} takes no writes forwarded from other nodes: {forwarding[6:]}")
        return out


def gather(client, name: str) -> Status:
    """gather reads database `name`'s status from `client`'s metadata store."""
    from walkit.election import LeaderElection
    store = client.store
    leader = LeaderElection(store, f"replication/{name}", "walkit-sqlite-status").leader()
    status = Status(name, leader)
    prefix = status_prefix(name)
    try:
        children = store.children(prefix)
    except NoSuchKey:
        children = []
    for child in children:
        try:
            value, _ = store.get(f"{prefix}/{child}")
            status.nodes.append(json.loads(value))
        except (NoSuchKey, ValueError):
            continue
    status.nodes.sort(key=lambda node: (node.get("role") != "leader", node.get("node_id", "")))
    try:
        segments = client.log_metadata(f"replicated-{name}").segments
        status.log_exists = True
    except NoSuchLog:
        segments = ()
    status.ledgers = len(segments)
    counts = [s.entries if s.entries is not None else (s.last_entry_id + 1 if s.last_entry_id is not None else None)
              for s in segments]
    status.entries = None if None in counts else sum(counts)
    sizes = [s.size for s in segments]
    status.log_bytes = None if None in sizes else sum(sizes)
    pointer, _ = read_pointer(store, name)
    if pointer is not None:
        status.snapshot = {"position": str(pointer.position), "ledger_id": pointer.ledger_id, "size": pointer.size,
                           "created_ms": pointer.created_ms}
    return status


def table(rows: list[list[str]]) -> list[str]:
    """table lays rows out in columns (the first row is the header, underlined)."""
    if not rows:
        return []
    widths = [max(len(str(row[i])) if i < len(row) else 0 for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"
