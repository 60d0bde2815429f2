"""walkit.plugins.storage.files.checkpoint records how far the entry logs and indexes are durable.

The file ``checkpoint`` is one header line and a JSON body::

    walkit-files-checkpoint 1 <crc32c of the body, 8 hex digits>
    {"journal": [seq, offset], "active_log": id, "logs": {...}, "ledgers": {...}}

It names the journal position from which replay starts (everything before it is in the entry
logs and indexes, fsynced), the active entry log, every live log with its per-ledger byte
counts, and each ledger's summary: last entry id and state (fenced, master key, explicit LAC, term).
It is replaced atomically: written to ``checkpoint.tmp``, fsynced, renamed, directory fsynced.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from crc32c import crc32c

from walkit.core.bookie import LedgerState
from walkit.errors import StorageError
from walkit.plugins.storage.files.disk import fsync_dir

_MAGIC = "walkit-files-checkpoint 1"


@dataclass
class Checkpoint:
    """Checkpoint is the durable starting point of recovery (see the module doc)."""

    journal_seq: int = 1
    journal_offset: int = 0
    active_log: int = 1
    log_totals: dict[int, int] = field(default_factory=dict)
    log_usage: dict[int, dict[int, int]] = field(default_factory=dict)
    ledgers: dict[int, tuple[int, LedgerState]] = field(default_factory=dict)

    def encode(self) -> bytes:
        """encode returns the checkpoint file's bytes."""
        body = json.dumps({
            "journal": [self.journal_seq, self.journal_offset],
            "active_log": self.active_log,
            "logs": {str(log_id): [total, {str(k): v for k, v in self.log_usage.get(log_id, {}).items()}]
                     for log_id, total in self.log_totals.items()},
            "ledgers": {str(ledger_id): [last, int(state.fenced), state.master_key.hex(), state.explicit_lac,
                                         state.term, *state.truncated]
                        for ledger_id, (last, state) in self.ledgers.items()},
        }, separators=(",", ":")).encode()
        return f"{_MAGIC} {crc32c(body):08x}\n".encode() + body

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "Checkpoint":
        """decode parses a checkpoint file's bytes, raising StorageError if they do not verify."""
        header, _, body = raw.partition(b"\n")
        magic, _, crc = header.decode("ascii", "replace").rpartition(" ")
        if magic != _MAGIC or crc != f"{crc32c(body):08x}":
            raise StorageError(f"checkpoint {path} is corrupt (bad header or checksum); the storage cannot "
                               f"be recovered safely")
        doc = json.loads(body)
        logs = {int(k): v for k, v in doc["logs"].items()}
        return cls(
            journal_seq=doc["journal"][0], journal_offset=doc["journal"][1], active_log=doc["active_log"],
            log_totals={log_id: total for log_id, (total, _) in logs.items()},
            log_usage={log_id: {int(k): v for k, v in usage.items()} for log_id, (_, usage) in logs.items()},
            ledgers={int(k): (last, LedgerState(fenced=bool(fields[0]), master_key=bytes.fromhex(fields[1]),
                                                explicit_lac=fields[2], term=fields[3] if len(fields) > 3 else 0,
                                                truncated=tuple(fields[4:6]) if len(fields) > 5 else (0, 0)))
                     for k, (last, *fields) in doc["ledgers"].items()},
        )


def load(folder: str) -> Checkpoint | None:
    """load reads the checkpoint in `folder`, or returns None if there is none yet."""
    path = os.path.join(folder, "checkpoint")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    return Checkpoint.decode(raw, path)


def save(folder: str, checkpoint: Checkpoint) -> None:
    """save replaces the checkpoint in `folder` atomically and durably."""
    path = os.path.join(folder, "checkpoint")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(checkpoint.encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(folder)
