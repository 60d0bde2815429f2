"""walkit.autorecovery.operations are the operator's actions behind `walkit recover`, `decommission` and `format-and-rejoin`.

    report = recover_bookie(client, "10.0.0.7:3181", passwords=["pw"])      # a dead bookie, now
    report = decommission_bookie(client, "10.0.0.8:3181", passwords=["pw"])  # a live one, moved away
    report = format_and_rejoin(client, "10.0.0.9:3181")                     # an emptied disk may start

Both mark every ledger with a fragment on the bookie and run a replication worker in this
process until no fragment names it (the bookies' own workers help; the ledgers' locks keep
them apart). They work while auto-recovery is switched off: an operator asked. `progress` is
called as progress(stage, done, total) so a command line can draw bars.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Callable

from walkit import deletions
from walkit.autorecovery.marks import DECOMMISSION, LOST, NEW_DISK, UnderReplication
from walkit.autorecovery.replicator import Replicator
from walkit.autorecovery.worker import ReplicationWorker
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import BadVersion, ConfigError, NoSuchKey, NoSuchLedger, Timeout, WalkitError

Progress = Callable[[str, int, int], None]


def _quiet(stage: str, done: int, total: int) -> None:
    pass


def ledgers_on(client, address: str, progress: Progress = _quiet, ledger_ids=None) -> dict[int, list[int]]:
    """ledgers_on maps each ledger with a fragment on `address` to those fragments' first entries.

    It looks at every ledger, or at `ledger_ids` only.
    """
    found: dict[int, list[int]] = {}
    ledger_ids = client.list_ledgers() if ledger_ids is None else list(ledger_ids)
    for done, ledger_id in enumerate(ledger_ids, 1):
        try:
            metadata = client.ledger_metadata(ledger_id)
        except NoSuchLedger:
            continue
        starts = [start for start in metadata.fragment_starts if address in metadata.ensembles[start]]
        if starts:
            found[ledger_id] = starts
        progress("scan", done, len(ledger_ids))
    return found


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def recover_bookie(client, address: str, *, passwords=("",), reason: str = LOST, force_open: bool = True,
                   open_grace_s: float = 30.0, timeout: float = 3600.0, progress: Progress = _quiet,
                   poll_s: float = 0.2) -> dict:
    """recover_bookie re-replicates every fragment on `address` and returns a report.

    With `force_open`, unclosed ledgers whose last fragment holds the bookie are recovered
    (fenced and closed) at once; without it they wait `open_grace_s` for their writers to
    replace the bookie. Timeout if fragments remain after `timeout` seconds.
    """
    if reason not in (LOST, DECOMMISSION):
        raise ConfigError(f"reason must be {LOST!r} or {DECOMMISSION!r}, not {reason!r}")
    started = time.monotonic()
    marks = UnderReplication(client.store)
    found = ledgers_on(client, address, progress)
    for done, ledger_id in enumerate(found, 1):
        marks.mark(ledger_id, {address: reason})
        progress("mark", done, len(found))
    replicator = Replicator(client, passwords=passwords, open_grace_s=open_grace_s)
    worker = ReplicationWorker(marks, replicator, _worker_name(), only={address}, respect_switch=False,
                               max_backoff_s=2.0)
    try:
        remaining = dict(found)
        while remaining:
            worker.run_once(force_open=force_open)
            remaining = ledgers_on(client, address, ledger_ids=remaining)
            progress("replicate", len(found) - len(remaining), len(found))
            if not remaining:
                break
            if time.monotonic() - started > timeout:
                raise Timeout(f"{len(remaining)} ledgers still have fragments on {address} after {timeout:g} s: "
                              f"{', '.join(str(i) for i in sorted(remaining)[:10])}"
                              + _errors(marks, remaining))
            time.sleep(poll_s)
    finally:
        replicator.close()
    if reason == LOST:
        marks.forget(address)                  # nothing of it is left for the auditor to look for
    return {"bookie": address, "ledgers": sorted(found), "fragments": sum(len(s) for s in found.values()),
            "entries_copied": replicator.stats.entries_copied, "bytes_copied": replicator.stats.bytes_copied,
            "ledgers_recovered": replicator.stats.ledgers_recovered,
            "seconds": round(time.monotonic() - started, 3), "remaining": []}


def _errors(marks: UnderReplication, ledgers) -> str:
    reasons = []
    for ledger_id in sorted(ledgers)[:3]:
        got = marks.get(ledger_id)
        if got is not None and got[0].error:
            reasons.append(f"ledger {ledger_id}: {got[0].error}")
    return ("; last errors: " + "; ".join(reasons)) if reasons else ""


def format_and_rejoin(client, address: str, progress: Progress = _quiet) -> dict:
    """format_and_rejoin lets the stopped bookie `address` start again on an empty disk; it returns a report.

    It records the old disk (from the cookie; a retired id if there is none) in every fragment
    that names the address with no disk recorded (ledgers written before disks were), marks
    every ledger with a fragment on the address "new-disk", and removes the bookie's cookie
    (walkit.bookie.identity), so the bookie formats its storage as a new disk at its next start
    instead of refusing. Auto-recovery copies those entries back to the new disk once it is
    registered (and records the disk in the fragments), or to other bookies while it is not.
    Until then clients count none of its answers for those fragments (LedgerMetadata.disks), so
    nothing it lost can look absent. A registered bookie is refused: stop it first.
    """
    from walkit.bookie.identity import delete_cookie, new_disk_id, read_cookie
    if client.registry.info(address) is not None:
        raise WalkitError(f"bookie {address} is registered (running); stop it first. format-and-rejoin is for a "
                          f"bookie that refuses to start because its storage was emptied or replaced")
    marks = UnderReplication(client.store)
    found = ledgers_on(client, address, progress)
    cookie = read_cookie(client.store, address)
    # Fragments written before disks were recorded name the address with no disk, and every answer
    # would count for them: they record the disk that held them (a retired id if none is known).
    old_disk = cookie.disk if cookie is not None else new_disk_id()
    for done, ledger_id in enumerate(found, 1):
        _record_disk(client.store, ledger_id, address, old_disk)
        marks.mark(ledger_id, {address: NEW_DISK})
        progress("mark", done, len(found))
    cookie = delete_cookie(client.store, address)
    return {"bookie": address, "old_disk": f"{cookie.disk:x}" if cookie is not None else None,
            "ledgers": sorted(found), "fragments": sum(len(s) for s in found.values())}


def _record_disk(store, ledger_id: int, address: str, disk: int, rounds: int = 20) -> None:
    """_record_disk records `disk` for `address` in the ledger's fragments that record none (CAS, retried)."""
    key = ledger_key(ledger_id)
    for _ in range(rounds):
        try:
            value, version = store.get(key)
        except NoSuchKey:
            return                                 # deleted meanwhile
        metadata = LedgerMetadata.from_bytes(value)
        updated = metadata.with_disk_where_unknown(address, disk)
        if updated == metadata:
            return
        try:
            store.put(key, updated.to_bytes(), version)
            return
        except BadVersion:
            continue                               # a writer changed it: record on top of that
        except NoSuchKey:
            return
    raise WalkitError(f"ledger {ledger_id}: its metadata kept changing while the disk of {address} was recorded")


