"""walkit.autorecovery.auditor finds lost bookies and marks the ledgers that need their data back.

One auditor leads at a time, elected through the metadata store (walkit.election, election
"auditor"); every bookie running auto-recovery is a candidate. The leader:

- notices lost bookies: it remembers every bookie it has seen registered under
  ``autorecovery/bookies/<address>``, and when one is no longer registered it records since
  when (persisted, so a new auditor after a failover keeps the clock). Once a bookie has been
  gone for `lost_bookie_delay_s` (a restart within it is not a loss), the auditor pages
  through the ledgers and marks every ledger with a fragment on that bookie
  (walkit.autorecovery.marks), then forgets the bookie;
- runs a periodic check every `periodic_check_s`: it pages through every ledger, marks
  fragments on bookies that are not registered and were never seen (lost before any auditor
  ran), and reads a sample of each fragment's entries from each of its bookies (the first
  and last entry each holds, plus `verify_fraction` of the rest): a live bookie lacking an
  entry its write sets give it is marked "missing", and workers copy the entries back; one
  that answers from another disk than a fragment records is marked "new-disk" (its storage
  was replaced), and workers copy its entries back and record the new disk;
- keeps the gauges of under-replicated ledgers, entries and bytes from the marks;
- forgets ledger deletion markers older than `deletion_marker_retention_s`, once an hour.

Throttling (the complaint about auditors that scan too much): all the auditor's metadata reads
go through one token bucket of `audit_rate` reads per second, so a scan of a million ledgers
never stalls the store; ledgers are listed once per scan and read in pages of `audit_page`,
with leadership and the stop flag checked between pages. Watching for lost bookies costs one
listing of the registrations per `tick_s`.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from walkit import deletions
from walkit.autorecovery.bookieio import BookieIO
from walkit.autorecovery.marks import LOST, MISSING, NEW_DISK, UnderReplication, now_ms
from walkit.autorecovery.replicator import first_kept
from walkit.core.distribution import write_set_bookies
from walkit.core.messages import MAX_READ_IDS, Status
from walkit.core.metadata import CLOSED, LEDGER_PREFIX, LedgerMetadata, ledger_id_of, ledger_key
from walkit.deletions import DEFAULT_RETENTION_S
from walkit.election import LeaderElection
from walkit.errors import MetadataError, MetadataNotAuthorized, NoSuchKey, Timeout, WalkitError
from walkit.registry import BOOKIES_PREFIX

log = logging.getLogger("walkit.autorecovery")

ELECTION = "auditor"
#: How often the auditor forgets old ledger deletion markers (walkit.deletions).
PRUNE_INTERVAL_S = 3600.0
#: How long one campaign of a standby auditor lasts before it starts another (it wakes on the watch).
CAMPAIGN_S = 3600.0


class Throttle:
    """Throttle lets `rate` operations per second through (a token bucket one second deep)."""

    def __init__(self, rate: float, stop: threading.Event) -> None:
        self.rate = rate
        self._stop = stop
        self._tokens = rate
        self._last = time.monotonic()

    def take(self) -> None:
        """take waits for a token (or returns at once when stopping)."""
        while True:
            now = time.monotonic()
            self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            if self._stop.wait((1 - self._tokens) / self.rate):
                return


def final_fragments(metadata: LedgerMetadata):
    """final_fragments yields (start, end, ensemble) of the fragments whose entries no longer change.

    Those are every fragment of a CLOSED ledger and all but the last of another; `end` is
    below `start` for a fragment without entries. The range of an unbounded ledger's fragment
    starts at its first kept entry (the prefix before it was truncated).
    """
    starts = metadata.fragment_starts
    kept = first_kept(metadata)
    for index, start in enumerate(starts):
        if index == len(starts) - 1:
            if metadata.state != CLOSED:
                return
            end = metadata.last_entry_id
        else:
            end = starts[index + 1] - 1
        yield max(start, kept), end, metadata.ensembles[start]


def entries_on(start: int, end: int, position: int, ensemble_size: int, write_quorum: int) -> int:
    """entries_on counts the entries of [start, end] whose write set includes ensemble `position`."""
    if end < start:
        return 0
    total = 0
    for i in range(write_quorum):
        residue = (position - i) % ensemble_size
        total += (end - residue) // ensemble_size - (start - 1 - residue) // ensemble_size
    return total


def first_held(start: int, end: int, position: int, ensemble_size: int, write_quorum: int) -> int | None:
    """first_held is the first entry of [start, end] stored at ensemble `position` (None if none)."""
    for entry_id in range(start, min(end, start + ensemble_size - 1) + 1):
        if (position - entry_id) % ensemble_size < write_quorum:
            return entry_id
    return None


def last_held(start: int, end: int, position: int, ensemble_size: int, write_quorum: int) -> int | None:
    """last_held is the last entry of [start, end] stored at ensemble `position` (None if none)."""
    for entry_id in range(end, max(start, end - ensemble_size + 1) - 1, -1):
        if (position - entry_id) % ensemble_size < write_quorum:
            return entry_id
    return None


class Auditor:
    """Auditor is one candidate for the auditor's job; it audits while it leads (see the module doc).

    `store` is a metadata store of its own (its session carries the leadership). `config` is
    a walkit.autorecovery.RecoveryConfig. `candidate` names this process (a bookie address).
    """

    def __init__(self, store, candidate: str, config, *, io: BookieIO | None = None,
                 rng: random.Random | None = None) -> None:
        self.store = store
        self.candidate = candidate
        self.config = config
        self.marks = UnderReplication(store)
        self.rng = rng or random.Random()
        self._stop = threading.Event()
        self._wake = threading.Event()                 # set to make a waiting campaign look now
        self._lost_leadership = threading.Event()
        self.election = LeaderElection(store, ELECTION, candidate, on_lost=self._lost_leadership.set)
        self.io = io
        self.throttle = Throttle(config.audit_rate, self._stop)
        self.underreplicated_ledgers: int | None = None
        self.underreplicated_entries: int | None = None
        self.underreplicated_bytes: int | None = None
        self.lost: dict[str, int] = {}            # lost bookies (not yet audited) -> since, ms
        self.audits = 0
        self.checks = 0
        self.marked = 0
        self._reads = 0
        self._thread: threading.Thread | None = None
        self._next_gauges = 0.0
        self._next_check = 0.0
        self._next_prune = 0.0

    @property
    def is_leader(self) -> bool:
        """is_leader tells whether this candidate is the auditor now."""
        return self.election.is_leader

    @property
    def metadata_reads(self) -> int:
        """metadata_reads counts every metadata read this auditor made (the cost of auditing)."""
        return self._reads + self.marks.reads

    # -- thread -------------------------------------------------------------------------------
    def start(self) -> "Auditor":
        """start campaigns, and audits while leading, on a daemon thread until `stop()`."""
        self._thread = threading.Thread(target=self._run, name="walkit-auditor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """stop ends the thread and resigns the leadership."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.election.resign()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # one campaign waits on the election's watch (and looks again every 30 s) until it leads or
                # the auditor stops: a standby auditor costs no metadata requests while nothing changes
                self.election.campaign(timeout=CAMPAIGN_S, wake=self._wake, give_up=self._stop.is_set)
            except Timeout:
                continue
            except WalkitError as exc:
                log.warning("auditor candidate %s: campaign failed: %s", self.candidate, exc)
                self._stop.wait(self.config.tick_s)
                continue
            self._lost_leadership.clear()
            log.info("%s is the auditor (epoch %s)", self.candidate, self.election.epoch)
            try:
                self._lead()
            except Exception:  # noqa: BLE001 - give the job up rather than audit wrongly
                log.exception("auditor %s failed; resigning", self.candidate)
                self._stop.wait(self.config.tick_s)
            finally:
                self.election.resign()
                self.underreplicated_ledgers = self.underreplicated_entries = self.underreplicated_bytes = None

    def _leading(self) -> bool:
        return not self._stop.is_set() and not self._lost_leadership.is_set() and self.election.is_leader

    # -- the job ------------------------------------------------------------------------------
    def _lead(self) -> None:
        known = self.marks.known_bookies()
        self._next_check = time.monotonic() + self.config.periodic_check_s
        self._next_gauges = 0.0
        published = None
        while self._leading():
            try:
                enabled = self.marks.enabled()
                self._reads += 1
                live = set(self.store.children(BOOKIES_PREFIX))
                self._track(known, live)
                if enabled:
                    due = {a for a, since in self.lost.items()
                           if now_ms() - since >= self.config.lost_bookie_delay_s * 1000}
                    if due:
                        self.audit(due)
                        for address in due:
                            self.marks.forget(address)
                            self.marks.end_decommission(address)     # a drained bookie that stopped
                            known.pop(address, None)
                            self.lost.pop(address, None)
                    if self.config.periodic_check_s > 0 and time.monotonic() >= self._next_check:
                        self.check_all(live, known)
                        self._next_check = time.monotonic() + self.config.periodic_check_s
                if time.monotonic() >= self._next_prune:
                    self._next_prune = time.monotonic() + PRUNE_INTERVAL_S
                    retention_ms = int(getattr(self.config, "deletion_marker_retention_s", DEFAULT_RETENTION_S) * 1000)
                    pruned = deletions.prune(self.store, now_ms() - retention_ms)
                    if pruned:
                        log.info("auditor: forgot %d ledger deletion markers older than the retention", pruned)
                self.refresh_gauges()
                status = self._status(enabled)
                if status != published:
                    self.marks.publish_status({**status, "published_ms": now_ms()})
                    published = status
            except MetadataError as exc:
                log.warning("auditor: metadata unavailable, trying again: %s", exc)
            self._stop.wait(self.config.tick_s)

    def _track(self, known: dict[str, int | None], live: set[str]) -> None:
        """_track records bookies seen alive and bookies that went away (since when)."""
        for address in live:
            if address not in known or known[address] is not None:
                self.marks.set_known(address, None)
                known[address] = None
                self.lost.pop(address, None)
        for address, since in list(known.items()):
            if address in live:
                continue
            if since is None:
                since = now_ms()
                self.marks.set_known(address, since)
                known[address] = since
                log.warning("bookie %s is not registered; its ledgers are marked in %g s unless it comes back",
                            address, self.config.lost_bookie_delay_s)
            self.lost[address] = since

    def _status(self, enabled: bool) -> dict:
        return {"auditor": self.candidate, "epoch": self.election.epoch, "enabled": enabled,
                "lost": dict(sorted(self.lost.items())), "audits": self.audits, "checks": self.checks,
                "marked": self.marked, "lost_bookie_delay_s": self.config.lost_bookie_delay_s,
                "periodic_check_s": self.config.periodic_check_s, "underreplicated_ledgers": self.underreplicated_ledgers}

    def _ledgers(self):
        """_ledgers yields (ledger id, metadata) of every ledger, one throttled read each."""
        self._reads += 1
        names = self.store.children(LEDGER_PREFIX.rstrip("/"))
        page = max(1, self.config.audit_page)
        for first in range(0, len(names), page):
            if not self._leading():
                return
            for name in names[first:first + page]:
                if not (len(name) == 20 and name.isascii() and name.isdigit()):
                    continue                         # not a key ledger_key writes (ZooKeeper's principals may make any)
                self.throttle.take()
                ledger_id = ledger_id_of(name)
                self._reads += 1
                try:
                    value, _ = self.store.get(ledger_key(ledger_id))
                except NoSuchKey:
                    continue                         # deleted since the listing
                except MetadataNotAuthorized as exc:
                    log.warning("audit: ledger %d is shut to the auditor, not checked: %s", ledger_id, exc)
                    continue
                try:
                    metadata = LedgerMetadata.from_bytes(value)
                except (WalkitError, ValueError, TypeError, KeyError) as exc:
                    log.warning("audit: ledger %d holds no ledger metadata, not checked: %s", ledger_id, exc)
                    continue
                yield ledger_id, metadata

    def audit(self, lost: set[str]) -> int:
        """audit marks every ledger with a fragment on a `lost` bookie; it returns how many it marked."""
        log.warning("auditing lost bookies %s", ", ".join(sorted(lost)))
        marked = 0
        for ledger_id, metadata in self._ledgers():
            hits = {b: LOST for b in lost if b in metadata.bookies}
            if hits:
                try:
                    marked += self._mark(ledger_id, metadata, hits)
                except MetadataError:
                    raise
                except Exception as exc:  # noqa: BLE001 - one ledger's odd metadata must not stop the others' audit
                    log.warning("audit: ledger %d not marked: %s: %s", ledger_id, type(exc).__name__, exc)
        if not self._leading():
            raise MetadataError("leadership lost during the audit")
        self.audits += 1
        self.marked += marked
        self._next_gauges = 0.0
        log.warning("audit of %s marked %d ledgers", ", ".join(sorted(lost)), marked)
        return marked

    def _mark(self, ledger_id: int, metadata: LedgerMetadata, hits: dict[str, str]) -> int:
        entries, sample = 0, None
        for start, end, ensemble in final_fragments(metadata):
            for position, bookie in enumerate(ensemble):
                if bookie in hits:
                    count = entries_on(start, end, position, metadata.ensemble_size, metadata.write_quorum)
                    entries += count
                    if count and sample is None:
                        sample = (start, end, ensemble, position)
        size = self._sample_size(metadata, *sample) * entries if sample is not None else 0
        return 1 if self.marks.mark(ledger_id, hits, entries=entries, size=size) else 0

    def _sample_size(self, metadata: LedgerMetadata, start: int, end: int, ensemble, position: int) -> int:
        """_sample_size is the payload size of one entry the lost bookie held, read from a replica."""
        if self.io is None:
            return 0
        entry_id = first_held(start, end, position, metadata.ensemble_size, metadata.write_quorum)
        for source in write_set_bookies(entry_id, ensemble, metadata.write_quorum):
            if source == ensemble[position]:
                continue
            response = self.io.read(source, metadata.ledger_id, [entry_id], timeout=2.0)
            if response.status == Status.OK and response.entries:
                return len(response.entries[0].payload)
        return 0

    # -- the periodic check -------------------------------------------------------------------
    def check_all(self, live: set[str], known: dict[str, int | None]) -> int:
        """check_all verifies every final fragment's bookies (see the module doc); it returns marks made."""
        marked = 0
        for ledger_id, metadata in self._ledgers():
            hits = self._check(metadata, live, known)
            if hits:
                marked += self._mark(ledger_id, metadata, hits)
        self.checks += 1
        self.marked += marked
        self._next_gauges = 0.0
        return marked

    def _check(self, metadata: LedgerMetadata, live: set[str], known: dict) -> dict[str, str]:
        hits: dict[str, str] = {}
        wanted: dict[str, set[int]] = {}
        size, quorum = metadata.ensemble_size, metadata.write_quorum
        for start, end, ensemble in final_fragments(metadata):
            for position, bookie in enumerate(ensemble):
                if bookie not in live:
                    if bookie not in known:          # never seen by an auditor: lost before we ran
                        hits[bookie] = LOST
                    continue
                first = first_held(start, end, position, size, quorum)
                if first is None:
                    continue
                sample = {first, last_held(start, end, position, size, quorum)}
                for _ in range(int(entries_on(start, end, position, size, quorum) * self.config.verify_fraction)):
                    sample.add(first_held(self.rng.randint(first, end), end, position, size, quorum)
                               or last_held(start, end, position, size, quorum))
                wanted.setdefault(bookie, set()).update(sample)
        if wanted and self.io is not None:
            # At most MAX_READ_IDS ids a request; answers come in bounded parts (BP-62), and an id an
            # answer did not look at is asked again, never taken for one the bookie lacks.
            requests = [(b, self.io.read_request(metadata.ledger_id, ids[i:i + MAX_READ_IDS]))
                        for b, ids in ((b, sorted(ids)) for b, ids in wanted.items())
                        for i in range(0, len(ids), MAX_READ_IDS)]
            lacking: dict[str, list[int]] = {}
            for bookie, request, response in self.io.reads(requests, timeout=5.0):
                if response.status == Status.UNREACHABLE or hits.get(bookie) == NEW_DISK:
                    continue                         # down right now: the lost-bookie path decides
                if not all(metadata.answer_counts(e, bookie, response.disk) for e in request.entry_ids):
                    log.warning("ledger %d: bookie %s serves from disk %x, not the disk its fragments record",
                                metadata.ledger_id, bookie, response.disk)
                    hits[bookie] = NEW_DISK
                    continue
                got = {e.entry_id for e in response.entries}
                answered = self.io.looked_at(request, response) if response.status == Status.OK else request.entry_ids
                lacking.setdefault(bookie, []).extend(e for e in answered if e not in got)
            for bookie, ids in lacking.items():
                if ids and hits.get(bookie) != NEW_DISK:
                    log.warning("ledger %d: bookie %s lacks entries it should hold (%s)", metadata.ledger_id,
                                bookie, sorted(ids)[:5])
                    hits.setdefault(bookie, MISSING)
        return hits

    # -- gauges -------------------------------------------------------------------------------
    def refresh_gauges(self) -> None:
        """refresh_gauges recounts the marked ledgers (one listing), and their entries and bytes
        (one read per mark, throttled) every `gauge_interval_s` or after an audit or check."""
        ledger_ids = self.marks.ledger_ids()
        self.underreplicated_ledgers = len(ledger_ids)
        if not ledger_ids:
            self.underreplicated_entries = self.underreplicated_bytes = 0
            return
        if time.monotonic() < self._next_gauges:
            return
        self._next_gauges = time.monotonic() + self.config.gauge_interval_s
        entries = size = 0
        for ledger_id in ledger_ids:
            self.throttle.take()
            got = self.marks.get(ledger_id)
            if got is not None:
                entries += got[0].entries
                size += got[0].bytes
        self.underreplicated_entries, self.underreplicated_bytes = entries, size
