"""walkit.plugins.storage.files.checkpoint records how far the entry logs and indexes are durable.

The file ``checkpoint`` is one header line and a JSON body::

    walkit-files-checkpoint 3 <crc32c of the body, 8 hex digits>
    {"replay": [log id, offset], "logs": {...}, "ledgers": {...}}

It names the position in the entry logs (which are the journal) from which replay starts:
every index slot of an entry before it is fsynced. It lists every live log with its per-ledger
byte counts and highest entry ids, and each ledger's summary: last entry id, state (fenced,
master key, explicit LAC, term, last truncation) and the entry below which its entries were
deleted (`delete_entries`). It is replaced atomically: written to ``checkpoint.tmp``,
fsynced, renamed, directory fsynced.

Version 3 (issue 39) added TRIM journal records, the highest entry id per ledger and log, and
each ledger's first entry. Version 2 is read (its logs have no highest entry ids: a trim never
finds their bytes dead, only deleting the ledger does); a walkit that reads only version 2
refuses version 3 instead of stopping at a TRIM record as if the journal were torn there.

Version 1 (walkit before the entry logs became the journal) named a position in separate
journal files, ``{"journal": [seq, offset], "active_log": id, ...}``; it is still read, so a
storage written by it is recovered and carried over (see storage.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from crc32c import crc32c

from walkit.core.bookie import LedgerState
from walkit.errors import StorageError
from walkit.plugins.storage.files.disk import fsync_dir

_MAGIC = "walkit-files-checkpoint"
VERSION = 3
#: The checkpoint versions this walkit reads.
READABLE = ("1", "2", "3")


@dataclass
class Checkpoint:
    """Checkpoint is the durable starting point of recovery (see the module doc).

    `replay_log` and `replay_offset` say where replay starts: an entry log (version 2 and up) or
    a journal file (version 1, which also names its `active_log`). Without a checkpoint, replay
    starts at log 0, offset 0: at the first log there is. `log_tops` maps a log to each ledger's
    highest entry id in it, `firsts` a ledger to the entry below which its entries were deleted
    (only ledgers with one).
    """

    version: int = VERSION
    replay_log: int = 0
    replay_offset: int = 0
    active_log: int = 1
    log_totals: dict[int, int] = field(default_factory=dict)
    log_usage: dict[int, dict[int, int]] = field(default_factory=dict)
    ledgers: dict[int, tuple[int, LedgerState]] = field(default_factory=dict)
    log_tops: dict[int, dict[int, int]] = field(default_factory=dict)
    firsts: dict[int, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        """encode returns the checkpoint file's bytes."""
        assert self.version == VERSION, "only the current checkpoint version is written"
        body = json.dumps({
            "replay": [self.replay_log, self.replay_offset],
            "logs": {str(log_id): [total, {str(k): v for k, v in self.log_usage.get(log_id, {}).items()},
                                   {str(k): v for k, v in self.log_tops.get(log_id, {}).items()}]
                     for log_id, total in self.log_totals.items()},
            "ledgers": {str(ledger_id): [last, int(state.fenced), state.master_key.hex(), state.explicit_lac,
                                         state.term, *state.truncated, self.firsts.get(ledger_id, 0)]
                        for ledger_id, (last, state) in self.ledgers.items()},
        }, separators=(",", ":")).encode()
        return f"{_MAGIC} {VERSION} {crc32c(body):08x}\n".encode() + body

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "Checkpoint":
        """decode parses a checkpoint file's bytes, raising StorageError if they do not verify."""
        header, _, body = raw.partition(b"\n")
        magic, _, crc = header.decode("ascii", "replace").rpartition(" ")
        magic, _, version = magic.rpartition(" ")
        if magic == _MAGIC and version.isdigit() and int(version) > VERSION:
            raise StorageError(f"checkpoint {path} is version {version}, written by a newer walkit; this one reads "
                               f"versions 1 to {VERSION}")
        if magic != _MAGIC or version not in READABLE or crc != f"{crc32c(body):08x}":
            raise StorageError(f"checkpoint {path} is corrupt (bad header or checksum); the storage cannot "
                               f"be recovered safely")
        doc = json.loads(body)
        logs = {int(k): v for k, v in doc["logs"].items()}
        replay = doc["journal"] if version == "1" else doc["replay"]
        return cls(
            version=int(version), replay_log=replay[0], replay_offset=replay[1],
            active_log=doc.get("active_log", replay[0]),
            log_totals={log_id: fields[0] for log_id, fields in logs.items()},
            log_usage={log_id: {int(k): v for k, v in fields[1].items()} for log_id, fields in logs.items()},
            log_tops={log_id: {int(k): v for k, v in fields[2].items()} for log_id, fields in logs.items()
                      if len(fields) > 2},
            firsts={int(k): fields[6] for k, (_, *fields) in doc["ledgers"].items() if len(fields) > 6 and fields[6]},
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
