"""walkit.autorecovery.daemon runs an auditor candidate and a replication worker in one process.

Bookies run it by default (`walkit bookie`, unless `--no-autorecovery`); `walkit
autorecovery` runs it on its own, as BookKeeper's `bookkeeper autorecovery` does. Its metrics
come from `AutoRecovery.collector` (walkit.metrics).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from walkit.autorecovery.auditor import Auditor
from walkit.autorecovery.bookieio import BookieIO
from walkit.autorecovery.marks import UnderReplication
from walkit.autorecovery.replicator import ReplicationStats, Replicator
from walkit.autorecovery.worker import ReplicationWorker
from walkit.errors import ConfigError
from walkit.deletions import DEFAULT_RETENTION_S
from walkit.metrics import Collector
from walkit.registry import BookieRegistry

log = logging.getLogger("walkit.autorecovery")


@dataclass
class RecoveryConfig:
    """RecoveryConfig tunes auto-recovery (the bookie config keys of the same names, see
    docs/operations/configuration.md).

    - `lost_bookie_delay_s`: a bookie unregistered this long is lost (BookKeeper's
      lostBookieRecoveryDelay); a restart within it costs no copying;
    - `open_grace_s`: how long an unclosed ledger's writer may keep a lost bookie in its last
      fragment before the ledger is recovered (openLedgerRereplicationGracePeriod);
    - `audit_rate`, `audit_page`: the auditor's metadata reads per second, and per page;
    - `periodic_check_s`: seconds between checks of every ledger (0: never); `verify_fraction`:
      share of each bookie's entries the check reads besides the first and last;
    - `passwords`: ledger passwords workers may use (bookieRecoveryPasswd);
    - `min_racks`: racks every write set must keep spanning after a replacement;
    - `tick_s`, `gauge_interval_s`, `worker_poll_s`: pacing of the auditor and the worker;
    - `deletion_marker_retention_s`: the auditor deletes ledger deletion markers older than
      this (walkit.deletions), once an hour; a bookie down longer keeps such ledgers' data;
    - `auditor`, `worker`: which of the two this process runs.
    """

    lost_bookie_delay_s: float = 60.0
    open_grace_s: float = 30.0
    audit_rate: float = 500.0
    audit_page: int = 100
    periodic_check_s: float = 86400.0
    verify_fraction: float = 0.0
    passwords: tuple[str, ...] = ("",)
    min_racks: int = 1
    tick_s: float = 1.0
    gauge_interval_s: float = 5.0
    worker_poll_s: float = 1.0
    deletion_marker_retention_s: float = DEFAULT_RETENTION_S
    auditor: bool = True
    worker: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        """validate raises ConfigError for values auto-recovery cannot run with."""
        checks = [("lost_bookie_delay_s", self.lost_bookie_delay_s >= 0), ("open_grace_s", self.open_grace_s >= 0),
                  ("audit_rate", self.audit_rate > 0), ("audit_page", self.audit_page > 0),
                  ("periodic_check_s", self.periodic_check_s >= 0), ("verify_fraction", 0 <= self.verify_fraction <= 1),
                  ("min_racks", self.min_racks >= 1), ("tick_s", self.tick_s > 0),
                  ("gauge_interval_s", self.gauge_interval_s > 0), ("worker_poll_s", self.worker_poll_s > 0),
                  ("deletion_marker_retention_s", self.deletion_marker_retention_s > 0)]
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"auto-recovery: {name} out of range: {getattr(self, name)!r}")


class AutoRecovery:
    """AutoRecovery is the auditor candidate and the replication worker of one process.

    `metadata` is a metadata URI: it opens stores of its own (the auditor's session carries
    its leadership; the worker's carries its locks). `name` identifies the process (a bookie
    address) in elections and locks.
    """

    def __init__(self, metadata: str, name: str, config: RecoveryConfig | None = None, *,
                 key: str | None = None) -> None:
        from walkit.client.api import Client
        from walkit.plugins import open_metadata
        self.config = config or RecoveryConfig()
        self.config.validate()
        self.name = name
        self.stats = ReplicationStats()
        self._stores = []
        self.auditor: Auditor | None = None
        self.worker: ReplicationWorker | None = None
        self.client = None
        self._ios: list[BookieIO] = []
        try:
            if self.config.worker:
                store = self._open(open_metadata, metadata)
                self.client = Client(store, key=key)
                self.replicator = Replicator(self.client, passwords=self.config.passwords,
                                             open_grace_s=self.config.open_grace_s, min_racks=self.config.min_racks,
                                             stats=self.stats)
                self.worker = ReplicationWorker(UnderReplication(store), self.replicator, name,
                                                poll_s=self.config.worker_poll_s)
            if self.config.auditor:
                store = self._open(open_metadata, metadata)
                io = BookieIO(key=key, lookup=BookieRegistry(store).info)
                self._ios.append(io)
                self.auditor = Auditor(store, name, self.config, io=io)
        except BaseException:
            self.close()
            raise
        self.collector = self._collector()

    def _open(self, open_metadata, metadata: str):
        store = open_metadata(metadata)
        self._stores.append(store)
        return store

    def start(self) -> "AutoRecovery":
        """start runs the auditor candidate and the worker on daemon threads."""
        if self.auditor is not None:
            self.auditor.start()
        if self.worker is not None:
            self.worker.start()
        log.info("auto-recovery running in %s (auditor %s, worker %s, lost bookie delay %g s)", self.name,
                 self.auditor is not None, self.worker is not None, self.config.lost_bookie_delay_s)
        return self

    def close(self) -> None:
        """close stops both, releases locks and leadership, and closes the stores."""
        for part in (self.worker, self.auditor):
            if part is not None:
                try:
                    part.stop()
                except Exception as exc:  # noqa: BLE001 - stop as much as possible
                    log.warning("stopping auto-recovery: %s", exc)
        if self.worker is not None:
            self.replicator.close()
        if self.client is not None:
            self.client.close()
        for io in self._ios:
            io.close()
        for store in self._stores:
            try:
                store.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("closing a metadata store: %s", exc)
        self._stores.clear()
        self._ios.clear()

    def _collector(self) -> Collector:
        c, stats, auditor = Collector(), self.stats, self.auditor
        c.gauge("walkit_autorecovery_auditor", "1 while this process is the elected auditor",
                lambda: int(auditor is not None and auditor.is_leader))
        if auditor is not None:
            c.gauge("walkit_underreplicated_ledgers", "Ledgers marked under-replicated (exported by the auditor)",
                    lambda: auditor.underreplicated_ledgers if auditor.is_leader else None)
            c.gauge("walkit_underreplicated_entries", "Entries the marked ledgers' missing replicas held",
                    lambda: auditor.underreplicated_entries if auditor.is_leader else None)
            c.gauge("walkit_underreplicated_bytes", "Estimated bytes of those entries (one sampled entry per ledger)",
                    lambda: auditor.underreplicated_bytes if auditor.is_leader else None)
            c.gauge("walkit_lost_bookies", "Bookies gone and not yet audited (within the lost bookie delay)",
                    lambda: len(auditor.lost) if auditor.is_leader else None)
            c.counter("walkit_audit_metadata_reads", "Metadata reads made by the auditor",
                      lambda: auditor.metadata_reads)
            c.counter("walkit_audits", "Audits of lost bookies", lambda: auditor.audits)
            c.counter("walkit_audit_checks", "Periodic checks of every ledger", lambda: auditor.checks)
        c.counter("walkit_replication_entries_copied", "Entries copied to new or lacking bookies",
                  lambda: stats.entries_copied)
        c.counter("walkit_replication_bytes_copied", "Payload bytes copied", lambda: stats.bytes_copied)
        c.counter("walkit_replication_fragments", "Fragments repaired", lambda: stats.fragments_replicated)
        c.counter("walkit_replication_ledgers", "Ledgers repaired", lambda: stats.ledgers_repaired)
        c.counter("walkit_replication_ledgers_recovered",
                  "Unclosed ledgers recovered after the grace period", lambda: stats.ledgers_recovered)
        c.counter("walkit_replication_failures", "Repairs that failed (retried later)", lambda: stats.failures)
        c.counter("walkit_replication_cas_conflicts", "Metadata rewrites that met a concurrent change and re-read",
                  lambda: stats.cas_conflicts)
        c.gauge("walkit_replication_remaining_entries", "Entries left to copy in the repair under way",
                lambda: stats.remaining_entries)
        return c


def random_name() -> str:
    """random_name names a process that has no address (a standalone auto-recovery daemon)."""
    return f"autorecovery-{random.getrandbits(32):08x}"
