"""LedgerMetadata: quorum rules, fragments, state changes and encoding.

The rules: docs/internals/protocol.md#ledger-metadata.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from walkit.core.metadata import (
    CLOSED, IN_RECOVERY, OPEN, LedgerMetadata, check_quorums, ledger_id_of, ledger_key,
)
from walkit.errors import ConfigError

from .helpers import bookies, make_metadata

THREE_FRAGMENTS = {0: bookies(3), 5: ("B1", "B4", "B3"), 12: ("B5", "B4", "B3")}


@pytest.mark.parametrize("ensemble_size, write_quorum, ack_quorum", [
    (3, 2, 0),      # Qa zero
    (0, 0, 0),      # everything zero
    (3, 2, 3),      # Qa > Qw
    (2, 3, 2),      # Qw > E
    (3, 3, -1),     # negative
])
def test_check_quorums_error_names_all_three_values(ensemble_size, write_quorum, ack_quorum):
    with pytest.raises(ConfigError) as info:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
    message = str(info.value)
    assert f"ensemble={ensemble_size}" in message
    assert f"write_quorum={write_quorum}" in message
    assert f"ack_quorum={ack_quorum}" in message


@pytest.mark.parametrize("quorums, bad_name", [
    ((True, 1, 1), "ensemble"),
    ((3, True, 1), "write_quorum"),
    ((3, 2, False), "ack_quorum"),
    ((3, 2.0, 1), "write_quorum"),
    ((3, 2, "1"), "ack_quorum"),
])
def test_check_quorums_refuses_non_integers_naming_the_field(quorums, bad_name):
    with pytest.raises(ConfigError, match=bad_name):
        check_quorums(*quorums)


@pytest.mark.parametrize("quorums", [(1, 1, 1), (3, 3, 3), (3, 2, 2), (5, 3, 1)])
def test_check_quorums_accepts_e_ge_qw_ge_qa_ge_1(quorums):
    check_quorums(*quorums)


def test_metadata_construction_enforces_the_quorum_rule():
    with pytest.raises(ConfigError, match="ensemble=3, write_quorum=2, ack_quorum=3"):
        LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum=2, ack_quorum=3, ensembles={0: bookies(3)})


@pytest.mark.parametrize("ensembles", [
    {},                                   # no fragment
    {1: bookies(3)},                      # no fragment at entry 0
    {0: bookies(2)},                      # too few bookies
    {0: ("B1", "B1", "B2")},              # a bookie twice
])
def test_metadata_refuses_malformed_fragments(ensembles):
    with pytest.raises(ConfigError):
        LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles=ensembles)


def test_metadata_refuses_unknown_state():
    with pytest.raises(ConfigError, match="state"):
        make_metadata(state="DELETED")


@pytest.mark.parametrize("entry_id, expected", [
    (0, bookies(3)), (4, bookies(3)), (5, ("B1", "B4", "B3")), (11, ("B1", "B4", "B3")),
    (12, ("B5", "B4", "B3")), (1000, ("B5", "B4", "B3")), (-1, bookies(3)),
])
def test_ensemble_at_picks_the_fragment_holding_the_entry(entry_id, expected):
    assert make_metadata(fragments=THREE_FRAGMENTS).ensemble_at(entry_id) == expected


def test_fragment_queries_see_the_last_fragment():
    md = make_metadata(fragments=THREE_FRAGMENTS)
    assert md.fragment_starts == [0, 5, 12]
    assert md.last_fragment_start == 12
    assert md.current_ensemble == ("B5", "B4", "B3")
    assert md.bookies == {"B1", "B2", "B3", "B4", "B5"}


def test_with_fragment_adds_a_last_fragment_and_leaves_the_original_unchanged():
    md = make_metadata()
    changed = md.with_fragment(4, ("B1", "B4", "B3"))
    assert changed.ensembles == {0: bookies(3), 4: ("B1", "B4", "B3")}
    assert changed.current_ensemble == ("B1", "B4", "B3")
    assert md.ensembles == {0: bookies(3)}


def test_with_fragment_at_the_last_fragment_start_replaces_it():
    md = make_metadata().with_fragment(4, ("B1", "B4", "B3"))
    changed = md.with_fragment(4, ("B1", "B5", "B3"))
    assert changed.ensembles == {0: bookies(3), 4: ("B1", "B5", "B3")}


def test_with_fragment_at_entry_zero_replaces_the_first_fragment():
    changed = make_metadata().with_fragment(0, ("B4", "B2", "B3"))
    assert changed.ensembles == {0: ("B4", "B2", "B3")}


def test_with_fragment_before_the_last_fragment_is_refused():
    md = make_metadata().with_fragment(4, ("B1", "B4", "B3"))
    with pytest.raises(ValueError):
        md.with_fragment(3, ("B1", "B5", "B3"))


def test_in_recovery_changes_only_the_state():
    md = make_metadata(fragments=THREE_FRAGMENTS)
    recovering = md.in_recovery()
    assert recovering.state == IN_RECOVERY
    assert recovering.last_entry_id is None
    assert dataclasses.replace(recovering, state=OPEN) == md


def test_closed_sets_state_and_last_entry():
    closed = make_metadata().in_recovery().closed(41)
    assert (closed.state, closed.last_entry_id, closed.is_closed) == (CLOSED, 41, True)


def test_closed_empty_ledger_has_last_entry_minus_one():
    assert make_metadata().closed(-1).last_entry_id == -1


@pytest.mark.parametrize("state, last_entry_id", [(CLOSED, None), (OPEN, 3), (IN_RECOVERY, -1)])
def test_last_entry_is_set_exactly_when_closed(state, last_entry_id):
    with pytest.raises(ConfigError, match="last_entry_id"):
        make_metadata(state=state, last_entry_id=last_entry_id)


@pytest.mark.parametrize("md", [
    make_metadata(),
    make_metadata(5, 3, 2, fragments={0: bookies(5), 9: bookies(5, first=2)}).in_recovery(),
    dataclasses.replace(make_metadata(fragments=THREE_FRAGMENTS).closed(20), digest_type="hmac-sha256",
                        password_check="ab12", created_ms=1234, custom={"app": "kv", "x": ""}),
], ids=["open", "in-recovery", "closed-with-extras"])
def test_to_bytes_from_bytes_round_trip(md):
    assert LedgerMetadata.from_bytes(md.to_bytes()) == md


def test_to_bytes_is_deterministic():
    md = make_metadata(fragments=THREE_FRAGMENTS)
    assert md.to_bytes() == LedgerMetadata.from_bytes(md.to_bytes()).to_bytes()


def test_ledger_key_sorts_by_id_and_round_trips():
    assert ledger_key(9) < ledger_key(10)
    assert ledger_id_of(ledger_key(12345)) == 12345


@pytest.mark.parametrize("field, value", [("last_entry_id", "5"), ("ledger_id", "7"), ("term", 1.5),
                                          ("owner", 5), ("unbounded", "yes")])
def test_ledger_metadata_of_the_wrong_type_is_refused_where_it_is_read(field, value):
    # Metadata comes from a store others write (a principal's own ledgers in principal mode): a string where
    # a number belongs would otherwise fail later, in the auditor's arithmetic, and stop its audit.
    from walkit.core.metadata import LedgerMetadata
    doc = json.loads(LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2,
                                    ensembles={0: ("a", "b", "c")}, state="CLOSED", last_entry_id=4).to_bytes())
    doc[field] = value
    with pytest.raises(ConfigError, match="wrong type"):
        LedgerMetadata.from_bytes(json.dumps(doc).encode())
