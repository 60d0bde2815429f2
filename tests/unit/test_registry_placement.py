"""The client shell's placement of ledgers the core creates or repairs (walkit.registry.placed)."""

from __future__ import annotations

import pytest

from walkit.placement import write_set_racks
from walkit.plugins import open_metadata
from walkit.registry import BookieInfo, BookieRegistry

RACKS = {"b1:1": "a", "b2:1": "a", "b3:1": "b", "b4:1": "b", "b5:1": "c"}


@pytest.fixture
def registry(tmp_path):
    store = open_metadata(f"sqlite://{tmp_path}/metadata.db")
    registry = BookieRegistry(store)
    sessions = [registry.register(BookieInfo(address=a, rack=r)) for a, r in RACKS.items()]
    yield registry
    for session in sessions:
        session.close()
    store.close()


def test_ledgers_the_core_creates_get_rack_aware_ensembles_first(registry):
    for _ in range(20):
        listed = registry.placed("create", 3, 2)
        assert sorted(listed) == sorted(RACKS)
        assert write_set_racks(listed[:3], RACKS, 2) == 2          # every write set on two racks


def test_replacements_keep_each_write_set_on_two_racks(registry):
    ensemble = ("b1:1", "b3:1", "b5:1")                            # racks a, b, c
    for _ in range(20):
        listed = registry.placed("replace", ensemble, ("b3:1",), 2)
        replaced = ("b1:1", listed[0], "b5:1")
        assert listed[0] not in ensemble and write_set_racks(replaced, RACKS, 2) == 2
        assert RACKS[listed[0]] == "b"                              # the replaced bookie's rack when it can


def test_without_arguments_it_lists_every_writable_bookie(registry):
    assert sorted(registry.placed()) == sorted(RACKS)
