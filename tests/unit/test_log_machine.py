"""LogMachine: the log writer's rules, one event at a time (docs/internals/protocol.md#logs)."""

from __future__ import annotations

import pytest

from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.digest import Digest
from walkit.core.log import LogMachine
from walkit.core.loglist import LogConfig, LogMetadata, LogSegment, Position
from walkit.core.messages import Status
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


def test_a_store_that_refuses_the_writer_fails_the_open_at_once_and_drops_the_ledger_made_for_it():
    # A refusal (MetadataNotAuthorized: this writer may not write the log) is not contention: trying again
    # would only be refused again, ten times, and then reported as another writer's doing.
    from walkit.errors import MetadataNotAuthorized
    log = machine()
    log.start()
    listed = LogMetadata(name=NAME, segments=(LogSegment(1, last_entry_id=4, entries=5),))
    commands = created(log, log.step(lev.LogMetadataRead(name=NAME, metadata=listed, version=7)), 10)
    only(commands, lev.WriteLogMetadata)
    refusal = MetadataNotAuthorized("logs/orders has no owner")
    commands = log.step(lev.LogMetadataConflict(name=NAME, metadata=None, refused=refusal))
    assert only(commands, ev.DeleteLedger).ledger_id == 10
    assert only(commands, lev.LogOpenFailed).error is refusal
    assert of_type(commands, lev.ReadLogMetadata) == [] and of_type(commands, ev.CreateLedger) == []


def test_a_refused_list_cas_of_an_open_log_fails_its_appends_with_the_refusal():
    from walkit.errors import MetadataNotAuthorized
    log, _ = opened()
    log.step(ev.AppendRequested(payloads=[b"a"]))
    commands = created(log, log.step(lev.RollRequested(token=2)), 11)
    refusal = MetadataNotAuthorized("revoked")
    commands = log.step(lev.LogMetadataConflict(name=NAME, metadata=None, refused=refusal))
    assert only(commands, lev.FailAppends).error is refusal and only(commands, lev.RollFailed).error is refusal


@pytest.mark.parametrize("attr", ["ROLL_WAITS_FOR_CLOSE", "RECOVER_EVERY_UNCLOSED"])
def test_the_rules_are_on(attr):
    assert getattr(LogMachine, attr) is True




_IO = (ev.SendAdds, ev.WriteMetadata, lev.WriteLogMetadata, ev.CreateLedger, ev.DeleteLedger)


class _Harness:
    """_Harness plays bookies and the metadata store for a LogMachine; its I/O waits until pumped.

    `pump(allow)` answers pending I/O that `allow` admits (acks every add, accepts every CAS,
    creates ledgers 11, 12, ...) until none is left; outcomes collect in `outcomes`.
    """

    def __init__(self, log: LogMachine, commands: list = ()) -> None:
        self.log = log
        self.pending: list = []
        self.outcomes: list = []
        self.versions: dict = {NAME: 1}
        self.next_ledger = 11
        self._take(list(commands))

    def step(self, event) -> None:
        self._take(self.log.step(event))

    def _take(self, commands: list) -> None:
        for command in commands:
            (self.pending if type(command) in _IO else self.outcomes).append(command)

    def pump(self, allow=lambda command: True) -> None:
        while True:
            ready = [c for c in self.pending if allow(c)]
            if not ready:
                return
            for command in ready:
                self.pending.remove(command)
                self._take(self._answer(command))

    def _answer(self, command) -> list:
        kind, log = type(command), self.log
        if kind is ev.SendAdds:
            return log.step(ev.AddsAcked(bookie=command.bookie, ledger_id=command.ledger_id,
                                         entry_ids=[e.entry_id for e in command.entries]))
        if kind is ev.WriteMetadata:
            ledger_id = command.metadata.ledger_id
            self.versions[ledger_id] = self.versions.get(ledger_id, 0) + 1
            return log.step(ev.MetadataWritten(metadata=command.metadata, version=self.versions[ledger_id]))
        if kind is lev.WriteLogMetadata:
            self.versions[NAME] += 1
            return log.step(lev.LogMetadataWritten(name=NAME, metadata=command.metadata, version=self.versions[NAME]))
        if kind is ev.CreateLedger:
            self.next_ledger += 1
            return log.step(ev.LedgerCreated(token=command.token, metadata=ledger(self.next_ledger - 1), version=0))
        return []                                       # DeleteLedger

    def acknowledged(self) -> list[tuple[int, int]]:
        """acknowledged lists the (ledger, entry) positions CompleteAppends gave, in order."""
        return [(c.ledger_id, e) for c in of_type(self.outcomes, lev.CompleteAppends)
                for e in range(c.first_entry_id, c.last_entry_id + 1)]


