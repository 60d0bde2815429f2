"""walkit.autorecovery.replicator repairs the fragments of one ledger: copy entries, then CAS the metadata.

For each bookie named by a ledger's mark (walkit.autorecovery.marks) the Replicator goes
through the ledger's fragments that hold it:

- a bookie that is gone, or being decommissioned, is replaced: a new bookie is chosen by the
  placement policy (walkit.placement.choose_replacement: the write sets through that position
  keep their racks), every entry of the fragment whose write set holds the old bookie is read
  from a surviving replica (digest checked) and stored on the new bookie as a recovery add,
  and only then the ledger's metadata is rewritten with the new bookie in that fragment, by
  compare-and-swap (BookKeeper's LedgerFragmentReplicator);
- a live bookie that lacks entries (the periodic check found them missing) gets the missing
  entries copied back in place; the metadata does not change;
- a live bookie with a new disk (mark "new-disk": its storage was emptied and formatted) gets
  every entry its fragments give it copied back in place, and then the fragment records its
  new disk (LedgerMetadata.disks), so its answers count for that fragment again; a fragment
  that records its current disk already needs nothing. A new-disk bookie that is not
  registered is replaced like a lost one.

Ordering rules:

- entries are on the new bookie (acknowledged, so synced) BEFORE the metadata names it, so a
  reader that follows the new metadata finds them;
- only fragments whose entries are final are copied: every fragment of a CLOSED ledger, and
  every fragment but the last of an OPEN one (a new fragment starts at the writer's LAC + 1, so
  an earlier fragment never changes). The last fragment of an unclosed ledger belongs to its
  writer, which replaces failed bookies itself; if it still holds a marked bookie
  `open_grace_s` after the mark, the writer is presumed dead and the ledger is recovered
  (fenced and closed through `Client.open_ledger(recover=True)`, as BookKeeper's
  openLedgerRereplicationGracePeriod does), after which all of it is copied;
- a CAS conflict re-reads the metadata: if the fragments this repair copied are unchanged
  (a writer appended a fragment, or another repair changed other fragments) the change is
  applied on top of the new metadata; otherwise the repair starts over. Copies are
  idempotent, so starting over (or a second worker taking over a dead one's ledger) is safe;
  entries copied to a bookie the metadata never came to name are reclaimed by that bookie's
  over-replication garbage collection.

Ledger passwords: entries are stored under the ledger's master key, which only the password
gives, so the replicator is configured with the passwords it may use (BookKeeper's
bookieRecoveryPasswd); the one matching the ledger's `password_check` is used.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass

from walkit.autorecovery.bookieio import BookieIO
from walkit.autorecovery.marks import DECOMMISSION, MISSING, NEW_DISK, now_ms
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.distribution import write_set_bookies
from walkit.core.messages import AddRequest, ReadRequest, Status
from walkit.core.metadata import CLOSED, LedgerMetadata, ledger_key
from walkit.errors import BadVersion, NoSuchKey, NotEnoughBookies, WalkitError
from walkit.placement import choose_replacement

log = logging.getLogger("walkit.autorecovery")

#: How many times one repair re-reads metadata after conflicts before it gives up for now.
MAX_ROUNDS = 20
#: Bytes of entries read or written per request (the batch shrinks for large entries).
BATCH_BYTES = 8 * 1024 * 1024


def first_kept(metadata: LedgerMetadata) -> int:
    """first_kept is the first entry a ledger still holds (an unbounded ledger drops its prefix)."""
    return getattr(metadata, "first_entry_id", 0) or 0


class RepairError(WalkitError):
    """RepairError says why a ledger could not be repaired now (the mark stays, with this reason)."""


@dataclass
class ReplicationStats:
    """ReplicationStats counts what a replicator did (exported as walkit_replication_* metrics)."""

    entries_copied: int = 0
    bytes_copied: int = 0
    fragments_replicated: int = 0
    ledgers_repaired: int = 0
    ledgers_recovered: int = 0
    failures: int = 0
    cas_conflicts: int = 0          # metadata rewrites that met a concurrent change and re-read
    remaining_entries: int = 0      # entries still to copy in the repair under way


@dataclass(frozen=True, slots=True)
class _Task:
    """_Task is one fragment position to repair: bookie at ensemble[position] of the fragment at `start`."""

    start: int                # the fragment's first entry id (its key in the metadata)
    first: int                # first entry to copy: `start`, or an unbounded ledger's first kept entry
    end: int                  # last entry of the fragment (below `first` when it holds none)
    position: int
    bookie: str
    in_place: bool


class Replicator:
    """Replicator repairs ledgers for a worker or a command (see the module doc).

    `client` is a walkit.Client of the cluster. `passwords` are the ledger passwords it may
    use (bytes). `open_grace_s` is how long after its mark an unclosed ledger's last fragment
    is left to its writer. `min_racks` is the placement constraint replacements must meet.
    """

    def __init__(self, client, *, passwords=(b"",), open_grace_s: float = 30.0, min_racks: int = 1,
                 batch_entries: int = 2000, io: BookieIO | None = None, rng: random.Random | None = None,
                 stats: ReplicationStats | None = None) -> None:
        self.client = client
        self.store = client.store
        self.passwords = [p.encode() if isinstance(p, str) else bytes(p) for p in passwords]
        self.open_grace_s = open_grace_s
        self.min_racks = min_racks
        self.batch_entries = batch_entries
        self.rng = rng or random.Random()
        self.stats = stats or ReplicationStats()
        self.io = io or BookieIO(lookup=self.client.registry.info)
        self._owns_io = io is None
        self.stopping = threading.Event()        # set by a stopping worker: copies end at the next batch

    def close(self) -> None:
        """close releases the sockets this replicator opened."""
        if self._owns_io:
            self.io.close()

    # -- one ledger -------------------------------------------------------------------------
    def repair(self, ledger_id: int, bookies: dict[str, str], marked_ms: int = 0, *,
               force_open: bool = False) -> dict[str, str]:
        """repair fixes the fragments of `ledger_id` that hold `bookies` ({address: reason}).

        It returns the bookies still to repair: those in the last fragment of an unclosed
        ledger within its grace period (none with `force_open`). RepairError says why nothing
        more could be done now.
        """
        for _ in range(MAX_ROUNDS):
            try:
                value, version = self.store.get(ledger_key(ledger_id))
            except NoSuchKey:
                return {}                        # deleted: nothing left to repair
            metadata = LedgerMetadata.from_bytes(value)
            targets = {b: r for b, r in bookies.items() if b in metadata.bookies}
            if not targets:
                return {}
            password = self._password(metadata)
            if metadata.state != CLOSED and any(b in metadata.current_ensemble for b in targets):
                if force_open or now_ms() - marked_ms >= self.open_grace_s * 1000:
                    log.info("ledger %d: its writer left %s in its last fragment past the grace period; "
                             "recovering it", ledger_id, ", ".join(b for b in targets if b in metadata.current_ensemble))
                    self.client.open_ledger(ledger_id, password=password, recover=True)
                    self.stats.ledgers_recovered += 1
                    continue
            outcome = self._repair_fragments(metadata, version, targets, password)
            if outcome is None:
                continue                           # the metadata changed under us: start over
            self.stats.ledgers_repaired += 1
            return outcome
        raise RepairError(f"ledger {ledger_id}: metadata kept changing during {MAX_ROUNDS} repair attempts")

    def _password(self, metadata: LedgerMetadata) -> bytes:
        if not metadata.password_check:
            return b""
        for password in self.passwords:
            if password_check(password) == metadata.password_check:
                return password
        raise RepairError(f"ledger {metadata.ledger_id}: none of the configured recovery passwords is its "
                          "password (set recovery_passwords / --recovery-password)")

    def _tasks(self, metadata: LedgerMetadata, targets: dict[str, str], live: dict) -> tuple[list[_Task], dict]:
        """_tasks lists the fragment positions to repair now, and the bookies left for later."""
        starts = metadata.fragment_starts
        tasks, later = [], {}
        for index, start in enumerate(starts):
            last_fragment = index == len(starts) - 1
            if last_fragment and metadata.state != CLOSED:
                later.update({b: targets[b] for b in metadata.ensembles[start] if b in targets})
                continue
            end = metadata.last_entry_id if last_fragment else starts[index + 1] - 1
            first = max(start, first_kept(metadata))
            for position, bookie in enumerate(metadata.ensembles[start]):
                if bookie not in targets:
                    continue
                info = live.get(bookie)
                in_place = (targets[bookie] in (MISSING, NEW_DISK) and info is not None and not info.draining)
                if in_place and targets[bookie] == NEW_DISK and info.disk and metadata.disk_of(start, bookie) == info.disk:
                    continue                       # the fragment records its new disk already
                tasks.append(_Task(start, first, end, position, bookie, in_place))
        return tasks, later

    def _repair_fragments(self, metadata: LedgerMetadata, version: int, targets: dict[str, str],
                          password: bytes) -> dict[str, str] | None:
        """_repair_fragments copies and rewrites; None means a conflict that needs a fresh start."""
        live = self.client.registry.live()
        tasks, later = self._tasks(metadata, targets, live)
        digest, key = Digest(metadata.digest_type, password), master_key(password)
        ensembles = {start: list(bookies) for start, bookies in metadata.ensembles.items()}
        disks = {start: list(metadata.disks.get(start, (0,) * metadata.ensemble_size)) for start in ensembles}
        changed: set[int] = set()
        racks = {a: info.rack for a, info in live.items()}
        self.stats.remaining_entries = sum(len(self._entries_of(metadata, t)) for t in tasks)
        for task in tasks:
            ensemble = ensembles[task.start]
            entry_ids = self._entries_of(metadata, task)
            if task.in_place:
                self._fill_in(metadata, ensemble, task, entry_ids, digest, key, live)
                if targets[task.bookie] == NEW_DISK and live[task.bookie].disk:
                    disks[task.start][task.position] = live[task.bookie].disk    # it holds them all now
                    changed.add(task.start)
                continue
            candidates = {a: info.rack for a, info in live.items()
                          if not info.read_only and not info.draining and a not in ensemble and a not in targets}
            try:
                target = choose_replacement(ensemble, task.position, candidates, metadata.write_quorum,
                                            racks=racks, min_racks=self.min_racks, rng=self.rng)
            except NotEnoughBookies as exc:
                raise RepairError(f"ledger {metadata.ledger_id}: {exc}") from None
            self._copy(metadata, ensemble, task, entry_ids, target, digest, key, live)
            ensemble[task.position] = target
            disks[task.start][task.position] = live[target].disk
            changed.add(task.start)
            self.stats.fragments_replicated += 1
        if changed and not self._rewrite(metadata, version, {s: tuple(ensembles[s]) for s in changed},
                                         {s: tuple(disks[s]) for s in changed}):
            return None
        return later

    def _entries_of(self, metadata: LedgerMetadata, task: _Task) -> list[int]:
        """_entries_of lists the entries of the task's fragment stored at its position."""
        size, quorum = metadata.ensemble_size, metadata.write_quorum
        return [e for e in range(task.first, task.end + 1) if (task.position - e) % size < quorum]

    # -- copying ----------------------------------------------------------------------------
    def _copy(self, metadata, ensemble, task: _Task, entry_ids: list[int], target: str, digest, key, live) -> None:
        """_copy reads `entry_ids` from surviving replicas and stores them on `target`, pipelined."""
        ledger_id = metadata.ledger_id
        old_alive = task.bookie in live
        pending_add = None
        batch = 1                   # the first batch finds the entries' size: later ones hold about BATCH_BYTES
        position = 0
        while position < len(entry_ids) or pending_add is not None:
            if self.stopping.is_set():
                raise RepairError(f"ledger {ledger_id}: the worker is stopping")
            chunk = entry_ids[position:position + batch]
            position += len(chunk)
            reads = self._plan_reads(metadata, ensemble, task, chunk, old_alive, live)
            requests = list(reads)
            if pending_add is not None:
                requests.append((target, pending_add))
            answers = self.io.exchange(requests)
            if pending_add is not None:
                self._check_added(answers[pending_add.txn], target, ledger_id)
                self.stats.entries_copied += len(pending_add.entries)
                self.stats.bytes_copied += sum(len(e.payload) for e in pending_add.entries)
                self.stats.remaining_entries = max(0, self.stats.remaining_entries - len(pending_add.entries))
                pending_add = None
            if not chunk:
                break
            found = self._collect(metadata, ensemble, task, chunk, reads, answers, digest, old_alive, live)
            entries = [found[e] for e in chunk]
            pending_add = AddRequest(txn=self.io.next_txn(), ledger_id=ledger_id, master_key=key,
                                     entries=entries, recovery=True, term=getattr(metadata, "term", 0))
            size = sum(len(e.payload) for e in entries) / max(1, len(entries))
            batch = max(1, min(self.batch_entries, int(BATCH_BYTES / max(size, 1))))

    def _sources(self, metadata, ensemble, task: _Task, entry_id: int, old_alive: bool, live) -> list[str]:
        """_sources lists the replicas of an entry to read from, best first."""
        members = [b for b in write_set_bookies(entry_id, ensemble, metadata.write_quorum)
                   if b != task.bookie and b in live]
        self.rng.shuffle(members)
        if old_alive and not task.in_place:
            members.insert(0, task.bookie)       # a bookie being decommissioned still serves reads
        return members

    def _plan_reads(self, metadata, ensemble, task, chunk, old_alive, live) -> list[tuple[str, ReadRequest]]:
        by_source: dict[str, list[int]] = {}
        for entry_id in chunk:
            sources = self._sources(metadata, ensemble, task, entry_id, old_alive, live)
            if sources:
                by_source.setdefault(sources[0], []).append(entry_id)
        return [(source, self.io.read_request(metadata.ledger_id, ids)) for source, ids in by_source.items()]

    def _collect(self, metadata, ensemble, task, chunk, reads, answers, digest, old_alive, live) -> dict:
        """_collect gathers verified entries of `chunk`, asking the other replicas for what is missing.

        Ids an answer did not look at (it reached its byte bound) are asked of the same replica
        again (BookieIO.reads) before any other replica is tried for them.
        """
        found, tried = {}, {}
        for source, request in reads:
            for entry_id in request.entry_ids:
                tried.setdefault(entry_id, set()).add(source)
        for _, _, response in self.io.reads(reads, answers=answers):
            self._take(response, found, digest)
        while len(found) < len(chunk):
            retry: dict[str, list[int]] = {}
            for entry_id in chunk:
                if entry_id in found:
                    continue
                sources = [s for s in self._sources(metadata, ensemble, task, entry_id, old_alive, live)
                           if s not in tried.setdefault(entry_id, set())]
                if not sources:
                    raise RepairError(f"ledger {metadata.ledger_id}: entry {entry_id} is on no live replica "
                                      f"(write set {', '.join(write_set_bookies(entry_id, ensemble, metadata.write_quorum))})")
                tried[entry_id].add(sources[0])
                retry.setdefault(sources[0], []).append(entry_id)
            requests = [(s, self.io.read_request(metadata.ledger_id, ids)) for s, ids in retry.items()]
            for _, _, response in self.io.reads(requests):
                self._take(response, found, digest)
        return found

    @staticmethod
    def _take(response, found: dict, digest: Digest) -> None:
        if response.status != Status.OK:
            return
        for entry in response.entries:
            if entry.entry_id not in found and digest.verify(entry):
                found[entry.entry_id] = entry

    @staticmethod
    def _check_added(response, target: str, ledger_id: int) -> None:
        if response.status != Status.OK:
            raise RepairError(f"ledger {ledger_id}: bookie {target} refused the copied entries: "
                              f"{Status(response.status).name} {response.message}")

    def _fill_in(self, metadata, ensemble, task: _Task, entry_ids: list[int], digest, key, live) -> None:
        """_fill_in copies back the entries a live bookie should hold but lacks."""
        held: set[int] = set()
        for start in range(0, len(entry_ids), self.batch_entries):
            chunk = entry_ids[start:start + self.batch_entries]
            read = (task.bookie, self.io.read_request(metadata.ledger_id, chunk))
            for _, _, response in self.io.reads([read]):          # in bounded answers, one at a time
                if response.status == Status.OK:
                    held.update(e.entry_id for e in response.entries if digest.verify(e))
                elif response.status != Status.NO_SUCH_LEDGER:
                    raise RepairError(f"ledger {metadata.ledger_id}: cannot check bookie {task.bookie}: "
                                      f"{Status(response.status).name} {response.message}")
        missing = [e for e in entry_ids if e not in held]
        if missing:
            log.info("ledger %d: copying %d missing entries back to %s", metadata.ledger_id, len(missing), task.bookie)
            self._copy(metadata, ensemble, task, missing, task.bookie, digest, key, live)
            self.stats.fragments_replicated += 1

    # -- metadata ---------------------------------------------------------------------------
    def _rewrite(self, read: LedgerMetadata, version: int, fragments: dict[int, tuple[str, ...]],
                 disks: dict[int, tuple[int, ...]]) -> bool:
        """_rewrite puts the new `fragments` (and their `disks`) into the ledger's metadata by CAS; False: start over.

        On a conflict the metadata is read again; if the fragments being replaced still hold
        what was copied from, the change is applied on top of the new metadata.
        """
        key = ledger_key(read.ledger_id)
        metadata = read
        for _ in range(MAX_ROUNDS):
            try:
                self.store.put(key, metadata.with_fragments(fragments, disks).to_bytes(), version)
                log.info("ledger %d: fragments %s now on %s", read.ledger_id, sorted(fragments),
                         "; ".join(",".join(b) for _, b in sorted(fragments.items())))
                return True
            except NoSuchKey:
                return True                       # deleted meanwhile: nothing to keep
            except BadVersion:
                self.stats.cas_conflicts += 1
                try:
                    value, version = self.store.get(key)
                except NoSuchKey:
                    return True
                metadata = LedgerMetadata.from_bytes(value)
                if any(metadata.ensembles.get(start) != read.ensembles[start]
                       or metadata.disks.get(start) != read.disks.get(start) for start in fragments):
                    return False                  # someone changed the same fragments: redo
                # Only final fragments were copied (see the module doc), so a writer's new
                # fragment or a close does not touch them: apply the change on top.
        return False
