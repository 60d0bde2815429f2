"""The checker catches a broken protocol rule: machines broken on purpose lose data or break the chain.

Each test flips one rule in a LedgerRecovery or LogMachine subclass, searches seeds with a
configuration that provokes the bug, and asserts that the checker reports it; the correct
machine passes the same seeds.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.log import LogMachine
from walkit.core.logreader import LogReader
from walkit.core.reader import TailReader
from walkit.core.recovery import LedgerRecovery
from walkit.core.writer import LedgerWriter
from walkit.testing.sim import InvariantViolation, LogSimConfig, LogSimulation, SimConfig, Simulation
from walkit.testing.sim.unbounded import UnboundedSimulation


class RecoveryWithoutFencedReads(LedgerRecovery):
    """Recovery reads without the fence flag (BookKeeper issue 2614)."""

    FENCE_RECOVERY_READS = False


class RecoveryAbsentOnOneNoSuchEntry(LedgerRecovery):
    """An entry counted absent on a single NO_SUCH_ENTRY instead of QC = (Qw - Qa) + 1."""

    def absent_votes_needed(self) -> int:
        return 1


class RecoveryCountingEveryDisk(LedgerRecovery):
    """A bookie restarted on an emptied disk counts: its NO_SUCH_ENTRY proves entries absent."""

    CHECK_DISKS = False


class RecoveryTakingUnreadForAbsent(LedgerRecovery):
    """Ids a byte-bounded answer did not look at (EntriesRead.unread) count as NO_SUCH_ENTRY votes (BP-62)."""

    UNREAD_IS_UNANSWERED = False


# One writer streaming a few entries while a recovery starts; fence requests get lost and links
# have different speeds, so an unfenced bookie can answer NO_SUCH_ENTRY and then take an add.
ISSUE_2614 = SimConfig(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2, entries=3, append_gap_ms=30,
                       drop_rate=0.15, duplicate_rate=0.0, max_delay_ms=10, bookie_crashes=0,
                       writer_crash_rate=0.0, writer_close_rate=0.0, recoverers=1, recovery_window_ms=80,
                       fault_window_ms=300)
# Entries on Qa=2 of Qw=3 bookies; recovery starts while adds are in flight.
SINGLE_VOTE = SimConfig(bookies=4, ensemble=3, write_quorum=3, ack_quorum=2, entries=40, drop_rate=0.05,
                        max_delay_ms=30, bookie_crashes=0, writer_crash_rate=0.0, writer_close_rate=0.0,
                        recoverers=2, fault_window_ms=800)


# E3/Qw2/Qa2 (one NO_SUCH_ENTRY proves absence); a bookie of the ensemble restarts on an empty
# disk while the writer streams; the writer crashes; recovery runs after the disk came back.
EMPTIED_DISK = SimConfig(bookies=4, ensemble=3, write_quorum=2, ack_quorum=2, entries=40, drop_rate=0.0,
                         max_delay_ms=3, bookie_crashes=0, wiped_bookies=1, writer_crash_rate=1.0,
                         writer_close_rate=0.0, recoverers=1, recovery_window_ms=0, fault_window_ms=800)


# Every bookie answers a read with one entry (read_bytes=1): a recovery reading ahead gets all but
# the first id of each request back unread; the writer crashes with entries in flight.
ONE_ENTRY_ANSWERS = SimConfig(bookies=4, ensemble=3, write_quorum=3, ack_quorum=2, entries=30, drop_rate=0.02,
                              max_delay_ms=12, bookie_crashes=0, writer_crash_rate=1.0, writer_close_rate=0.0,
                              recoverers=1, fault_window_ms=800, read_bytes=1)


def first_violation(config: SimConfig, recovery_cls, seeds: range) -> InvariantViolation | None:
    for seed in seeds:
        try:
            Simulation(seed, config, recovery_cls=recovery_cls).run()
        except InvariantViolation as violation:
            return violation
    return None


@pytest.mark.parametrize("broken, config, seeds", [
    (RecoveryWithoutFencedReads, ISSUE_2614, range(20000)),
    (RecoveryAbsentOnOneNoSuchEntry, SINGLE_VOTE, range(2000)),
    (RecoveryCountingEveryDisk, EMPTIED_DISK, range(2000)),
    (RecoveryTakingUnreadForAbsent, ONE_ENTRY_ANSWERS, range(300)),
], ids=["recovery-reads-without-fence-flag", "absent-on-one-no-such-entry", "counts-an-emptied-disk",
        "takes-unread-ids-for-absent"])
def test_checker_catches_a_broken_rule(broken, config, seeds) -> None:
    violation = first_violation(config, broken, seeds)
    assert violation is not None, f"{broken.__name__} lost no data in {len(seeds)} seeds"
    assert "was acknowledged but the ledger closed at" in violation.message
    # The correct recovery survives the very run that broke the faulty one.
    Simulation(violation.seed, config, recovery_cls=LedgerRecovery).run()


@pytest.mark.parametrize("config", [ISSUE_2614, SINGLE_VOTE, EMPTIED_DISK, ONE_ENTRY_ANSWERS],
                         ids=["issue-2614-config", "single-vote-config", "emptied-disk-config",
                              "one-entry-answers-config"])
def test_correct_recovery_passes_the_provoking_configurations(config, request) -> None:
    """The correct recovery loses nothing in the configurations made to break the faulty ones: a
    third of --seeds seeds (333 in CI; a long run with --seeds 20000 runs 6,666)."""
    seeds = request.config.getoption("--seeds") // 3
    assert first_violation(config, LedgerRecovery, range(seeds)) is None


# -- log rules (docs/internals/protocol.md#log-invariants) -----------------------------------
class RollWithoutWaitingForTheClose(LogMachine):
    """A roll starts while the previous ledger is still closing (three unclosed ledgers can follow)."""

    ROLL_WAITS_FOR_CLOSE = False


class OpenRecoveringOnlyTheLastLedger(LogMachine):
    """Opening fences and recovers only the last ledger of the list, not every unclosed one."""

    RECOVER_EVERY_UNCLOSED = False


# Rolls after every record, slow links so closes lag behind, writers handing over and crashing.
ROLL_RACE = LogSimConfig(bookies=4, ensemble=3, write_quorum=3, ack_quorum=2, roll_entries=1, writers=3,
                         appends=12, append_gap_ms=3, rolls=0, truncations=0, followers=1, drop_rate=0.02,
                         max_delay_ms=25, metadata_fault_rate=0.0, session_losses=0, bookie_crashes=1,
                         writer_crash_rate=0.6, failpoint_crash_rate=0.3, follower_crash_rate=0.0)


def first_log_violation(config: LogSimConfig, writer_cls, seeds: range) -> InvariantViolation | None:
    for seed in seeds:
        try:
            LogSimulation(seed, config, writer_cls=writer_cls).run()
        except InvariantViolation as violation:
            return violation
    return None


@pytest.mark.parametrize("broken", [RollWithoutWaitingForTheClose, OpenRecoveringOnlyTheLastLedger],
                         ids=["roll-without-waiting-for-the-close", "open-recovering-only-the-last-ledger"])
def test_checker_catches_a_broken_log_rule(broken):
    violation = first_log_violation(ROLL_RACE, broken, range(3000))
    assert violation is not None, f"{broken.__name__} broke nothing in 3000 seeds"
    assert "not closed" in violation.message or "acknowledged" in violation.message, violation.message
    # The correct writer survives the very run that broke the faulty one.
    LogSimulation(violation.seed, ROLL_RACE).run()


def test_correct_log_writer_passes_the_provoking_configuration():
    assert first_log_violation(ROLL_RACE, LogMachine, range(300)) is None


class TailTrustingWhatABookieHolds(TailReader):
    """A tailing read delivers the entry a bookie returned whether or not the answer's LAC confirms it."""

    DELIVER_ONLY_CONFIRMED = False


