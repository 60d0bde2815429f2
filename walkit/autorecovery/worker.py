"""walkit.autorecovery.worker takes under-replicated ledgers one at a time and repairs them.

Every bookie that runs auto-recovery runs one ReplicationWorker (BookKeeper's
ReplicationWorker). Each round it lists the marks (`underreplicated/`), and for each ledger in
random order it tries the ledger's lock, an ephemeral registration: if another worker holds
it the ledger is skipped; if this worker gets it, it reads the mark, lets the Replicator
repair the ledger, and settles the mark (deleted once nothing is left; otherwise it keeps the
bookies still waiting, for example in the last fragment of an open ledger within its grace
period). The lock goes when the worker releases it or its process dies (its session
expires), so a worker killed mid-copy only delays the ledger: another one starts it over.

A ledger that failed is retried after a back-off (doubling up to `max_backoff_s`); its mark
records the reason, which `walkit underreplicated` shows. Nothing runs while auto-recovery is
switched off (`walkit auditor disable`).
"""

from __future__ import annotations

import logging
import random
import threading
import time

from walkit.autorecovery.marks import UnderReplication
from walkit.autorecovery.replicator import RepairError, Replicator
from walkit.errors import WalkitError

log = logging.getLogger("walkit.autorecovery")

#: How often a ledger left to its writer (within the grace period) is looked at again, at most.
RECHECK_OPEN_S = 5.0


class ReplicationWorker:
    """ReplicationWorker repairs marked ledgers with `replicator`, named `worker_id` in its locks.

    `marks` is an UnderReplication over the worker's own metadata store (its locks live as
    long as that store's session). `only` limits it to marks naming these bookies (the
    `walkit recover` and `decommission` commands run a worker for one bookie, with
    `respect_switch` False: an operator's command runs while auto-recovery is switched off).
    """

    def __init__(self, marks: UnderReplication, replicator: Replicator, worker_id: str, *,
                 poll_s: float = 1.0, max_backoff_s: float = 30.0, only: set[str] | None = None,
                 respect_switch: bool = True, rng: random.Random | None = None) -> None:
        self.marks = marks
        self.replicator = replicator
        self.worker_id = worker_id
        self.poll_s = poll_s
        self.max_backoff_s = max_backoff_s
        self.only = only
        self.respect_switch = respect_switch
        self.rng = rng or random.Random()
        self._retry_at: dict[int, tuple[float, float]] = {}    # ledger -> (not before, back-off)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- rounds -------------------------------------------------------------------------------
    def run_once(self, force_open: bool = False) -> int:
        """run_once makes one pass over the marks; it returns how many ledgers it settled."""
        if self.respect_switch and not self.marks.enabled():
            return 0
        ledger_ids = self.marks.ledger_ids()
        self.rng.shuffle(ledger_ids)
        settled = 0
        now = time.monotonic()
        for ledger_id in ledger_ids:
            if self._stop.is_set():
                break
            retry = self._retry_at.get(ledger_id)
            if retry is not None and now < retry[0]:
                continue
            if self._repair(ledger_id, force_open):
                settled += 1
        return settled

    def _repair(self, ledger_id: int, force_open: bool) -> bool:
        if self.only is not None:                 # look before locking: most marks are not ours
            got = self.marks.get(ledger_id)
            if got is None or not set(got[0].bookies) & self.only:
                return False
        lock = self.marks.lock(ledger_id, self.worker_id)
        if lock is None:
            return False
        try:
            got = self.marks.get(ledger_id)
            if got is None:
                return False                       # settled by another worker meanwhile
            mark, version = got
            if self.only is not None and not (set(mark.bookies) & self.only):
                return False
            try:
                remaining = self.replicator.repair(ledger_id, mark.bookies, mark.marked_ms, force_open=force_open)
            except (RepairError, WalkitError) as exc:
                self.replicator.stats.failures += 1
                self._back_off(ledger_id)
                log.warning("worker %s: ledger %d not repaired now: %s", self.worker_id, ledger_id, exc)
                self.marks.settle(ledger_id, version, mark.bookies, error=str(exc))
                return False
            if remaining:
                # Left to an open ledger's writer: look again when its grace ends, or within
                # RECHECK_OPEN_S, since the writer may move on (and its old fragment be copied) sooner.
                due = mark.marked_ms / 1000 + self.replicator.open_grace_s - time.time()
                self._retry_at[ledger_id] = (time.monotonic() + max(self.poll_s, min(due, RECHECK_OPEN_S)),
                                             self.poll_s)
            else:
                self._retry_at.pop(ledger_id, None)
            if not self.marks.settle(ledger_id, version, remaining):
                return False                       # an auditor added a bookie: the next round sees it
            return not remaining
        finally:
            lock.close()

    def _back_off(self, ledger_id: int, first: float = 1.0) -> None:
        _, previous = self._retry_at.get(ledger_id, (0.0, first / 2))
        delay = min(self.max_backoff_s, previous * 2)
        self._retry_at[ledger_id] = (time.monotonic() + delay, delay)

    # -- thread -------------------------------------------------------------------------------
    def start(self) -> "ReplicationWorker":
        """start runs rounds every `poll_s` on a daemon thread until `stop()`."""
        self._thread = threading.Thread(target=self._run, name="walkit-replication-worker", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except WalkitError as exc:
                log.warning("worker %s: round failed: %s", self.worker_id, exc)
            except Exception:  # noqa: BLE001 - the worker must outlive a bug in one round
                log.exception("worker %s: round failed", self.worker_id)
            self._stop.wait(self.poll_s)

    def stop(self, timeout: float = 30.0) -> None:
        """stop ends the thread after the ledger in hand (its lock is released)."""
        self._stop.set()
        self.replicator.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
