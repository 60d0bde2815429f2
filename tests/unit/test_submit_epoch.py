"""A submit made for an epoch (walkit.core.replica): appended only by a node leading in that epoch.

walkit.adapters.sqlite computes a transaction on state that earlier transactions of the same
leadership left while they are still in flight; such a record must be appended after them by the
same writer, or not at all. Within an epoch the node has one writer and a failed append ends the
epoch, so the condition is the epoch.
"""

from __future__ import annotations

from walkit.core import replicaevents as rev
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.loglist import LogConfig
from walkit.core.replica import LEADING, ReplicaConfig, ReplicaMachine
from walkit.errors import NotLeader

PASSWORD = b"pw"


def leading(epoch: int) -> ReplicaMachine:
    """leading is a machine that leads in `epoch` and waits for earlier leases (the submits stay pending)."""
    config = ReplicaConfig(log=LogConfig(ensemble=1, write_quorum=1, ack_quorum=1))
    machine = ReplicaMachine("m", "n1", config, master_key=master_key(PASSWORD), password_check=password_check(PASSWORD),
                             digest_for={"crc32c": Digest("crc32c", PASSWORD)}.__getitem__, password=PASSWORD)
    machine.start()
    machine.role, machine.epoch = LEADING, epoch
    machine._writes_from_ms = 1 << 60
    return machine


def submit(token: int, epoch: int | None) -> rev.SubmitRequested:
    return rev.SubmitRequested(token=token, record=b"r%d" % token, epoch=epoch)


def test_a_submit_for_another_epoch_is_refused_as_never_appended_and_the_others_are_taken():
    machine = leading(7)
    commands = machine.step(rev.SubmitsRequested(submits=[submit(1, 6), submit(2, 7), submit(3, None), submit(4, 8)]))
    failed = {c.token: c.error for c in commands if isinstance(c, rev.FailSubmit)}
    assert sorted(failed) == [1, 4]
    for error in failed.values():
        assert isinstance(error, NotLeader) and not error.maybe_in_log and error.leader == "n1"
        assert "epoch 7" in str(error)
    assert [token for _, token, _, _ in machine._pending] == [2, 3]


def test_a_single_submit_for_another_epoch_is_refused_too():
    machine = leading(3)
    commands = machine.step(submit(9, 2))
    assert [type(c) for c in commands] == [rev.FailSubmit] and not machine._pending
    assert machine.step(submit(10, 3)) == [] and [t for _, t, _, _ in machine._pending] == [10]