class ReaderTrustingWhatABookieHolds(LogReader):
    TAIL_READER = TailTrustingWhatABookieHolds


def test_checker_catches_a_follower_that_delivers_an_unconfirmed_entry():
    # The hard draw (CI's): writers crash mid-add, so bookies hold entries that recovery drops.
    for seed in range(300):
        try:
            LogSimulation(seed, reader_cls=ReaderTrustingWhatABookieHolds, hard=True).run()
        except InvariantViolation as caught:
            message = caught.message
            break
    else:
        pytest.fail("a follower delivering unconfirmed entries broke nothing in 300 seeds")
    assert "gap-free slice" in message or "LogTruncated" in message, message
    LogSimulation(seed, hard=True).run()      # the correct reader survives the very run that broke the faulty one


class WriterSilentOnCloseAfterFailing(LogMachine):
    """A writer that fails (fenced by the next one, say) never answers the close it was asked for."""

    def _fail(self, error, opening=False):
        return [c for c in super()._fail(error, opening) if type(c) is not lev.LogCloseFailed]


class WriterSilentWhenAddsFail(LedgerWriter):
    """A ledger writer that never tells the application its adds failed (fenced by a later term, say)."""

    def step(self, event):
        return [c for c in super().step(event) if type(c) is not ev.FailAdds]


def first_violations(run, seeds: range, count: int = 3) -> list[InvariantViolation]:
    """first_violations runs `run(seed)` over `seeds` and returns the first `count` violations it raised."""
    violations = []
    for seed in seeds:
        try:
            run(seed)
        except InvariantViolation as violation:
            violations.append(violation)
            if len(violations) == count:
                break
    return violations


# Writers still running at the end must have answered every request: the log scenario keeps some
# earlier writers when the faults stop and asks them to close (often as the last writer fences
# them); in the unbounded battle, earlier writers run on as later terms take over.
SILENT_WRITERS = [
    (lambda seed: LogSimulation(seed, writer_cls=WriterSilentOnCloseAfterFailing), LogSimulation,
     "kept running when the faults stopped", range(300)),
    (lambda seed: UnboundedSimulation(seed, writer_cls=WriterSilentWhenAddsFail), UnboundedSimulation,
     "never answered its appends", range(100)),
]


@pytest.mark.parametrize("broken,correct,message,seeds", SILENT_WRITERS,
                         ids=["log-writer-silent-on-a-failed-close", "unbounded-writer-silent-on-failed-adds"])
