"""Deferred-sync ledgers with real bookie processes (issue 20, item 5).

Bookies acknowledge a deferred-sync ledger's appends before their fsync; `force()` makes them
durable, and only forced entries become visible to readers (the LAC). The adversaries: every
bookie killed right after a force returns, a bookie restarted under the writer (it may have
lost acknowledged, unforced entries), and a bookie frozen with SIGSTOP during a force.
"""

from __future__ import annotations

import pytest

import walkit
from walkit.errors import ConfigError, NotEnoughBookies
from walkit.local import LocalCluster

from .test_log_handover import stopped


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=3, data_dir=str(tmp_path_factory.mktemp("deferred") / "cluster"),
                      storage="files") as local:
        yield local


def test_readers_see_only_forced_entries_and_close_forces_the_rest(cluster):
    with walkit.Client(cluster.metadata_url) as client, walkit.Client(cluster.metadata_url) as other:
        writer = client.create_ledger(3, 2, 2, deferred_sync=True)
        assert writer.deferred_sync
        assert [writer.append(b"entry %d" % i) for i in range(100)] == list(range(100))
        assert writer.last_add_acked == 99 and writer.last_add_confirmed == -1
        reader = other.open_ledger(writer.ledger_id)
        assert reader.read_last_add_confirmed() == -1          # nothing forced: nothing visible
        assert writer.force() == 99 and writer.last_add_confirmed == 99
        assert reader.wait_for_lac(98, timeout=10) == 99        # the idle writer's explicit LAC
        assert [e.payload for e in reader.read(0, 99)] == [b"entry %d" % i for i in range(100)]
        many = writer.append_many([b"more %d" % i for i in range(50)])
        assert many == range(100, 150) and writer.last_add_confirmed == 99
        metadata = writer.close()                              # close forces everything first
        assert metadata.last_entry_id == 149
        closed = other.open_ledger(writer.ledger_id)
        assert [e.payload for e in closed.read(100, 149)] == [b"more %d" % i for i in range(50)]


def test_deferred_sync_refuses_guaranteed_write_quorum_and_unbounded(cluster):
    with walkit.Client(cluster.metadata_url) as client:
        for options in ({"guaranteed_write_quorum": True}, {"unbounded": True}):
            with pytest.raises(ConfigError, match="deferred_sync"):
                client.create_ledger(3, 2, 2, deferred_sync=True, **options)


def test_force_on_an_ordinary_ledger_returns_once_the_appends_before_it_complete(cluster):
    with walkit.Client(cluster.metadata_url) as client:
        writer = client.create_ledger(3, 2, 2)
        futures = [writer.append_async(b"%d" % i) for i in range(500)]
        assert writer.force() == 499
        assert all(f.done() for f in futures)
        writer.close()


@pytest.mark.slow
def test_every_forced_entry_survives_sigkill_of_every_bookie_right_after_the_force(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as local:
        with walkit.Client(local.metadata_url) as client:
            writer = client.create_ledger(3, 2, 2, deferred_sync=True)
            payloads = [b"forced %05d" % i for i in range(2000)]
            futures = [writer.append_async(p) for p in payloads]
            forced = writer.force(timeout=60)
            assert forced == 1999 and all(f.done() for f in futures)
            unforced = [writer.append_async(b"unforced %d" % i) for i in range(100)]
            for i in range(3):
                local.kill_bookie(i)
            for future in unforced:
                future.exception(60)                           # acknowledged, or failed: neither is durable
        for i in range(3):
            local.start_bookie(i)
        with walkit.Client(local.metadata_url) as client:
            closed = client.open_ledger(writer.ledger_id, recover=True)
            last = closed.last_add_confirmed
            assert last >= 1999
            values = [e.payload for e in closed.read(0, last)]
            assert values[:2000] == payloads
            assert values[2000:] == [b"unforced %d" % i for i in range(last - 1999)]


@pytest.mark.slow
def test_a_bookie_restarted_under_a_deferred_writer_ends_it_and_recovery_keeps_the_forced_entries(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as local, \
            walkit.Client(local.metadata_url) as client:
        writer = client.create_ledger(3, 2, 2, deferred_sync=True)
        writer.append_many([b"forced %d" % i for i in range(50)])
        assert writer.force() == 49
        writer.append_many([b"unforced %d" % i for i in range(50)])   # acknowledged, not durable
        victim = local.addresses.index(writer.metadata.current_ensemble[0])
        local.kill_bookie(victim)                                     # nothing was in flight to it
        local.start_bookie(victim)
        with pytest.raises(NotEnoughBookies):
            writer.force(timeout=60)
        assert writer.last_add_confirmed == 49
        with walkit.Client(local.metadata_url) as other:
            closed = other.open_ledger(writer.ledger_id, recover=True)
            assert closed.last_add_confirmed >= 49
            values = [e.payload for e in closed.read(0, closed.last_add_confirmed)]
            assert values[:50] == [b"forced %d" % i for i in range(50)]


@pytest.mark.slow
def test_a_force_while_a_bookie_is_frozen_fails_rather_than_confirm_entries_on_one_copy(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as local, \
            walkit.Client(local.metadata_url, request_timeout=2.0) as client:
        writer = client.create_ledger(3, 2, 2, deferred_sync=True)
        writer.append_many([b"%d" % i for i in range(30)])
        frozen = writer.metadata.current_ensemble[1]
        with stopped(local, frozen):
            with pytest.raises(NotEnoughBookies):
                writer.force(timeout=60)
        assert writer.last_add_confirmed == -1                 # no entry was confirmed without Qa syncs
        with walkit.Client(local.metadata_url) as other:
            closed = other.open_ledger(writer.ledger_id, recover=True)
            assert [e.payload for e in closed.read(0, closed.last_add_confirmed)] == \
                [b"%d" % i for i in range(closed.last_add_confirmed + 1)]
