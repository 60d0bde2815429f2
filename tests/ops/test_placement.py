"""Rack-aware placement (walkit.placement) and its use by the registry: pure, no processes."""

from __future__ import annotations

import random

import pytest

from walkit.errors import ConfigError, NotEnoughBookies
from walkit.placement import choose_ensemble, choose_replacement, spread_order, write_set_racks
from walkit.registry import BookieInfo, BookieRegistry

RACKS = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c"}


def test_every_write_set_of_an_e3_qw2_ensemble_spans_two_racks_on_racks_aabbc():
    for seed in range(500):
        ensemble = choose_ensemble(RACKS, 3, 2, rng=random.Random(seed))
        assert len(set(ensemble)) == 3
        for first in range(3):
            assert len({RACKS[ensemble[(first + i) % 3]] for i in range(2)}) == 2, ensemble


def test_ensembles_use_every_bookie_and_rack_combination_not_only_one():
    seen = {tuple(sorted(choose_ensemble(RACKS, 3, 2, rng=random.Random(seed)))) for seed in range(300)}
    assert len(seen) > 3          # still random among the good placements


def test_min_racks_that_the_racks_cannot_give_fails_clearly():
    with pytest.raises(NotEnoughBookies, match="racks"):
        choose_ensemble({"x": "a", "y": "a", "z": "b"}, 3, 2, min_racks=2)
    with pytest.raises(NotEnoughBookies, match="need 4 writable bookies"):
        choose_ensemble({"x": "a", "y": "b", "z": "c"}, 4, 2)
    with pytest.raises(ConfigError, match="min_racks"):
        choose_ensemble(RACKS, 3, 2, min_racks=3)


def test_best_effort_without_min_racks_when_racks_are_few():
    ensemble = choose_ensemble({"x": "a", "y": "a", "z": "b"}, 3, 2)
    assert write_set_racks(ensemble, {"x": "a", "y": "a", "z": "b"}, 2) == 1
    assert sorted(ensemble) == ["x", "y", "z"]


def test_all_bookies_on_the_default_rack_is_plain_random_choice():
    flat = {f"b{i}": "" for i in range(6)}
    chosen = {tuple(choose_ensemble(flat, 3, 2, rng=random.Random(seed))) for seed in range(50)}
    assert len(chosen) > 10


def test_replacement_keeps_both_racks_of_the_write_sets_through_the_position():
    racks = {"a1": "a", "b1": "b", "c1": "c", "a2": "a", "b2": "b", "c2": "c"}
    for seed in range(100):
        # c1 is lost: its write sets are (b1, c1) and (c1, a1); only a c bookie keeps both on 2 racks.
        chosen = choose_replacement(["a1", "b1", "c1"], 2, {"a2": "a", "b2": "b", "c2": "c"}, 2, racks=racks,
                                    rng=random.Random(seed))
        assert chosen == "c2"


def test_replacement_prefers_the_replaced_bookies_rack_on_ties():
    racks = {"a1": "a", "b1": "b", "c1": "c", "d1": "d", "a2": "a"}
    chosen = choose_replacement(["a1", "b1", "c1"], 0, {"d1": "d", "a2": "a"}, 1, racks=racks)
    assert chosen == "a2"


def test_replacement_that_cannot_meet_min_racks_fails():
    with pytest.raises(NotEnoughBookies):
        choose_replacement(["a1", "b1", "c1"], 2, {"a2": "a", "b2": "b"}, 2,
                           racks={"a1": "a", "b1": "b", "c1": "c"}, min_racks=2)
    with pytest.raises(NotEnoughBookies, match="no writable bookie"):
        choose_replacement(["a1", "b1", "c1"], 2, {"a1": "a"}, 2)


def test_spread_order_puts_different_racks_next_to_each_other():
    for seed in range(100):
        order = spread_order(RACKS, random.Random(seed))
        assert sorted(order) == sorted(RACKS)
        assert len({RACKS[b] for b in order[:3]}) == 3


def test_bookie_info_reads_registrations_of_older_and_newer_bookies():
    old = BookieInfo.from_bytes(b'{"address": "h:1", "read_only": false, "storage": "files:///x"}')
    assert old == BookieInfo("h:1", storage="files:///x")
    assert old.rack == "" and not old.draining and old.http == ""
    newer = BookieInfo.from_bytes(b'{"address": "h:2", "rack": "r", "draining": true, "future": 1}')
    assert newer.rack == "r" and newer.draining
    assert BookieInfo.from_bytes(BookieInfo("h:3", rack="z", http="h:9").to_bytes()) == BookieInfo("h:3", rack="z",
                                                                                                     http="h:9")


def test_registry_places_racks_and_skips_read_only_and_draining_bookies(tmp_path):
    from walkit.plugins import open_metadata
    store = open_metadata(f"sqlite://{tmp_path}/meta.db")
    sessions = []
    try:
        registry = BookieRegistry(store)
        for address, rack in RACKS.items():
            sessions.append(registry.register(BookieInfo(address, rack=rack)))
        sessions.append(registry.register(BookieInfo("ro", rack="d", read_only=True)))
        sessions.append(registry.register(BookieInfo("dr", rack="e", draining=True)))
        assert set(registry.writable()) == set(RACKS)
        for _ in range(50):
            ensemble = registry.choose(3, write_quorum=2, min_racks=2)
            assert write_set_racks(ensemble, RACKS, 2) == 2
        with pytest.raises(NotEnoughBookies, match="racks"):     # a1, a2, b1: some write set is all "a"
            registry.choose(3, exclude={"c1", "b2"}, write_quorum=2, min_racks=2)
    finally:
        for session in sessions:
            session.close()
        store.close()