def test_checker_catches_a_writer_that_leaves_requests_unanswered(broken, correct, message, seeds):
    violations = first_violations(lambda seed: broken(seed).run(), seeds)
    assert len(violations) == 3, f"{len(violations)} of {len(seeds)} seeds caught the silent writer"
    for violation in violations:
        assert message in violation.message, violation.message
        correct(violation.seed).run()           # the correct writer survives the same runs


# -- guaranteed write quorum (Vanlightly's ProtocolWithGuaranteedWriteQuorum) -----------------------
class WriterChangingEnsembleAtTheLac(LedgerWriter):
    """Ensemble changes start at LAC + 1 and pin nothing, as without guaranteed write quorum."""

    def _fragment_start(self) -> int:
        return self.last_add_confirmed + 1

    def _pinned(self, bookie: str) -> bool:
        return False


class RecoveryDoneAtAckQuorum(LedgerRecovery):
    """Recovery counts a write-back done at Qa, as without guaranteed write quorum."""

    def __init__(self, metadata, *args, **kwargs) -> None:
        super().__init__(metadata, *args, **kwargs)
        self._quorum = metadata.ack_quorum


# Qw=3 over Qa=2 with dropped messages: bookies time out while entries between LAFR and LAC wait.
GWQ_WRITER = SimConfig(bookies=5, ensemble=3, write_quorum=3, ack_quorum=2, entries=60, drop_rate=0.1,
                       append_gap_ms=10, max_delay_ms=30, bookie_crashes=1, lost_bookies=1,
                       writer_crash_rate=0.0, writer_close_rate=1.0, recoverers=1, fault_window_ms=800,
                       guaranteed_write_quorum=True)
GWQ_RECOVERY = replace(GWQ_WRITER, writer_close_rate=0.0, recoverers=2)


@pytest.mark.parametrize("config, broken", [
    (GWQ_WRITER, {"writer_cls": WriterChangingEnsembleAtTheLac}),
    (GWQ_RECOVERY, {"recovery_cls": RecoveryDoneAtAckQuorum}),
], ids=["ensemble-change-at-the-lac", "recovery-done-at-ack-quorum"])
def test_checker_catches_a_broken_guaranteed_write_quorum_rule(config, broken):
    violation = None
    for seed in range(300):
        try:
            Simulation(seed, config, **broken).run()
        except InvariantViolation as found:
            violation = found
            break
    assert violation is not None, f"{broken} broke nothing in 300 seeds"
    assert "guaranteed write quorum" in violation.message and "fewer than Qw=3" in violation.message
    Simulation(violation.seed, config).run()           # the correct machines survive the same run


@pytest.mark.parametrize("config", [GWQ_WRITER, GWQ_RECOVERY], ids=["writer-config", "recovery-config"])
def test_correct_guaranteed_write_quorum_passes_the_provoking_configurations(config):
    for seed in range(100):
        Simulation(seed, config).run()


# -- deferred sync (BookKeeper's WriteFlag.DEFERRED_SYNC) -------------------------------------------
class WriterConfirmingAcknowledgedAdds(LedgerWriter):
    """The LAC moves over acknowledged adds as if every bookie had answered a force."""

    def _complete(self) -> list:
        if self.deferred_sync:
            self._forced = dict.fromkeys(self.metadata.current_ensemble, self._round + 1)
        return super()._complete()


class WriterIgnoringRestarts(LedgerWriter):
    """A force answered by a restarted bookie counts for the entries its previous run acknowledged."""

    def _restarted(self, bookie: str, instance: int) -> bool:
        return False


# Few entries, then forces and bookie crashes spread over a long window: bookies crash while
# they hold acknowledged, unsynced entries and answer later forces from a new run.
DEFERRED = SimConfig(bookies=4, ensemble=3, write_quorum=2, ack_quorum=2, entries=6, append_gap_ms=5, drop_rate=0.0,
                     duplicate_rate=0.0, max_delay_ms=3, bookie_crashes=2, writer_crash_rate=0.0,
                     writer_close_rate=0.0, recoverers=1, recovery_window_ms=1500, fault_window_ms=1500,
                     deferred_sync=True, forces=8)


@pytest.mark.parametrize("broken", [WriterConfirmingAcknowledgedAdds, WriterIgnoringRestarts],
                         ids=["lac-over-unforced-adds", "force-answered-by-a-restarted-bookie"])
def test_checker_catches_a_broken_deferred_sync_rule(broken):
    violation = None
    for seed in range(300):
        try:
            Simulation(seed, DEFERRED, writer_cls=broken).run()
        except InvariantViolation as found:
            violation = found
            break
    assert violation is not None, f"{broken.__name__} broke nothing in 300 seeds"
    assert "forced entry" in violation.message or "a LAC reader reported" in violation.message
    assert "fewer than Qa=2" in violation.message
    Simulation(violation.seed, DEFERRED).run()          # the correct writer survives the same run


def test_correct_deferred_sync_passes_the_provoking_configuration():
    for seed in range(300):
        Simulation(seed, DEFERRED).run()
