"""LogMachine: the log writer's rules, one event at a time (seed 000 "Ledgers to logs"; DESIGN.md §6)."""

from __future__ import annotations

import pytest

from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.digest import Digest
from walkit.core.log import LogMachine
from walkit.core.loglist import LogConfig, LogMetadata, LogSegment, Position
from walkit.core.metadata import LedgerMetadata
from walkit.errors import LedgerFenced

from .helpers import MASTER_KEY, bookies, of_type, only

NAME = "orders"


def machine(config: LogConfig | None = None, cls=LogMachine) -> LogMachine:
    return cls(NAME, master_key=MASTER_KEY, password_check="", digest_for=lambda kind: Digest(kind, b""),
               config=config or LogConfig(ensemble=3, write_quorum=2, ack_quorum=2))


def ledger(ledger_id: int, state: str = "OPEN") -> LedgerMetadata:
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=2, ack_quorum=2,
                          ensembles={0: bookies(3)}, state=state, last_entry_id=-1 if state == "CLOSED" else None)


def created(log: LogMachine, commands: list, ledger_id: int) -> list:
    request = only(commands, ev.CreateLedger)
    return log.step(ev.LedgerCreated(token=request.token, metadata=ledger(ledger_id), version=0))


def written(log: LogMachine, commands: list, version: int) -> list:
    request = only(commands, lev.WriteLogMetadata)
    return log.step(lev.LogMetadataWritten(name=NAME, metadata=request.metadata, version=version))


def opened(config: LogConfig | None = None, ledger_id: int = 10) -> tuple[LogMachine, list]:
    """opened runs a new log's open to the end: it returns the machine and its last commands."""
    log = machine(config)
    assert log.start() == [lev.ReadLogMetadata(name=NAME)]
    create = only(log.step(lev.LogMetadataRead(name=NAME, metadata=None)), lev.CreateLogMetadata)
    commands = log.step(lev.LogMetadataWritten(name=NAME, metadata=create.metadata, version=0))
    commands = created(log, commands, ledger_id)
    assert of_type(commands, ev.Failpoint) == [ev.Failpoint(name="log.open.after_create")]
    return log, written(log, commands, 1)


def ack(log: LogMachine, ledger_id: int, *entry_ids: int) -> list:
    out: list = []
    for bookie in bookies(3):
        out += log.step(ev.AddsAcked(bookie=bookie, ledger_id=ledger_id, entry_ids=list(entry_ids)))
    return out


def test_no_append_is_taken_before_the_list_cas_succeeded():
    log = machine()
    log.start()
    refused = only(log.step(ev.AppendRequested(payloads=[b"early"])), lev.RefuseAppends)
    assert refused.count == 1
    log, commands = opened()
    assert only(commands, lev.LogOpened).metadata.ledger_ids == [10]
    assert of_type(log.step(ev.AppendRequested(payloads=[b"now"])), ev.SendAdds)


def test_open_recovers_every_unclosed_ledger_of_the_list():
    log = machine()
    log.start()
    listed = LogMetadata(name=NAME, segments=(LogSegment(1, last_entry_id=4, entries=5), LogSegment(2), LogSegment(3)))
    commands = log.step(lev.LogMetadataRead(name=NAME, metadata=listed, version=7))
    assert commands == [ev.ReadLedgerMetadata(ledger_id=2), ev.ReadLedgerMetadata(ledger_id=3)]
    assert of_type(log.step(ev.LedgerMetadataRead(ledger_id=2, metadata=ledger(2), version=0)), ev.WriteMetadata)


def test_appends_made_once_a_roll_is_due_wait_for_the_switch():
    log, _ = opened(LogConfig(ensemble=3, write_quorum=2, ack_quorum=2, roll_entries=2))
    log.step(ev.AppendRequested(payloads=[b"a", b"b"]))
    commands = log.step(ev.AppendRequested(payloads=[b"c"]))      # the roll is due: c is held
    assert of_type(commands, ev.SendAdds) == [] and of_type(commands, ev.CreateLedger)
    commands = written(log, created(log, commands, 11), 2)
    assert only(commands, ev.Failpoint).name == "log.roll.after_cas"
    sends = of_type(commands, ev.SendAdds)
    assert {s.ledger_id for s in sends} == {11} and [e.payload for e in sends[0].entries] == [b"c"]


def test_a_roll_waits_until_the_previous_ledger_is_closed():
    log, _ = opened(LogConfig(ensemble=3, write_quorum=2, ack_quorum=2, roll_entries=1))
    log.step(ev.AppendRequested(payloads=[b"a"]))
    commands = log.step(ev.AppendRequested(payloads=[b"b"]))      # roll 10 -> 11
    commands = written(log, created(log, commands, 11), 2)          # 10 is closing: "a" is not acked yet
    commands = log.step(ev.AppendRequested(payloads=[b"c"]))      # due again, but 10 is not closed
    assert of_type(commands, ev.CreateLedger) == [] and of_type(commands, ev.SendAdds) == []
    assert log.unclosed == [10, 11]


