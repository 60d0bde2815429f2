"""walkit.replicate's machine (walkit.core.replica) under seeded faults, and the rules its checker catches broken.

`--replica-seeds N` runs N random seeds (CI: 1,000 of the hard draw, docs/internals/testing.md#hard-seeds); `pytest tests/sim --seed N` replays one.
Each run checks, after every event, that every node applies the same entries in log order, no
client session's submit twice, that every read reflects every submit acknowledged before it,
that each ledger has one writer, and that snapshots equal the log's replay (see
walkit.testing.sim.replica).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from walkit.core import replicaevents as rev
from walkit.core.replica import ReplicaMachine
from walkit.testing.sim import InvariantViolation
from walkit.testing.sim.replica import ReplicaSimConfig, ReplicaSimulation, partitioned_leader


def test_replica_invariants_hold_under_faults(replica_seed: int, hard: bool) -> None:
    summary = ReplicaSimulation(replica_seed, hard=hard).run()
    assert summary["epochs"] >= 1 and summary["applied"] is not None


def test_the_partitioned_leader_scenario_holds() -> None:
    """Issue 40's partition, scripted: the leader is cut off from the metadata store only and hears of
    it after its session expired; a client keeps reading from it while the new leader takes writes."""
    for seed in range(40):
        summary = partitioned_leader(seed)
        assert summary["epochs"] >= 2


class NewLeaderThatDoesNotWait(ReplicaMachine):
    """A new leader that writes as soon as it replayed, before earlier leases ran out."""

    NEW_LEADER_WAITS = False


class FirstWriterByEmptyLedgers(ReplicaMachine):
    """The tempting shortcut: a new leader whose opened list holds only its own ledger (the ones before it were
    empty and dropped) takes itself for the log's first writer and writes at once."""

    @staticmethod
    def _first_writer(opened) -> bool:
        return len(opened.metadata.segments) == 1


class LeaseBySuspendedOnly(ReplicaMachine):
    """The issue's other design, alone: lease reads stop at SUSPENDED, and a new leader writes at once.

    Safe only if a leader always hears of a lost link before the server expires its session."""

    NEW_LEADER_WAITS = False


class LeaseIgnoringSuspended(LeaseBySuspendedOnly):
    """That design with the rule broken: a SUSPENDED leader goes on answering reads from its lease."""

    SUSPENDED_STOPS_LEASE = False


class SnapshotWithoutSessions(ReplicaMachine):
    """Snapshots that leave the client sessions out: a node restored from one forgets them."""

    SNAPSHOT_SESSIONS = False


class GroupPlannedWithoutItsSessions(ReplicaMachine):
    """Entries applied in groups, each planned against the sessions as applied so far: a record retried in a later
    entry of the same group is taken for a new one."""

    SESSIONS_AT_PLAN = False


class WaitAppliedThatDoesNotWait(ReplicaMachine):
    """A wait for a position (node.wait_applied, ReadRequested.upto) answered at once, applied or not."""

    WAIT_APPLIED_WAITS = False


# Nodes crash and restart from snapshots taken often, while clients retry submits.
SNAPSHOTS_AND_RETRIES = ReplicaSimConfig(nodes=3, clients=3, submits=8, reads=2, lease_ms=60, metadata_cuts=1,
                                         node_crashes=2, snapshot_rate=0.5, drop_rate=0.02)


class SubmitsForAnyEpoch(ReplicaMachine):
    """Broken: takes a submit made for another epoch (SubmitRequested.epoch) as if it named none."""

    def _on_submits(self, event):
        return super()._on_submits(rev.SubmitsRequested(submits=[replace(s, epoch=None) for s in event.submits]))


def first_violation(run, seeds: range) -> InvariantViolation | None:
    for seed in seeds:
        try:
            run(seed)
        except InvariantViolation as violation:
            return violation
    return None


def test_the_checker_catches_a_new_leader_that_does_not_wait_out_the_lease() -> None:
    violation = first_violation(lambda seed: partitioned_leader(seed, NewLeaderThatDoesNotWait), range(40))
    assert violation is not None, "a new leader that does not wait broke no read in 40 seeds"
    assert "missing the submit acknowledged" in violation.message
    partitioned_leader(violation.seed)               # the correct machine passes the very same run


