"""The client shell's placement of ledgers the core creates or repairs (walkit.registry.placed)."""

from __future__ import annotations

import pytest

from walkit.errors import NotEnoughBookies
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


def test_too_few_writable_bookies_names_every_registered_one_and_why_it_cannot_be_chosen(tmp_path):
    store = open_metadata(f"sqlite://{tmp_path}/metadata.db")
    registry = BookieRegistry(store)
    sessions = [registry.register(info) for info in (BookieInfo(address="b1:1"),
                                                    BookieInfo(address="b2:1", read_only=True),
                                                    BookieInfo(address="b3:1", read_only=True, draining=True))]
    try:
        with pytest.raises(NotEnoughBookies) as created:
            registry.placed("create", 3, 2)
        assert str(created.value) == ("need 3 writable bookies, 1 available; "
                                      "registered: b1:1, b2:1 (read-only), b3:1 (draining)")
        with pytest.raises(NotEnoughBookies) as chosen:
            registry.choose(1, exclude={"b1:1"})
        assert str(chosen.value) == ("need 1 writable bookies, 0 available; "
                                     "registered: b1:1 (excluded), b2:1 (read-only), b3:1 (draining)")
        for session in sessions:
            session.close()
        with pytest.raises(NotEnoughBookies, match=r"0 available; no bookie is registered$"):
            registry.placed("create", 3, 2)
    finally:
        for session in sessions:
            session.close()
        store.close()
