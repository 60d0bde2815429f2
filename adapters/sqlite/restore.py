"""walkit.adapters.sqlite.restore rebuilds a replicated SQLite database as it was at a log position or a time.

    restore("app", "app-at-noon.db", time="2025-01-31T12:00:00Z", metadata="sqlite:///.../metadata.db")

It starts from the newest snapshot ledger at or before the target (walkit.replication.snapshots
lists them; a node's `retention_s` keeps the ones a restore inside the window needs), then
applies the log's records after it with the same state machine the nodes run, stopping at the
target: every record of the entries up to `position`, or every record committed at or before
`time` (the leader's clock at COMMIT). The result is a plain SQLite file (rollback journal,
not WAL) that passes `PRAGMA integrity_check`; it keeps `_walkit_position`, the position it
holds, so it can also seed a new replica.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

from walkit.core.loglist import Position
from walkit.errors import LogTruncated, NoSuchLedger, NoSuchLog, WalkitError
from walkit.replication import batch
from walkit.replication.snapshots import list_snapshots, load_snapshot

from walkit.adapters.sqlite import definition, records
from walkit.adapters.sqlite.adoption import image_loader
from walkit.adapters.sqlite.machine import SqliteMachine, _Halt, _show
from walkit.adapters.sqlite.skips import skip_recorded


class RestoreError(WalkitError):
    """RestoreError is raised when the log and snapshots kept cannot rebuild the state asked for."""


@dataclass(frozen=True)
class Restored:
    """Restored describes a restored file: the record position it holds, that record's commit time, records applied."""

    path: str
    position: Position | None
    commit_ms: int
    records: int
    snapshot: Position | None


def parse_time(value) -> int:
    """parse_time turns an ISO 8601 text, a datetime or Unix milliseconds into Unix milliseconds (naive: UTC)."""
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            value = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise RestoreError(f"{value!r} is not an ISO 8601 time, e.g. 2025-01-31T12:00:00Z") from None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return int(value.timestamp() * 1000)
    raise RestoreError(f"a restore time is ISO 8601 text, a datetime or Unix milliseconds, not {value!r}")


def restore(name: str, out: str, *, position=None, time=None, client=None, metadata: str | None = None,
            password: bytes | str = b"") -> Restored:
    """restore writes database `name` as it was at `position` (a Position or "L:E") or `time` to the new file `out`.

    Without either it restores the latest state. `client` (or a client on `metadata`, default the
    embedded cluster) reads the snapshots and the log. RestoreError if they cannot rebuild it.
    """
    if position is not None and time is not None:
        raise RestoreError("restore to a position or to a time, not both")
    if os.path.exists(out):
        raise RestoreError(f"{out} exists already; restore writes a new file")
    target = Position.parse(position) if isinstance(position, str) else position
    until_ms = None if time is None else parse_time(time)
    password = password.encode() if isinstance(password, str) else bytes(password)
    owned = client is None
    if owned:
        import walkit
        from walkit.cli.common import default_metadata
        client = walkit.Client(metadata or os.environ.get("WALKIT_METADATA") or default_metadata())
    partial = out + ".restoring"
    for leftover in (partial, partial + "-wal", partial + "-shm", partial + "-journal"):
        if os.path.exists(leftover):
            os.remove(leftover)
    try:
        result = _rebuild(client, name, partial, target, until_ms, password)
        _finish(partial)
        os.replace(partial, out)
        return Restored(out, result[0], result[1], result[2], result[3])
    finally:
        for leftover in (partial, partial + "-wal", partial + "-shm"):
            if os.path.exists(leftover):
                os.remove(leftover)
        if owned:
            client.close()