def test_the_first_leader_of_a_new_log_writes_without_waiting_and_its_successor_waits() -> None:
    """The lease wait is skipped only by the log's first writer; the empty-ledger partition keeps every read."""
    skipped = waited_out = 0
    for seed in range(40):
        summary = partitioned_leader(seed, empty=True)
        assert summary["epochs"] >= 2
        lease_ms = summary["config"].lease_ms
        replaying, leading = {}, {}
        for t, _, role, epoch in summary["roles"]:
            {"REPLAYING": replaying, "LEADING": leading}.get(role, {}).setdefault(epoch, t)
        waits = {epoch: leading[epoch] - replaying[epoch] for epoch in leading}
        assert waits, f"seed {seed}: no leader: {summary['roles']}"
        for epoch, waited in waits.items():
            if epoch == 1:            # the first open of the log (an epoch 1 that never opened leaves its successor waiting)
                assert waited < lease_ms / 4, f"seed {seed}: the log's first leader waited {waited} ms"
                skipped += 1
            else:
                assert waited >= lease_ms, f"seed {seed}: leader of epoch {epoch} waited only {waited} ms"
                waited_out += 1
    assert skipped >= 30 and waited_out >= 30, f"of 40 runs, {skipped} had a first leader, {waited_out} successors waited"


def test_the_checker_catches_a_new_leader_that_takes_a_list_of_empty_ledgers_for_a_new_log() -> None:
    """A leader whose lease came from proofs on an empty ledger is partitioned; its successor's open drops that
    ledger. Taking the resulting list (its own ledger alone) for a new log skips the wait: a stale read."""
    violation = first_violation(lambda seed: partitioned_leader(seed, FirstWriterByEmptyLedgers, empty=True),
                                range(40))
    assert violation is not None, "a successor that skipped the wait after empty ledgers broke no read in 40 seeds"
    assert "missing the submit acknowledged" in violation.message
    partitioned_leader(violation.seed, empty=True)      # the correct machine passes the very same run


def test_the_checker_catches_a_lease_that_ignores_suspended() -> None:
    """Where the leader hears of the cut before its session expires (prompt_notice), stopping lease reads at
    SUSPENDED is what keeps them linearizable in a design without the new leader's wait: the checker
    catches the lease that ignores SUSPENDED, and the same design with the rule passes the same run.
    walkit's machine waits as well, so it holds also when the leader hears of the cut late."""
    def broken(seed: int) -> dict:
        return partitioned_leader(seed, LeaseIgnoringSuspended, prompt_notice=True)
    violation = first_violation(broken, range(40))
    assert violation is not None, "a lease that ignores SUSPENDED broke no read in 40 seeds"
    assert "missing the submit acknowledged" in violation.message
    partitioned_leader(violation.seed, LeaseBySuspendedOnly, prompt_notice=True)
    partitioned_leader(violation.seed, prompt_notice=True)
    partitioned_leader(violation.seed)


def test_the_checker_catches_sessions_forgotten_across_snapshots() -> None:
    violation = first_violation(lambda seed: ReplicaSimulation(seed, SNAPSHOTS_AND_RETRIES,
                                                               machine_cls=SnapshotWithoutSessions).run(), range(200))
    assert violation is not None, "sessions left out of snapshots applied nothing twice in 200 seeds"
    assert "twice" in violation.message or "applied" in violation.message
    ReplicaSimulation(violation.seed, SNAPSHOTS_AND_RETRIES).run()


def test_the_checker_catches_a_group_of_entries_planned_without_the_sessions_of_its_earlier_entries() -> None:
    violation = first_violation(lambda seed: ReplicaSimulation(seed, machine_cls=GroupPlannedWithoutItsSessions).run(),
                                range(300))
    assert violation is not None, "groups planned without their sessions applied nothing twice in 300 seeds"
    assert "twice" in violation.message or "sessions" in violation.message, violation.message
    ReplicaSimulation(violation.seed).run()                    # the correct machine passes the very same run


def test_the_checker_catches_a_wait_for_a_position_answered_before_it_was_applied() -> None:
    violation = first_violation(lambda seed: ReplicaSimulation(seed, machine_cls=WaitAppliedThatDoesNotWait).run(),
                                range(200))
    assert violation is not None, "waits answered at once missed no write in 200 seeds"
    assert "before the write it waited for" in violation.message, violation.message
    ReplicaSimulation(violation.seed).run()                    # the correct machine passes the very same run


@pytest.mark.parametrize("config", [SNAPSHOTS_AND_RETRIES], ids=["snapshots-and-retries"])
def test_the_correct_machine_passes_the_provoking_configuration(config) -> None:
    for seed in range(200):
        ReplicaSimulation(seed, config).run()


def test_same_seed_same_replica_run() -> None:
    first, second = ReplicaSimulation(777), ReplicaSimulation(777)
    assert first.run() == second.run()
    assert first.trace == second.trace


def test_the_checker_catches_a_submit_taken_for_another_epoch() -> None:
    violation = first_violation(lambda seed: ReplicaSimulation(seed, machine_cls=SubmitsForAnyEpoch).run(), range(200))
    assert violation is not None, "submits taken whatever their epoch broke nothing in 200 seeds"
    assert "for epoch" in violation.message, violation.message
    ReplicaSimulation(violation.seed).run()                    # the correct machine passes the very same run