def _not_ledger(ledger_id: int):
    """_not_ledger admits every I/O but the adds and metadata writes of `ledger_id` (they stay unanswered)."""
    return lambda c: not (type(c) in (ev.SendAdds, ev.WriteMetadata)
                          and (getattr(c, "ledger_id", None) or c.metadata.ledger_id) == ledger_id)


def _roll_config() -> LogConfig:
    return LogConfig(ensemble=3, write_quorum=2, ack_quorum=2, roll_entries=1)


def test_a_close_that_arrives_while_a_roll_adds_its_ledger_to_the_list_closes_both_ledgers():
    # A CI hang (test_reader_overtaken_by_truncation_gets_log_truncated): close came while the roll's
    # CAS was in flight; the switch then left the new ledger open, and the close never finished.
    log, commands = opened(_roll_config())
    h = _Harness(log, commands)
    h.step(ev.AppendRequested(payloads=[b"a"]))
    h.step(ev.AppendRequested(payloads=[b"b"]))                 # the roll is due: b is held
    h.pump(lambda c: type(c) is ev.CreateLedger)               # ledger 11 created; its list CAS waits
    assert of_type(h.pending, lev.WriteLogMetadata)
    h.step(ev.CloseRequested())                                 # the roll is under way: close waits for it
    h.pump()
    assert log.state.value == "CLOSED", log.unclosed
    closed = only(h.outcomes, lev.LogClosed).metadata
    assert [s.ledger_id for s in closed.segments] == [10, 11] and all(s.is_closed for s in closed.segments)
    assert h.acknowledged() == [(10, 0), (11, 0)]


def test_a_ledger_closed_before_the_one_ahead_of_it_still_acknowledges_its_appends():
    # b (ledger 11) is confirmed but waits behind a (ledger 10); close closes 11 first. Its record
    # used to drop 11 from the writer's ledgers, so b was never acknowledged although durable.
    log, commands = opened()
    h = _Harness(log, commands)
    h.step(ev.AppendRequested(payloads=[b"a"]))                 # ledger 10: its adds stay unanswered
    h.step(lev.RollRequested(token=1))
    h.pump(_not_ledger(10))                                     # 11 created and listed; 10 closing waits for a
    assert only(h.outcomes, lev.RollCompleted).ledger_id == 11 and log.unclosed == [10, 11]
    h.step(ev.AppendRequested(payloads=[b"b"]))
    h.pump(lambda c: type(c) is ev.SendAdds and c.ledger_id == 11)
    assert h.acknowledged() == []                               # b is confirmed, behind a
    h.step(ev.CloseRequested())
    h.pump(_not_ledger(10))                                     # 11 closes and is recorded first
    h.pump()
    assert log.state.value == "CLOSED"
    assert h.acknowledged() == [(10, 0), (11, 0)]
    assert [s.ledger_id for s in only(h.outcomes, lev.LogClosed).metadata.segments] == [10, 11]


def test_a_close_during_the_roll_cas_acknowledges_appends_of_both_ledgers_whichever_closes_first():
    log, commands = opened(_roll_config())
    h = _Harness(log, commands)
    h.step(ev.AppendRequested(payloads=[b"a"]))                 # ledger 10: its adds stay unanswered
    h.step(ev.AppendRequested(payloads=[b"b"]))                 # the roll is due: b is held
    h.pump(lambda c: type(c) is ev.CreateLedger)
    h.step(ev.CloseRequested())
    h.pump(_not_ledger(10))                                     # the switch closes 10 and 11; 11 first
    h.pump()
    assert log.state.value == "CLOSED" and h.acknowledged() == [(10, 0), (11, 0)]


def test_appends_held_for_a_roll_when_close_comes_go_to_the_current_ledger():
    # c is held: a roll is due but waits for ledger 10's close. Close used to leave c in the
    # held list for good: the log closed and c was never written or answered.
    log, commands = opened(_roll_config())
    h = _Harness(log, commands)
    h.step(ev.AppendRequested(payloads=[b"a"]))                 # ledger 10: its adds stay unanswered
    h.step(ev.AppendRequested(payloads=[b"b"]))
    h.pump(_not_ledger(10))                                     # b in 11; 10 closing waits for a
    h.step(ev.AppendRequested(payloads=[b"c"]))                 # due again, but 10 is not closed: c is held
    assert log.unclosed == [10, 11] and of_type(h.pending, ev.CreateLedger) == []
    h.step(ev.CloseRequested())
    h.pump()
    assert log.state.value == "CLOSED"
    assert h.acknowledged() == [(10, 0), (11, 0), (11, 1)]
    assert only(h.outcomes, lev.LogClosed).metadata.segments[-1].last_entry_id == 1


