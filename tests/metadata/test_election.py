"""LeaderElection over every metadata backend: one leader at a time, increasing epochs, takeover."""

from __future__ import annotations

import threading

import pytest

from walkit.election import LeaderElection
from walkit.errors import ConfigError, Timeout
from walkit.spi import SessionState
from walkit.testing.holders import Holder
from walkit.testing.metadata import EXPIRY_MARGIN, StateLog
from walkit.testing.processes import wait_until

from .expiry import expire_session


@pytest.fixture(params=["sqlite", "zk", "etcd"])
def metadata_store_factory(request):
    """metadata_store_factory is the store factory of each backend in turn."""
    return request.getfixturevalue(f"{request.param}_factory")


def campaign_in_thread(election: LeaderElection, timeout: float = 30.0) -> tuple[threading.Thread, list]:
    """campaign_in_thread starts `election.campaign` on a thread; the list gets its epoch or error."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(election.campaign(timeout))
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            outcome.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_one_leader_at_a_time_and_takeover_on_resign(metadata_store_factory):
    first = LeaderElection(metadata_store_factory(), "auditor", "first")
    second = LeaderElection(metadata_store_factory(), "auditor", "second")
    assert first.leader() is None and first.leadership() is None and first.epoch is None

    first_epoch = first.campaign(timeout=10)
    assert first.is_leader and first.epoch == first_epoch
    assert second.leader() == "first" and second.leadership() == ("first", first_epoch)
    thread, outcome = campaign_in_thread(second)
    assert not second.is_leader and not outcome

    first.resign()
    thread.join(10)
    assert outcome == [second.epoch] and second.is_leader
    assert second.epoch > first_epoch
    assert not first.is_leader
    assert first.leader() == "second" and first.leadership() == ("second", second.epoch)

    second.resign()
    assert first.campaign(timeout=10) > second.epoch


def test_campaign_times_out_while_another_leads(metadata_store_factory):
    leader = LeaderElection(metadata_store_factory(), "auditor", "leader")
    leader.campaign(timeout=10)
    with pytest.raises(Timeout, match="leader"):
        LeaderElection(metadata_store_factory(), "auditor", "waiting").campaign(timeout=0.3)
    assert leader.is_leader


@pytest.mark.processes
def test_takeover_when_the_leader_process_is_killed(metadata_store_factory):
    successor = LeaderElection(metadata_store_factory(), "auditor", "successor")
    with Holder("lead", metadata_store_factory.url, "auditor", "doomed") as holder:
        dead_epoch = int(holder.info)
        assert successor.leader() == "doomed"
        thread, outcome = campaign_in_thread(successor)
        holder.kill()
        thread.join(metadata_store_factory.expiry + EXPIRY_MARGIN + 5)
    assert outcome == [successor.epoch], outcome
    assert successor.epoch > dead_epoch
    assert successor.leader() == "successor"


def test_on_lost_is_called_when_the_session_is_lost(metadata_store_factory):
    store = metadata_store_factory()
    lost = threading.Event()
    election = LeaderElection(store, "auditor", "leader", on_lost=lost.set)
    election.campaign(timeout=10)
    store.close()
    assert lost.wait(10)
    assert not election.is_leader
    assert LeaderElection(metadata_store_factory(), "auditor", "next").campaign(timeout=10) > election.epoch


def test_a_store_runs_one_candidate_per_election(metadata_store_factory):
    store = metadata_store_factory()
    LeaderElection(store, "auditor", "one").campaign(timeout=10)
    with pytest.raises(ConfigError, match="own store"):
        LeaderElection(store, "auditor", "two").campaign(timeout=1)
    LeaderElection(store, "other-election", "two").campaign(timeout=10)


@pytest.mark.processes
@pytest.mark.parametrize("backend", ["zk", "etcd"])
def test_an_expired_session_deposes_the_leader(request, backend):
    """An expired session ends the leadership: on_lost runs and the store does not take the key back."""
    factory = request.getfixturevalue(f"{backend}_factory")
    store = factory()
    log = StateLog(store)
    lost = threading.Event()
    leader = LeaderElection(store, "auditor", "leader", on_lost=lost.set)
    epoch = leader.campaign(timeout=10)
    successor = LeaderElection(factory(), "auditor", "successor")
    thread, outcome = campaign_in_thread(successor)

    expire_session(store)
    assert lost.wait(20)
    thread.join(20)
    assert outcome == [successor.epoch] and successor.epoch > epoch
    wait_until(lambda: log.saw(SessionState.LOST, SessionState.CONNECTED), 20, "the deposed leader's store reconnected")
    assert successor.leader() == "successor" and not leader.is_leader
    assert store.children("elections/auditor") == ["leader"]
