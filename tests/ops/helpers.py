"""Helpers of the operations tests: scraping /metrics, checking every replica of every entry."""

from __future__ import annotations

import threading
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import RawBookie
from walkit.core.distribution import write_set_bookies
from walkit.core.messages import Status

PASSWORD = b"pw"


def scrape(http_address: str) -> dict[str, float]:
    """scrape reads a /metrics page into {sample name: value} (labelled samples keep their labels)."""
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def placed_entries(metadata, last_entry_id: int) -> dict[str, list[int]]:
    """placed_entries maps each bookie to the entries 0..last the metadata says it stores."""
    placed: dict[str, list[int]] = {}
    for entry_id in range(last_entry_id + 1):
        for bookie in write_set_bookies(entry_id, metadata.ensemble_at(entry_id), metadata.write_quorum):
            placed.setdefault(bookie, []).append(entry_id)
    return placed


def missing_replicas(client, ledger_id: int, expected: dict[int, bytes], live: set[str], chunk: int = 2000) -> list:
    """missing_replicas reads every replica of every expected entry straight from its bookie.

    It returns (bookie, entry id, why) for each replica that is on a bookie not in `live`,
    absent, or not the acknowledged payload; an empty list means every entry is on its Qw
    live bookies.
    """
    metadata = client.ledger_metadata(ledger_id)
    problems = []
    for bookie, entry_ids in placed_entries(metadata, max(expected)).items():
        if bookie not in live:
            problems.extend((bookie, e, "bookie not live") for e in entry_ids)
            continue
        with RawBookie(bookie) as raw:
            for start in range(0, len(entry_ids), chunk):
                wanted = entry_ids[start:start + chunk]
                response = raw.read(ledger_id, wanted, timeout=30)
                got = {e.entry_id: e.payload for e in response.entries} if response.status == Status.OK else {}
                for entry_id in wanted:
                    if entry_id not in got:
                        problems.append((bookie, entry_id, f"absent ({Status(response.status).name})"))
                    elif got[entry_id] != expected[entry_id]:
                        problems.append((bookie, entry_id, "wrong payload"))
    return problems


def fragments_on(client, address: str) -> list[tuple[int, int]]:
    """fragments_on lists (ledger id, fragment start) of every fragment that names `address`."""
    found = []
    for ledger_id in client.list_ledgers():
        metadata = client.ledger_metadata(ledger_id)
        found.extend((ledger_id, start) for start in metadata.fragment_starts if address in metadata.ensembles[start])
    return found


def auditor_http(client) -> str | None:
    """auditor_http is the metrics address of the bookie elected auditor (None while nobody is)."""
    from walkit.autorecovery.auditor import ELECTION
    from walkit.election import LeaderElection
    leader = LeaderElection(client.store, ELECTION, "test-observer").leader()
    info = client.registry.info(leader) if leader else None
    return info.http if info is not None and info.http else None


class BackgroundWriter:
    """BackgroundWriter appends to a ledger from a thread until `stop()`, recording what was acked.

    `written` maps entry ids to payloads; `failures` holds what made it stop early.
    """

    def __init__(self, writer, prefix: bytes = b"entry", timeout: float = 60.0) -> None:
        self.writer = writer
        self.written: dict[int, bytes] = {}
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._prefix, self._timeout = prefix, timeout
        self._thread = threading.Thread(target=self._run, name="background-writer")
        self._thread.start()

    def _run(self) -> None:
        e = 0
        while not self._stop.is_set():
            payload = b"%s %d" % (self._prefix, e)
            try:
                self.written[self.writer.append(payload, timeout=self._timeout)] = payload
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.failures.append(exc)
                return
            e += 1

    def stop(self) -> None:
        """stop ends the thread after the append in flight."""
        self._stop.set()
        self._thread.join(self._timeout + 30)