def _rebuild(client, name: str, path: str, target: Position | None, until_ms: int | None, password: bytes):
    snapshots = list_snapshots(client, name, scan=True)    # also those written before the index
    if target is not None:
        usable = [s for s in snapshots if s.position <= target]
    elif until_ms is not None:
        usable = [s for s in snapshots if s.created_ms <= until_ms]
    else:
        usable = snapshots
    base = None
    for candidate in reversed(usable):
        try:
            state = load_snapshot(client, candidate, password)
        except NoSuchLedger:
            continue                                  # deleted meanwhile: an older one may do
        with state, open(path, "wb") as copy:
            while chunk := state.read(1 << 20):
                copy.write(chunk)
        base = candidate
        break
    machine = SqliteMachine(path, name)
    machine.find_skip = lambda at: skip_recorded(client, name, at)
    machine.load_image = image_loader(client, password)
    try:
        if until_ms is not None and machine.commit_ms > until_ms:
            raise RestoreError(f"the oldest snapshot kept holds transactions committed after {_iso(until_ms)}; "
                               "the log and snapshots before it were removed (raise retention_s)")
        count = _replay(client, machine, name, base.position if base else None, target, until_ms, password)
        at = machine.position
        if target is not None and (at is None or (at[0], at[1]) < tuple(target)):
            raise RestoreError(f"position {target} is past the end of the log of {name!r} (it ends at "
                               f"{_show(at)})")
        return (None if at is None else Position(at[0], at[1])), machine.commit_ms, count, \
            (base.position if base else None)
    finally:
        machine.close()


def _replay(client, machine: SqliteMachine, name: str, start: Position | None, target: Position | None,
            until_ms: int | None, password: bytes) -> int:
    """_replay applies the log's records after `start` up to the target; it returns how many it applied.

    read_log serves the closed ledgers; the ledger the leader is writing is read up to its
    last add confirmed (waiting a moment for a target position beyond it).
    """
    begin = Position(0, 0) if start is None else Position(start.ledger_id, start.entry_id + 1)
    progress = {"count": 0, "last": start}
    log_name = f"replicated-{name}"
    try:
        reading = client.read_log(log_name, start=begin, password=password)
        try:
            for entry in reading:
                if not _apply_entry(machine, entry.position, entry.payload, target, until_ms, progress):
                    return progress["count"]
        finally:
            close = getattr(reading, "close", None)
            if close is not None:
                close()
        for segment in client.log_metadata(log_name).segments:
            if segment.is_closed or segment.ledger_id < begin.ledger_id:
                continue
            last = progress["last"]
            first = last.entry_id + 1 if last is not None and last.ledger_id == segment.ledger_id else (
                begin.entry_id if segment.ledger_id == begin.ledger_id else 0)
            handle = client.open_ledger(segment.ledger_id, password=password)
            lac = handle.read_last_add_confirmed()
            if target is not None and target.ledger_id == segment.ledger_id and target.entry_id > lac:
                lac = handle.wait_for_lac(above=target.entry_id - 1, timeout=5)
            if lac < first:
                continue
            for entry in handle.read(first, lac):
                if not _apply_entry(machine, Position(segment.ledger_id, entry.entry_id), entry.payload, target,
                                    until_ms, progress):
                    return progress["count"]
    except NoSuchLog:
        if start is None:
            raise RestoreError(f"there is no replicated SQLite database {name!r} (no log {log_name})") from None
    except LogTruncated as exc:
        raise RestoreError(f"the log of {name!r} before the target was removed and no snapshot that old is kept "
                           f"({exc}); keep more with retention_s") from None
    except _Halt as halt:
        raise halt.error from None
    return progress["count"]


def _apply_entry(machine: SqliteMachine, position: Position, payload: bytes, target: Position | None,
                 until_ms: int | None, progress: dict) -> bool:
    """_apply_entry applies the records of one log entry up to the target; False once the target is passed."""
    if target is not None and position > target:
        return False
    for record in batch.decode(payload):
        if until_ms is not None and records.commit_ms(record) > until_ms:
            return False
        if machine.apply(record, position) is not None:
            progress["count"] += 1
    progress["last"] = position
    return True


def _finish(path: str) -> None:
    """_finish turns the rebuilt file into one plain SQLite file and checks it (with the database's
    definitions: a CHECK constraint or an index may use a registered function or collation)."""
    import apsw
    db = apsw.Connection(path)
    try:
        definition.register_all(db)
        db.execute("PRAGMA journal_mode=DELETE").fetchall()
        problems = [row[0] for row in db.execute("PRAGMA integrity_check")]
        if problems != ["ok"]:
            raise RestoreError(f"the restored file fails PRAGMA integrity_check: {problems[:5]}")
    finally:
        db.close()


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat()
