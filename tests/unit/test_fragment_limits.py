"""Fragment rotation settings reach the writer checked, and garbage collection trims where it is safe.

walkit.Client.create_ledger / reopen_ledger take the limits of an unbounded ledger's fragments
(walkit.core.writer, rotation); a log's roll settings become them for an unbounded log; a
bookie's garbage collection drops entries below the first one, never from the last fragment's
start on while the ledger is not closed (walkit.bookie.server).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import walkit
from walkit.bookie.server import BookieServer
from walkit.client.log import _rotation
from walkit.core.loglist import LogConfig
from walkit.core.metadata import LedgerMetadata
from walkit.core.writer import DEFAULT_FRAGMENT_MAX_BYTES
from walkit.errors import ConfigError
from walkit.plugins.storage.memory import MemoryStorage


@pytest.fixture
def client(tmp_path):
    with walkit.Client(f"sqlite:///{tmp_path}/meta.db") as client:
        yield client


@pytest.mark.parametrize("option, value", [("fragment_max_entries", -1), ("fragment_max_entries", 2.5),
                                           ("fragment_max_bytes", -4), ("fragment_max_bytes", True),
                                           ("fragment_max_age_s", -1), ("fragment_max_age_s", float("nan")),
                                           ("fragment_max_age_s", float("inf")), ("fragment_max_age_s", "1")])
def test_bad_fragment_limits_are_config_errors_before_anything_is_created(client, option, value):
    with pytest.raises(ConfigError, match=option):
        client.create_ledger(3, 3, 2, unbounded=True, **{option: value})
    with pytest.raises(ConfigError, match=option):
        client.reopen_ledger(99, **{option: value})
    assert client.list_ledgers() == []


@pytest.mark.parametrize("option", ["fragment_max_entries", "fragment_max_bytes", "fragment_max_age_s"])
def test_a_bounded_ledger_takes_no_fragment_limits(client, option):
    with pytest.raises(ConfigError, match="unbounded ledgers only"):
        client.create_ledger(3, 3, 2, **{option: 7})
    assert client.list_ledgers() == []


def test_an_unbounded_log_rotates_fragments_by_its_roll_settings():
    assert _rotation(LogConfig(unbounded=True)) == {"fragment_max_entries": 0,
                                                    "fragment_max_bytes": DEFAULT_FRAGMENT_MAX_BYTES,
                                                    "fragment_max_age_s": 0.0}
    assert _rotation(LogConfig(unbounded=True, roll_entries=10, roll_bytes=4096, roll_age_s=1.5)) == {
        "fragment_max_entries": 10, "fragment_max_bytes": 4096, "fragment_max_age_s": 1.5}


def _unbounded(state: str = "OPEN", first: int = 0) -> LedgerMetadata:
    metadata = LedgerMetadata(ledger_id=3, ensemble_size=3, write_quorum=3, ack_quorum=2,
                              ensembles={0: ("a", "b", "c"), 100: ("a", "b", "d"), 200: ("a", "b", "c")},
                              guaranteed_write_quorum=True, unbounded=True, term=2).truncated(first)
    return metadata.closed(250) if state == "CLOSED" else metadata


@pytest.mark.parametrize("state, first, point", [("OPEN", 150, 150), ("OPEN", 240, 200), ("IN_RECOVERY", 240, 200),
                                                 ("CLOSED", 240, 240), ("OPEN", 0, 0)])
def test_garbage_collection_trims_below_the_first_entry_but_not_into_the_last_fragment(state, first, point):
    metadata = _unbounded("CLOSED" if state == "CLOSED" else "OPEN", first)
    if state == "IN_RECOVERY":
        metadata = metadata.in_recovery("r")
    server = SimpleNamespace(storage=MemoryStorage())
    assert BookieServer._trim_point(server, metadata) == point


def test_garbage_collection_trims_nothing_without_delete_entries_or_of_a_bounded_ledger():
    assert BookieServer._trim_point(SimpleNamespace(storage=object()), _unbounded(first=150)) == 0
    bounded = LedgerMetadata(ledger_id=3, ensemble_size=3, write_quorum=3, ack_quorum=2, ensembles={0: ("a", "b", "c")})
    assert BookieServer._trim_point(SimpleNamespace(storage=MemoryStorage()), bounded) == 0