def test_truncations_queued_or_in_flight_fail_with_the_writer():
    log, commands = opened(_roll_config())
    h = _Harness(log, commands)
    h.step(ev.AppendRequested(payloads=[b"a"]))
    h.step(ev.AppendRequested(payloads=[b"b"]))                 # the roll to 11
    h.pump(lambda c: type(c) is not lev.WriteLogMetadata)      # its list CAS waits
    h.step(lev.TruncateRequested(token=7, before=Position(11, 0)))   # queued behind the roll's CAS
    cas = only(h.pending, lev.WriteLogMetadata)
    h.pending.remove(cas)
    other = LogMetadata(name=NAME, segments=(LogSegment(10), LogSegment(12)))
    h.step(lev.LogMetadataConflict(name=NAME, metadata=other, version=9))   # another writer
    assert isinstance(only(h.outcomes, lev.TruncateFailed).error, LedgerFenced)
    assert only(h.outcomes, lev.TruncateFailed).token == 7

    log, commands = opened()
    h = _Harness(log, commands)
    h.step(ev.AppendRequested(payloads=[b"a"]))
    h.step(lev.RollRequested(token=1))
    h.pump()                                                    # 10 closed and recorded, 11 takes appends
    h.step(lev.TruncateRequested(token=8, before=Position(11, 0)))
    cas = only(h.pending, lev.WriteLogMetadata)                 # the truncation's own CAS
    h.pending.remove(cas)
    h.step(lev.LogMetadataConflict(name=NAME, metadata=other, version=9))
    assert [(c.token, type(c.error)) for c in of_type(h.outcomes, lev.TruncateFailed)] == [(8, LedgerFenced)]
    assert of_type(h.outcomes, lev.TruncateCompleted) == []


def test_a_roll_listed_after_the_writer_failed_starts_nothing():
    log, commands = opened(_roll_config())
    h = _Harness(log, commands)
    h.step(ev.AppendRequested(payloads=[b"a"]))
    h.step(ev.AppendRequested(payloads=[b"b"]))                 # the roll to 11: its list CAS waits
    h.pump(lambda c: type(c) is ev.CreateLedger)
    cas = only(h.pending, lev.WriteLogMetadata)
    fenced = ev.AddsRejected(bookie="B1", ledger_id=10, entry_ids=[0], status=Status.FENCED)
    h.step(fenced)                                              # ledger 10 fenced: the writer fails
    assert log.state.value == "FAILED" and of_type(h.outcomes, lev.FailAppends)
    late = log.step(lev.LogMetadataWritten(name=NAME, metadata=cas.metadata, version=5))
    assert late == []                                           # no failpoint, no adds to the new ledger


def test_only_the_first_open_of_a_log_is_its_first_writer():
    _, commands = opened()
    assert only(commands, lev.LogOpened).first_writer is True


@pytest.mark.parametrize("listed", [
    LogMetadata(name=NAME, segments=(LogSegment(1),)),                   # a writer's ledger, dropped as empty
    LogMetadata(name=NAME, truncated_to=4),                              # every ledger truncated away
], ids=["a-dropped-empty-ledger", "truncated-to-nothing"])
def test_an_open_after_another_writer_is_not_the_first_even_when_the_list_ends_up_with_its_ledger_alone(listed):
    log = machine()
    log.start()
    commands = log.step(lev.LogMetadataRead(name=NAME, metadata=listed, version=7))
    if listed.segments:
        commands = log.step(ev.LedgerMetadataRead(ledger_id=1, metadata=None, version=0))     # deleted: dropped
    commands = written(log, created(log, commands, 10), 8)
    opened_event = only(commands, lev.LogOpened)
    assert opened_event.metadata.ledger_ids == [10] and opened_event.first_writer is False


def test_a_truncation_past_the_end_of_a_closing_log_keeps_its_last_ledger():
    """The close records the ledger's end first; a truncation queued behind it finds the ledger closed, and
    still keeps it: an opened log's list is never empty again (the replica's first-writer rule)."""
    log, _ = opened()
    close = only(log.step(ev.CloseRequested()), ev.WriteMetadata)
    record = only(log.step(ev.MetadataWritten(metadata=close.metadata, version=1)), lev.WriteLogMetadata)
    assert log.step(lev.TruncateRequested(token=1, before=Position(10**6, 0))) == []      # queued behind the record
    commands = log.step(lev.LogMetadataWritten(name=NAME, metadata=record.metadata, version=2))
    assert not of_type(commands, lev.WriteLogMetadata) and not of_type(commands, ev.DeleteLedger)
    assert only(commands, lev.TruncateCompleted).ledger_ids == ()
    assert only(commands, lev.LogClosed).metadata.ledger_ids == [10]
