"""Quorum arithmetic of walkit.core.distribution (docs/internals/protocol.md#write-sets)."""

from __future__ import annotations

import pytest

from walkit.core.distribution import (
    absent_quorum, ensemble_coverage, is_replicated, write_set, write_set_bookies, write_sets_of,
)

from .helpers import bookies

ENSEMBLE = bookies(4)   # B1..B4, the example with E=4, Qw=3 of docs/internals/protocol.md#write-sets

SEED_003_WRITE_SETS = {
    0: ("B1", "B2", "B3"),
    1: ("B2", "B3", "B4"),
    2: ("B3", "B4", "B1"),
    3: ("B4", "B1", "B2"),
    4: ("B1", "B2", "B3"),
    5: ("B2", "B3", "B4"),
}


@pytest.mark.parametrize("entry_id, expected", SEED_003_WRITE_SETS.items())
def test_write_set_bookies_follows_seed_003_example(entry_id, expected):
    assert write_set_bookies(entry_id, ENSEMBLE, 3) == expected


@pytest.mark.parametrize("entry_id, expected", SEED_003_WRITE_SETS.items())
def test_write_set_indices_name_the_same_bookies_as_write_set_bookies(entry_id, expected):
    assert tuple(ENSEMBLE[i] for i in write_set(entry_id, 4, 3)) == expected


def test_write_set_is_round_robin_from_entry_modulo_ensemble():
    assert write_set(0, 5, 2) == (0, 1)
    assert write_set(4, 5, 2) == (4, 0)
    assert write_set(7, 5, 3) == (2, 3, 4)


def test_write_set_with_full_write_quorum_holds_every_bookie():
    assert {frozenset(write_set(e, 3, 3)) for e in range(6)} == {frozenset({0, 1, 2})}


def test_write_sets_of_lists_e_write_sets_in_entry_order():
    assert write_sets_of(ENSEMBLE, 3) == [SEED_003_WRITE_SETS[e] for e in range(4)]


@pytest.mark.parametrize("ensemble_size, ack_quorum, expected", [
    (3, 2, 2), (3, 3, 1), (3, 1, 3), (4, 2, 3), (5, 3, 3), (1, 1, 1),
])
def test_ensemble_coverage_is_e_minus_qa_plus_one(ensemble_size, ack_quorum, expected):
    assert ensemble_coverage(ensemble_size, ack_quorum) == expected


@pytest.mark.parametrize("write_quorum, ack_quorum, expected", [
    (3, 2, 2), (3, 3, 1), (3, 1, 3), (2, 2, 1), (5, 3, 3), (1, 1, 1),
])
def test_absent_quorum_is_qw_minus_qa_plus_one(write_quorum, ack_quorum, expected):
    assert absent_quorum(write_quorum, ack_quorum) == expected


def test_is_replicated_needs_ack_quorum_acknowledgements():
    assert not is_replicated(1, 2)
    assert is_replicated(2, 2)
    assert is_replicated(3, 2)