def decommission_bookie(client, address: str, *, passwords=("",), open_grace_s: float = 30.0,
                        drain_timeout: float = 15.0, timeout: float = 3600.0, progress: Progress = _quiet) -> dict:
    """decommission_bookie moves every fragment off a running bookie; it may be stopped afterwards.

    The bookie first turns draining (read-only, so new ledgers avoid it and writers replace it
    at their next add); then its fragments are re-replicated, reading from it as well; an
    unclosed ledger whose writer keeps it past `open_grace_s` is recovered. The bookie stays
    draining until it stops (`cancel_decommission` makes it writable again).
    """
    info = client.registry.info(address)
    if info is None:
        raise WalkitError(f"bookie {address} is not registered; for a bookie that is gone use "
                          f"`walkit recover {address}`")
    marks = UnderReplication(client.store)
    marks.start_decommission(address)
    deadline = time.monotonic() + drain_timeout
    while True:
        info = client.registry.info(address)
        if info is not None and info.draining:
            break
        if time.monotonic() > deadline:
            raise Timeout(f"bookie {address} did not turn draining within {drain_timeout:g} s "
                          "(is it running a walkit with decommission support?)")
        time.sleep(0.1)
    report = recover_bookie(client, address, passwords=passwords, reason=DECOMMISSION, force_open=False,
                            open_grace_s=open_grace_s, timeout=timeout, progress=progress)
    report["can_stop"] = True
    return report


def cancel_decommission(client, address: str) -> None:
    """cancel_decommission ends a decommission: the bookie turns writable again (data already moved stays moved)."""
    UnderReplication(client.store).end_decommission(address)


def sanity_check(client, address: str, *, entries: int = 10, size: int = 100, timeout: float = 10.0) -> dict:
    """sanity_check writes `entries` to one bookie, reads them back and verifies them (BookKeeper's bookiesanity).

    It uses a ledger of its own on that bookie alone (metadata created, then deleted, so the
    bookie drops the data at its next garbage collection) and reports latencies in ms.
    """
    from walkit.autorecovery.bookieio import BookieIO
    from walkit.core.digest import Digest, master_key, password_check
    from walkit.core.messages import Entry, Status
    from walkit.core.metadata import LEDGER_ID_COUNTER

    store = client.store
    ledger_id = store.next_id(LEDGER_ID_COUNTER)
    metadata = LedgerMetadata(ledger_id=ledger_id, ensemble_size=1, write_quorum=1, ack_quorum=1,
                              ensembles={0: (address,)}, password_check=password_check(b""),
                              created_ms=int(time.time() * 1000), custom={"walkit": "bookie sanity"},
                              owner=client.principal)
    store.create(ledger_key(ledger_id), metadata.to_bytes())
    io = BookieIO(lookup=client.registry.info, timeout=timeout)
    report = {"bookie": address, "ledger": ledger_id, "entries": entries, "ok": False}
    try:
        digest = Digest("crc32c")
        payloads = [os.urandom(size) for _ in range(entries)]
        batch = [Entry(ledger_id, e, e - 1, digest.sign(ledger_id, e, e - 1, p), p) for e, p in enumerate(payloads)]
        started = time.perf_counter()
        added = io.add(address, ledger_id, master_key(b""), batch)
        report["add_ms"] = round((time.perf_counter() - started) * 1000, 3)
        if added.status != Status.OK:
            report["error"] = f"add: {Status(added.status).name} {added.message}"
            return report
        started = time.perf_counter()
        read = io.read(address, ledger_id, list(range(entries)))
        report["read_ms"] = round((time.perf_counter() - started) * 1000, 3)
        if read.status != Status.OK:
            report["error"] = f"read: {Status(read.status).name} {read.message}"
            return report
        got = {e.entry_id: e for e in read.entries}
        bad = [e for e in range(entries) if e not in got or got[e].payload != payloads[e] or not digest.verify(got[e])]
        if bad:
            report["error"] = f"{len(bad)} entries missing or wrong after the read, first {bad[0]}"
            return report
        report["ok"] = True
        return report
    finally:
        io.close()
        try:
            deletions.delete_ledger(store, ledger_id)
        except WalkitError:
            pass
