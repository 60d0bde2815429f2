"""walkit.adapters.sqlite.records encodes one committed transaction as one replicated record.

    record := MAGIC "WSQL"  FORMAT:u8  header_length:u32  header(JSON)  blob*

The header is ``{"t": commit_ms, "node": node_id, "steps": [[kind, value], ...]}``, the steps
in the order the transaction ran them:

- ``["cs", n]``: an apsw Session changeset of n bytes, the next blob (row changes carry their
  values, so RANDOM() and datetime('now') give every replica the leader's result);
- ``["sql", text]``: a schema statement (CREATE/ALTER/DROP of tables, indexes, views, triggers;
  PRAGMA user_version / application_id), run as it is;
- ``["skip", [ledger, entry, record]]``: the record at that position is skipped by every node
  that has not applied it (`walkit sqlite skip`); a record holds this step alone. Nodes from
  before skips stop at it ("unknown step"), so every node is upgraded before a skip;
- ``["adopt", {"ledger": id, "size": n, "crc32c": c}]``: the database's content is the SQLite
  file image in that ledger (walkit.adapters.sqlite.adoption); only the first record of a log
  holds it, alone. Nodes from before adoption stop at it ("unknown step").

`t` is the leader's wall clock at COMMIT: point-in-time restores by time stop there.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

MAGIC = b"WSQL"
FORMAT = 1
_HEAD = struct.Struct(">4sBI")

CHANGESET = "cs"
SQL = "sql"
SKIP = "skip"
ADOPT = "adopt"


class RecordError(ValueError):
    """RecordError is raised for bytes that are not a transaction record of this format."""


@dataclass
class Transaction:
    """Transaction is a committed transaction's steps, its commit time and the node that committed it."""

    steps: list[tuple[str, bytes | str]] = field(default_factory=list)
    commit_ms: int = 0
    node: str = ""

    def add_changeset(self, changeset: bytes) -> None:
        """add_changeset appends a changeset step (an empty one is dropped)."""
        if changeset:
            self.steps.append((CHANGESET, bytes(changeset)))

    def add_sql(self, text: str) -> None:
        """add_sql appends a schema statement step."""
        self.steps.append((SQL, text))

    def add_skip(self, at: tuple[int, int, int]) -> None:
        """add_skip appends the step skipping the record at position `at` (ledger, entry, record)."""
        self.steps.append((SKIP, tuple(at)))

    @property
    def skipped(self) -> tuple[int, int, int] | None:
        """skipped is the position this record skips, None for a transaction."""
        return next((value for kind, value in self.steps if kind == SKIP), None)

    def add_adopt(self, image: dict) -> None:
        """add_adopt appends the step making the database the file image described by `image` (ledger, size, crc32c)."""
        self.steps.append((ADOPT, {"ledger": int(image["ledger"]), "size": int(image["size"]),
                                   "crc32c": int(image["crc32c"])}))

    @property
    def adopted(self) -> dict | None:
        """adopted describes the file image an adoption record makes the database (None for other records)."""
        return next((value for kind, value in self.steps if kind == ADOPT), None)

    @property
    def has_schema(self) -> bool:
        """has_schema is True if the record changes the schema."""
        return any(kind == SQL for kind, _ in self.steps)

    def encode(self) -> bytes:
        """encode returns the record's bytes."""
        header, blobs = [], []
        for kind, value in self.steps:
            if kind == CHANGESET:
                header.append([kind, len(value)])
                blobs.append(value)
            else:
                header.append([kind, value])
        doc = json.dumps({"t": self.commit_ms, "node": self.node, "steps": header}, separators=(",", ":")).encode()
        return b"".join([_HEAD.pack(MAGIC, FORMAT, len(doc)), doc, *blobs])

    @classmethod
    def decode(cls, record: bytes) -> "Transaction":
        """decode reads a record written by `encode`."""
        if len(record) < _HEAD.size:
            raise RecordError(f"a record of {len(record)} bytes is too short")
        magic, version, size = _HEAD.unpack_from(record)
        if magic != MAGIC or version != FORMAT:
            raise RecordError(f"not a walkit SQLite record (magic {magic!r}, format {version})")
        at = _HEAD.size + size
        try:
            doc = json.loads(record[_HEAD.size:at])
        except ValueError as exc:
            raise RecordError(f"the record's header is not JSON: {exc}") from None
        steps: list[tuple[str, bytes | str]] = []
        for kind, value in doc["steps"]:
            if kind == CHANGESET:
                if at + value > len(record):
                    raise RecordError("a record's changeset is truncated")
                steps.append((kind, record[at:at + value]))
                at += value
            elif kind == SQL:
                steps.append((kind, value))
            elif kind == ADOPT:
                steps.append((kind, dict(value)))
            elif kind == SKIP:
                steps.append((kind, tuple(int(part) for part in value)))
            else:
                raise RecordError(f"unknown step {kind!r}")
        if at != len(record):
            raise RecordError(f"{len(record) - at} bytes follow the record's steps")
        return cls(steps, int(doc.get("t", 0)), str(doc.get("node", "")))


def commit_ms(record: bytes) -> int:
    """commit_ms is the leader's commit time of a record, read from its header alone."""
    magic, version, size = _HEAD.unpack_from(record)
    if magic != MAGIC or version != FORMAT:
        raise RecordError(f"not a walkit SQLite record (magic {magic!r}, format {version})")
    return int(json.loads(record[_HEAD.size:_HEAD.size + size]).get("t", 0))
