"""walkit.adapters.sqlite.adoption makes an existing SQLite file a replicated database: its content is the first record.

    conn = walkit.adapters.sqlite.connect("existing.db", name="app", adopt=True)

`adopt` (connect calls it with `adopt=True` when the file holds tables but no log position):

1. copies the file with the SQLite backup API into an image (a consistent copy, even while
   another program reads the file) and checks that this process registered every function the
   schema uses (walkit.adapters.sqlite.definition);
2. joins the database as a node that applies nothing and leads it, only when no node does
   (skips.lead_alone): a running node means the replicated database exists;
3. refuses unless the log and the snapshots are empty: a replicated database of that name
   holds acknowledged data, which an adoption never overwrites. The exception is this file's
   own adoption, interrupted after its record was appended (the same image: size and crc32c),
   which goes on;
4. writes the image into a ledger of its own (custom metadata ``sqlite-adopted``), closes it,
   and appends the adoption record naming it (records.ADOPT), the first record of the log.

Every node then applies that record as any other (SqliteMachine.apply): one SQLite backup
replaces its file's content with the image and its position with the record's, so the
adopting node's file holds what it held and every other node's file the same. The image's
ledger is kept while the log holds the adoption record (a node or a restore replaying the
log from its start reads it): ``sqlite/<name>/adopted`` names it and the log's ledger holding
the record, and the leader deletes both once snapshots truncated that ledger away
(`collect_image`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import BinaryIO

import crc32c

from walkit.errors import NodeExists, NoSuchKey, NoSuchLedger, NoSuchLog, WalkitError
from walkit.replication import batch
from walkit.replication.snapshots import append_chunks, read_chunks, read_pointer

from walkit.adapters.sqlite import definition
from walkit.adapters.sqlite.errors import MissingFunction, OperationalError
from walkit.adapters.sqlite.records import RecordError, Transaction

CHUNK_BYTES = 1 << 20


class AdoptionRefused(WalkitError, OperationalError):
    """AdoptionRefused is raised when a file is not adopted: the replicated database exists, or the file cannot be."""


def needs_adoption(path: str) -> bool:
    """needs_adoption is True for a SQLite file with tables and no log position (a database walkit did not make)."""
    import apsw
    from walkit.adapters.sqlite.machine import has_position_table
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return False
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        if has_position_table(db):
            return False
        return db.execute("SELECT count(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'").fetchall()[0][0] > 0
    finally:
        db.close()


def take_image(path: str, out_path: str) -> dict:
    """take_image copies the database at `path` into `out_path` (SQLite backup API); it returns its size and crc32c."""
    import apsw
    from walkit.adapters.sqlite.machine import backup_into
    source = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        definition.register_all(source)
        lacking = definition.missing(source)
        if lacking is not None:
            raise MissingFunction(f"{path} cannot be adopted: its schema uses SQL {lacking.what} {lacking.name!r}, "
                                  f"which is not registered in this process; call walkit.adapters.sqlite."
                                  f"create_function({lacking.name!r}, ...) before connect, in every process of the "
                                  f"database (docs/guides/sqlite.md#functions-the-schema-uses)", lacking.name)
        backup_into(out_path, source)
    finally:
        source.close()
    size = crc = 0
    with open(out_path, "rb") as image:
        while chunk := image.read(CHUNK_BYTES):
            size += len(chunk)
            crc = crc32c.crc32c(chunk, crc)
    return {"size": size, "crc32c": crc}


def adopt(client, path: str, name: str, node_id: str, *, ensemble: int = 3, write_quorum: int = 2,
          ack_quorum: int = 2, password: bytes | str = b"") -> None:
    """adopt appends the adoption record of the file at `path` as the first record of database `name` (module doc).

    AdoptionRefused if the database exists (another node leads it, or its log or snapshots hold
    anything but this file's own adoption).
    """
    from walkit.adapters.sqlite.skips import lead_alone

    def refuse(leader: str | None) -> AdoptionRefused:
        if leader is None:
            return AdoptionRefused(f"could not lead {name!r} to adopt {path}: no node may run the database while a "
                                   f"file is adopted")
        return AdoptionRefused(f"{path} is not adopted: node {leader!r} runs replicated database {name!r}, which "
                               f"exists; an adoption never overwrites a database (adopt under another name, or "
                               f"move the file away to get the replicated copy)")
    with tempfile.TemporaryDirectory(prefix="walkit-sqlite-adopt-") as scratch:
        image_path = os.path.join(scratch, "image.db")
        image = take_image(path, image_path)
        with lead_alone(client, name, f"{node_id}#adopt", refuse) as node:
            first = _first_record(client, name)
            if first is not None or node.applied is not None or read_pointer(client.store, name)[0] is not None:
                adopted = first.adopted if first is not None else None
                if adopted is not None and (adopted["size"], adopted["crc32c"]) == (image["size"], image["crc32c"]):
                    return                            # this file's adoption, interrupted after its record
                raise AdoptionRefused(f"{path} is not adopted: replicated database {name!r} exists (its log or "
                                      f"snapshots hold data), and an adoption never overwrites acknowledged data; "
                                      f"adopt under another name, or move the file away to get the replicated copy")
            image["ledger"] = write_image(client, name, image_path, ensemble=ensemble, write_quorum=write_quorum,
                                          ack_quorum=ack_quorum, password=password)
            record = Transaction(commit_ms=time.time_ns() // 1_000_000, node=node_id)
            record.add_adopt(image)
            node.submit(record.encode())
            value = json.dumps({"ledger": image["ledger"], "log_ledger": node.applied.ledger_id}).encode()
            try:
                client.store.create(image_key(name), value)
            except NodeExists:                        # left by a database of this name that was deleted
                client.store.put(image_key(name), value, client.store.get(image_key(name))[1])


def image_key(name: str) -> str:
    """image_key names the image ledger of adopted database `name` and the log ledger holding its adoption record."""
    return f"sqlite/{name}/adopted"


def collect_image(client, name: str) -> bool:
    """collect_image deletes the adopted image of `name` once the log no longer holds its adoption record.

    It returns True when nothing is left to collect (no adopted image, or it was deleted now).
    """
    try:
        value, _ = client.store.get(image_key(name))
    except NoSuchKey:
        return True
    adopted = json.loads(value)
    segments = client.log_metadata(f"replicated-{name}").segments
    if not segments or segments[0].ledger_id <= adopted["log_ledger"]:
        return False                                  # the record may be replayed: the image is needed
    try:
        client.delete_ledger(adopted["ledger"])
    except NoSuchLedger:
        pass
    client.store.delete(image_key(name))
    return True


def _first_record(client, name: str) -> Transaction | None:
    """_first_record is the first record of database `name`'s log (None if it holds none)."""
    try:
        for entry in client.read_log(f"replicated-{name}"):
            for record in batch.decode(entry.payload):
                try:
                    return Transaction.decode(record)
                except RecordError:
                    return Transaction()
    except NoSuchLog:
        return None
    return None


def write_image(client, name: str, image_path: str, *, ensemble: int, write_quorum: int, ack_quorum: int,
                password: bytes | str = b"") -> int:
    """write_image copies the file image at `image_path` into a new closed ledger and returns its id."""
    writer = client.create_ledger(ensemble, write_quorum, ack_quorum, password=password,
                                  custom={"sqlite-adopted": name})
    with open(image_path, "rb") as image:
        append_chunks(client, writer, image)
    writer.close()
    return writer.ledger_id


def image_loader(client, password: bytes | str = b""):
    """image_loader is the function SqliteMachine calls for an adoption record: the image, checked, in a buffer."""
    def load(image: dict) -> BinaryIO:
        reader = client.open_ledger(image["ledger"], password=password)
        out, size, crc = read_chunks(reader, 0, reader.last_add_confirmed)
        if (size, crc) != (image["size"], image["crc32c"]):
            out.close()
            raise WalkitError(f"adopted image ledger {image['ledger']} holds {size} bytes (crc {crc:#x}), the "
                              f"adoption record says {image['size']} (crc {image['crc32c']:#x})")
        return out
    return load


def copy_to(src: BinaryIO, path: str) -> None:
    """copy_to writes a loaded image into a file."""
    with open(path, "wb") as out:
        shutil.copyfileobj(src, out, CHUNK_BYTES)