def test_acknowledgements_follow_log_order_across_a_roll():
    log, _ = opened(LogConfig(ensemble=3, write_quorum=2, ack_quorum=2, roll_entries=1))
    log.step(ev.AppendRequested(payloads=[b"a"]))
    commands = log.step(ev.AppendRequested(payloads=[b"b"]))
    written(log, created(log, commands, 11), 2)
    assert of_type(ack(log, 11, 0), lev.CompleteAppends) == []       # b waits for a
    assert of_type(ack(log, 10, 0), lev.CompleteAppends) == [
        lev.CompleteAppends(ledger_id=10, first_entry_id=0, last_entry_id=0),
        lev.CompleteAppends(ledger_id=11, first_entry_id=0, last_entry_id=0)]


def test_a_list_cas_that_finds_another_version_fences_the_writer():
    log, _ = opened()
    log.step(ev.AppendRequested(payloads=[b"a"]))
    commands = log.step(lev.TruncateRequested(token=1, before=Position(10, 0)))
    assert commands == [lev.TruncateCompleted(token=1, ledger_ids=())]   # nothing ends before ledger 10
    commands = log.step(lev.RollRequested(token=2))
    commands = created(log, commands, 11)
    other = LogMetadata(name=NAME, segments=(LogSegment(10, last_entry_id=0, entries=1), LogSegment(12)))
    commands = log.step(lev.LogMetadataConflict(name=NAME, metadata=other, version=9))
    assert isinstance(only(commands, lev.FailAppends).error, LedgerFenced)
    assert isinstance(only(commands, lev.RollFailed).error, LedgerFenced)


@pytest.mark.parametrize("attr", ["ROLL_WAITS_FOR_CLOSE", "RECOVER_EVERY_UNCLOSED"])
def test_the_rules_are_on(attr):
    assert getattr(LogMachine, attr) is True



def _answer(log: LogMachine, commands: list, versions: dict, outcomes: list) -> list:
    """_answer plays bookies and metadata for one round: it acks every add and accepts every CAS.

    It returns the commands those answers produced; the rest (outcomes) go to `outcomes`.
    """
    out: list = []
    for command in commands:
        kind = type(command)
        if kind is ev.SendAdds:
            out += log.step(ev.AddsAcked(bookie=command.bookie, ledger_id=command.ledger_id,
                                         entry_ids=[e.entry_id for e in command.entries]))
        elif kind is ev.WriteMetadata:
            ledger_id = command.metadata.ledger_id
            versions[ledger_id] = versions.get(ledger_id, 0) + 1
            out += log.step(ev.MetadataWritten(metadata=command.metadata, version=versions[ledger_id]))
        elif kind is lev.WriteLogMetadata:
            versions[NAME] = versions.get(NAME, 1) + 1
            out += log.step(lev.LogMetadataWritten(name=NAME, metadata=command.metadata, version=versions[NAME]))
        else:
            outcomes.append(command)
    return out


def test_a_close_that_arrives_while_a_roll_adds_its_ledger_to_the_list_closes_both_ledgers():
    # A CI hang (test_reader_overtaken_by_truncation_gets_log_truncated): close came while the roll's
    # CAS was in flight; the switch then left the new ledger open, and the close never finished.
    log, _ = opened(LogConfig(ensemble=3, write_quorum=2, ack_quorum=2, roll_entries=1))
    sends = of_type(log.step(ev.AppendRequested(payloads=[b"a"])), ev.SendAdds)
    commands = created(log, log.step(ev.AppendRequested(payloads=[b"b"])), 11)   # b is held; the roll CASes
    cas = only(commands, lev.WriteLogMetadata)
    assert log.step(ev.CloseRequested()) == []          # the roll is under way: close waits for it
    versions: dict = {}
    outcomes: list = []
    commands = [cas, *sends]
    for _ in range(20):
        if not commands:
            break
        commands = _answer(log, commands, versions, outcomes)
    assert log.state.value == "CLOSED", log.unclosed
    closed = only(outcomes, lev.LogClosed).metadata
    assert [s.ledger_id for s in closed.segments] == [10, 11] and all(s.is_closed for s in closed.segments)
    assert [(c.ledger_id, c.first_entry_id, c.last_entry_id) for c in of_type(outcomes, lev.CompleteAppends)] == [
        (10, 0, 0), (11, 0, 0)]
