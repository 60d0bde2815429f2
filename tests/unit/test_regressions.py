"""Regression scenarios named after BookKeeper's own tests, played message by message.

Each test drives the real core machines (LedgerWriter, LedgerRecovery, RangeReader) against
real BookieHandler instances over walkit.testing.scripted, where nothing moves unless the script
says so: it delivers, drops or fails each request, syncs each bookie and runs each metadata
compare-and-swap in the order that provokes the bug. The BookKeeper counterparts live in
LedgerRecovery2Test, TestFencing, BookieWriteLedgerTest and the issues the names cite
(apache/bookkeeper 2614, 2615); the rules are in docs/internals/protocol.md#known-bugs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from walkit.core import events as ev
from walkit.core.messages import Status
from walkit.core.metadata import CLOSED, IN_RECOVERY, OPEN
from walkit.core.recovery import RECOVERING, RETRY_MS, LedgerRecovery
from walkit.errors import LedgerFenced
from walkit.testing.scripted import LEDGER_ID, ScriptedCluster


class RecoveryWithoutFencedReads(LedgerRecovery):
    """RecoveryWithoutFencedReads reads without the fence flag, as BookKeeper did before issue 2614."""

    FENCE_RECOVERY_READS = False


def entries(first: int, last: int) -> list[bytes]:
    """entries returns the payloads the scripted writer gives entries first..last."""
    return [f"e{i}".encode() for i in range(first, last + 1)]


def writer_with_confirmed(cluster: ScriptedCluster, count: int):
    """writer_with_confirmed opens the writer and has it add `count` entries, all acknowledged."""
    writer = cluster.writer()
    writer.append(count)
    cluster.deliver_all()
    assert writer.confirmed == count - 1
    return writer


def closes(cluster: ScriptedCluster) -> list:
    """closes lists the CLOSED versions in the metadata store's history."""
    return [md for _, md in cluster.store.history if md.state == CLOSED]


# -- fencing the old writer ---------------------------------------------------------------------
def test_first_writer_cannot_commit_after_second_writer_closed():
    """A writer fenced by a recovery completes no add afterwards; each of its adds fails with
    LedgerFenced, and every entry it had acknowledged is within the closed ledger
    (docs/internals/protocol.md#fencing)."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 2)               # e0, e1 acknowledged
    writer.append()                                          # e2 -> b1, b2, b3
    cluster.deliver(to="b1", kind="add", entry=2)
    cluster.sync("b1")
    assert cluster.deliver(to="writer", from_="b1") == []    # one ack of e2, below Qa = 2

    recovery = cluster.recovery()                            # a second client recovers the ledger
    cluster.cas(recovery)                                    # IN_RECOVERY
    cluster.deliver_all(kind="lac")                          # every bookie fenced
    assert all(bookie.fenced for bookie in cluster.bookies.values())

    cluster.settle()                                         # e2 reaches b2 and b3 too late
    closed = cluster.store.metadata
    assert recovery.result == ev.CompleteRecovery(metadata=closed, version=2)
    assert closed.last_entry_id == 2          # e2 sat on b1: recovery wrote it back and kept it
    assert writer.completions == [1]          # ... but the writer never saw e2 complete
    assert [type(e) for e in writer.errors] == [LedgerFenced]   # "treat LedgerFenced as a timeout"

    writer.append()                                          # the fenced writer tries again
    cluster.settle()
    assert cluster.queued() == []                            # it sent nothing
    assert writer.completions == [1]
    assert [type(e) for e in writer.errors] == [LedgerFenced, LedgerFenced]
    assert writer.confirmed <= closed.last_entry_id
    assert cluster.read(0, closed.last_entry_id) == entries(0, 2)


def play_issue_2614(recovery_cls: type) -> tuple[ScriptedCluster, object]:
    """play_issue_2614 plays BookKeeper's testFirstWriterCannotCommitWriteAfter2ndWriterCloses up to
    the point where the first writer's add of e2 reaches b2 after the second client closed the
    ledger at e1 (apache/bookkeeper issue 2614); it returns the cluster and the first writer."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 2)               # e0, e1 acknowledged
    writer.append()                                          # e2 -> b1, b2, b3, held on the way
    # Step 1: a second client starts recovery.
    recovery = cluster.recovery(cls=recovery_cls)
    cluster.cas(recovery)
    # Step 2: its fencing LAC read reaches b1.
    cluster.deliver(to="b1", kind="lac")
    cluster.sync("b1")
    # Step 3: the writer's e2 reaches b3, which acknowledges it.
    cluster.deliver(to="b3", kind="add", entry=2)
    cluster.sync("b3")
    cluster.deliver(to="writer", from_="b3")
    # Step 4: the fencing read to b2 is lost.
    cluster.drop(to="b2", kind="lac")
    # Step 5: the fencing read reaches b3; with b1 that is EC = (E - Qa) + 1 = 2 answers.
    cluster.deliver(to="b3", kind="lac")
    cluster.sync("b3")
    cluster.deliver_all(to="recovery", kind="lac")
    assert not cluster.bookies["b2"].fenced
    # Steps 6 and 7: recovery reads e2 from b1 and b2 (a read with the fence flag fences b2);
    # both lack e2, and QC = (Qw - Qa) + 1 = 2 answers prove it absent.
    for bookie in ("b1", "b2"):
        cluster.deliver(to=bookie, kind="read", entry=2)
        cluster.sync(bookie)
        cluster.deliver(to="recovery", from_=bookie, kind="read")
    # Step 8: the second client closes the ledger at e1 (b3's answer, with e2, never arrives).
    cluster.cas(recovery)
    assert cluster.store.metadata.state == CLOSED and cluster.store.metadata.last_entry_id == 1
    # Step 9: the writer's e2 finally reaches b2.
    cluster.deliver(to="b2", kind="add", entry=2)
    cluster.sync("b2")
    cluster.deliver(to="writer", from_="b2")
    return cluster, writer


def test_issue_2614_recovery_reads_fence_unfenced_bookies():
    """A recovery read fences the bookie whose fencing request was lost, so the old writer's late
    add there is refused and the writer never completes an entry past the closed last entry
    (apache/bookkeeper issue 2614). Without the fence flag the same script loses e2."""
    cluster, writer = play_issue_2614(LedgerRecovery)
    assert cluster.bookies["b2"].fenced                      # fenced by the read of step 7
    assert cluster.payload_on("b2", 2) is None               # the add of step 9 was refused
    assert writer.completions == [1]
    assert [type(e) for e in writer.errors] == [LedgerFenced]
    cluster.settle()
    assert writer.completions == [1]
    assert cluster.read(0, 1) == entries(0, 1)

    # The same script with reads that do not fence: b2 takes e2 and the writer reaches Qa.
    cluster, writer = play_issue_2614(RecoveryWithoutFencedReads)
    assert not cluster.bookies["b2"].fenced
    assert cluster.payload_on("b2", 2) == b"e2"
    assert writer.completions == [1, 2]
    assert writer.confirmed > cluster.store.metadata.last_entry_id == 1    # e2 acknowledged, then lost
    assert cluster.read(0, cluster.store.metadata.last_entry_id) == entries(0, 1)


# -- recovery against concurrent metadata changes ---------------------------------------------
def test_metadata_closed_during_recovery():
    """A recovery whose close meets a ledger another recoverer closed meanwhile adopts that close:
    it completes with the stored metadata and writes nothing (LedgerRecovery2Test)."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    writer_with_confirmed(cluster, 2).stop()                 # e0, e1 acknowledged; the writer dies

    first = cluster.recovery("first")
    cluster.cas(first)                                       # IN_RECOVERY, v1
    cluster.deliver_all(client="first", kind="lac")          # LAC 0 everywhere
    cluster.deliver_all(client="first", kind="read")         # e1 found, e2 on none
    assert {m.receiver for m in cluster.queued(from_="first", kind="add", entry=1)} == {"b1", "b2", "b3"}
    # ... and its write-back to b1, b2, b3 is held while a second recoverer does all the work.
    second = cluster.recovery("second")                      # sees IN_RECOVERY: fences at once
    cluster.deliver_all(client="second")
    cluster.cas(second)
    assert second.result == ev.CompleteRecovery(metadata=cluster.store.metadata, version=2)
    assert cluster.store.metadata.last_entry_id == 1

    cluster.deliver_all(client="first")                      # the write-back of e1 goes on ...
    cluster.cas(first)                                       # ... and its close meets CLOSED
    assert first.result == ev.CompleteRecovery(metadata=cluster.store.metadata, version=2)
    assert first.result.metadata.last_entry_id == first.machine.last_entry_id == 1
    assert cluster.store.version == 2 and len(closes(cluster)) == 1


def test_new_ensemble_added_during_recovery():
    """The writer's ensemble change lands before the recovery marks the ledger: the recovery's CAS
    conflicts, it re-reads, fences the NEW last fragment and keeps every acknowledged entry."""
    cluster = ScriptedCluster(bookies=4, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 2)               # e0, e1 on b1, b2, b3
    writer.append()                                          # e2 -> b1, b2, b3
    cluster.fail(to="b3", kind="add", entry=2)               # b3 times out on e2
    cluster.deliver(to="writer", from_="b3")
    cluster.choose(writer)                                   # b4 replaces b3 from entry 2
    recovery = cluster.recovery()                            # read the metadata at v0
    cluster.cas(writer)                                      # v1: fragment 2 = b1, b2, b4
    cluster.deliver_all(client="writer")
    assert writer.confirmed == 2

    cluster.cas(recovery)                                    # expected v0: conflict, re-read v1
    assert cluster.store.version == 1
    cluster.cas(recovery)                                    # v2: IN_RECOVERY
    assert [m.receiver for m in cluster.queued(kind="lac")] == ["b1", "b2", "b4"]

    cluster.settle()
    closed = cluster.store.metadata
    assert recovery.result == ev.CompleteRecovery(metadata=closed, version=3)
    assert closed.ensembles == {0: ("b1", "b2", "b3"), 2: ("b1", "b2", "b4")}
    assert closed.last_entry_id == 2 >= writer.confirmed
    assert cluster.read(0, 2) == entries(0, 2)


def test_new_ensemble_refused_once_recovery_started():
    """The recovery marks the ledger IN_RECOVERY first: the writer's ensemble change conflicts, it
    sees IN_RECOVERY and fails its pending adds with LedgerFenced
    (docs/internals/protocol.md#recovery, step 1)."""
    cluster = ScriptedCluster(bookies=4, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 2)
    writer.append()                                          # e2 -> b1, b2, b3
    cluster.fail(to="b3", kind="add", entry=2)
    cluster.deliver(to="writer", from_="b3")
    cluster.choose(writer)                                   # the writer proposes b4 for b3
    recovery = cluster.recovery()
    cluster.cas(recovery)                                    # v1: IN_RECOVERY

    outcomes = cluster.cas(writer)                           # expected v0: conflict
    assert [type(o) for o in outcomes] == [ev.FailAdds]
    assert outcomes[0].first_entry_id == 2 and isinstance(outcomes[0].error, LedgerFenced)
    assert cluster.store.metadata.state == IN_RECOVERY
    assert cluster.store.metadata.ensembles == {0: ("b1", "b2", "b3")}

    cluster.settle()
    closed = cluster.store.metadata
    assert recovery.result == ev.CompleteRecovery(metadata=closed, version=2)
    assert "b4" not in closed.bookies and cluster.payload_on("b4", 2) is None
    assert writer.completions == [1] and writer.confirmed <= closed.last_entry_id
    assert cluster.read(0, closed.last_entry_id) == entries(0, closed.last_entry_id)


# -- the writer's failure handling --------------------------------------------------------------
def test_two_bookies_fail_on_the_same_entry():
    """Two bookies of e2's write set fail (E4 Qw3 Qa2): one ensemble change replaces both, the new
    fragment starts at LAC + 1 without either, and e2 completes afterwards, once, in order."""
    cluster = ScriptedCluster(bookies=6, ensemble=4, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 2)               # e0, e1 acknowledged
    before = writer.completions
    writer.append()                                          # e2 -> b3, b4, b1
    writer.append()                                          # e3 -> b4, b1, b2
    assert cluster.write_set(2) == ("b3", "b4", "b1")
    cluster.crash("b3")
    cluster.crash("b4")
    assert cluster.deliver_all(to="writer") == []            # their UNREACHABLE answers
    assert [type(c) for _, c in cluster.metadata_ops] == [ev.ChooseBookies]   # one change

    cluster.choose(writer)                                   # offered b5, b6
    proposed = cluster.metadata_ops[0][1].metadata
    assert proposed.ensembles == {0: ("b1", "b2", "b3", "b4"), 2: ("b1", "b2", "b5", "b6")}
    assert cluster.cas(writer) == []                         # nothing completes before the resends
    cluster.settle()

    assert writer.completions == before + [3]                # e2 and e3 complete together, once
    assert cluster.write_set(2) == ("b5", "b6", "b1")
    assert [cluster.payload_on(b, 2) for b in cluster.write_set(2)] == [b"e2"] * 3
    assert cluster.read(0, 3) == entries(0, 3)


def test_second_failure_while_the_first_is_handled():
    """b2 fails while the ensemble-change CAS replacing b3 is in flight: once that change is
    written a second change replaces b2, and every pending add then completes in order."""
    cluster = ScriptedCluster(bookies=5, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 2)
    before = writer.completions
    writer.append(2)                                         # e2, e3 -> b1, b2, b3
    cluster.crash("b3")
    cluster.deliver(to="writer", from_="b3")
    cluster.choose(writer, bookies=["b4"])                   # CAS: fragment 2 = b1, b2, b4
    cluster.fail(to="b2", kind="add", status=Status.IO_ERROR)
    assert cluster.deliver(to="writer", from_="b2") == []    # noted, handled after the CAS
    assert [type(c) for _, c in cluster.metadata_ops] == [ev.WriteMetadata]

    assert cluster.cas(writer) == []                         # first change written: start the second
    assert cluster.store.metadata.ensembles[2] == ("b1", "b2", "b4")
    choose = cluster.metadata_ops[0][1]
    assert type(choose) is ev.ChooseBookies and "b2" in choose.exclude
    cluster.choose(writer)                                   # b5 (b3 is down)
    assert cluster.cas(writer) == []
    assert cluster.store.metadata.ensembles == {0: ("b1", "b2", "b3"), 2: ("b1", "b5", "b4")}

    cluster.settle()
    assert writer.completions == before + [3]
    assert [cluster.payload_on(b, 3) for b in ("b1", "b5", "b4")] == [b"e3"] * 3
    assert cluster.read(0, 3) == entries(0, 3)


def test_no_adds_complete_while_failure_handling_is_in_progress():
    """Acks that bring pending adds to Qa while an ensemble change is in flight complete nothing;
    the adds complete on MetadataWritten, and the replacement is written to only after it."""
    cluster = ScriptedCluster(bookies=4, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 1)
    writer.append(2)                                         # e1, e2 -> b1, b2, b3
    cluster.fail(to="b3", kind="add")
    cluster.deliver(to="writer", from_="b3")
    cluster.choose(writer)                                   # CAS for b4 in flight
    for bookie in ("b1", "b2"):                              # e1 and e2 reach Qa = 2
        cluster.deliver(to=bookie, kind="add")
        cluster.sync(bookie)
        assert cluster.deliver(to="writer", from_=bookie) == []
    assert writer.machine.changing_ensemble
    assert writer.confirmed == 0
    # Not before the CAS (docs/internals/protocol.md#ensemble-change):
    assert cluster.queued(to="b4") == []

    assert cluster.cas(writer) == [ev.CompleteAdds(ledger_id=LEDGER_ID, last_entry_id=2)]
    assert [m.entry_ids for m in cluster.queued(to="b4")] == [[1, 2]]


# -- recovery's reading rules -------------------------------------------------------------------
def test_issue_2615_recovery_starts_before_last_fragment():
    """The last fragment starts at entry 10 and its bookies never received an entry, so they all
    answer LAC -1: recovery reads from 10 on, never from 0, and keeps e0..e9 (apache/bookkeeper
    issue 2615). It even finishes while the first fragment's bookies are all down."""
    cluster = ScriptedCluster(bookies=6, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 10)              # e0..e9 on b1, b2, b3
    for bookie in ("b1", "b2", "b3"):
        cluster.crash(bookie)
    writer.append()                                          # e10: all three unreachable
    cluster.deliver_all(to="writer")
    cluster.choose(writer)                                   # b4, b5, b6
    cluster.cas(writer)                                      # fragment 10 = b4, b5, b6
    writer.stop()                                            # the writer dies before e10 leaves
    cluster.drop_all(from_="writer")
    assert cluster.store.metadata.ensembles == {0: ("b1", "b2", "b3"), 10: ("b4", "b5", "b6")}

    recovery = cluster.recovery()
    cluster.cas(recovery)
    cluster.deliver_all(kind="lac")                          # b4, b5, b6 answer LAC -1
    assert recovery.machine.start_entry == 9
    reads = cluster.queued(kind="read")
    assert {m.receiver for m in reads} == {"b4", "b5", "b6"}
    assert min(min(m.entry_ids) for m in reads) == 10

    cluster.settle()
    closed = cluster.store.metadata
    assert recovery.result == ev.CompleteRecovery(metadata=closed, version=3)
    assert closed.last_entry_id == 9
    for bookie in ("b1", "b2", "b3"):
        cluster.restart(bookie)
    assert cluster.read(0, 9) == entries(0, 9)


def test_recovery_never_guesses_an_unknown_entry():
    """e2 is acknowledged on b1 and b3; during recovery b1's read fails, b3's times out and only b2
    says NO_SUCH_ENTRY, fewer than QC = 2: recovery neither closes nor calls e2 absent, and asks
    again; once b1 answers it keeps e2."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 2)
    writer.append()                                          # e2: b1 and b3 acknowledge, b2 misses it
    cluster.drop(to="b2", kind="add", entry=2)
    cluster.deliver_all(client="writer")
    assert writer.confirmed == 2
    writer.stop()

    recovery = cluster.recovery()
    cluster.cas(recovery)
    cluster.deliver_all(kind="lac")
    cluster.fail(to="b1", kind="read", entry=2, status=Status.IO_ERROR)
    cluster.deliver(to="b2", kind="read", entry=2)
    cluster.sync("b2")
    cluster.fail(to="b3", kind="read", entry=2)              # timed out
    cluster.deliver_all(to="recovery")
    assert recovery.machine.phase == RECOVERING
    assert recovery.machine.last_entry_id is None
    assert recovery.result is None and cluster.metadata_ops == []
    assert cluster.store.metadata.state == IN_RECOVERY

    cluster.tick(RETRY_MS)                                   # ask the undecided replicas again
    assert sorted(m.receiver for m in cluster.queued(kind="read", entry=2)) == ["b1", "b3"]
    cluster.settle()
    assert cluster.store.metadata.last_entry_id == 2
    assert recovery.result == ev.CompleteRecovery(metadata=cluster.store.metadata, version=2)
    assert cluster.read(0, 2) == entries(0, 2)


@pytest.mark.parametrize("winner, loser", [("r1", "r2"), ("r2", "r1")])
def test_concurrent_recoverers_converge(winner, loser):
    """Two recoveries race and disagree: r1 finds e2 (on b1 only, never acknowledged) and would
    close at 2, r2 hears b2 and b3 lack it and would close at 1. Whichever close lands first, the
    other's CAS conflicts and it adopts that close: both finish with the same last entry."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = writer_with_confirmed(cluster, 2)
    writer.append()                                          # e2 reaches b1 only; the writer dies
    cluster.deliver(to="b1", kind="add", entry=2)
    cluster.sync("b1")
    writer.stop()
    cluster.drop_all(from_="writer")

    r1, r2 = cluster.recovery("r1"), cluster.recovery("r2")
    cluster.cas(r1)                                          # v1: IN_RECOVERY
    cluster.cas(r2)                                          # conflict: already IN_RECOVERY, fence
    cluster.deliver_all(kind="lac")
    for bookie in ("b2", "b3"):                              # r2 hears first that b2 and b3 lack e2
        cluster.deliver(to=bookie, from_="r2", kind="read")
        cluster.sync(bookie)
        cluster.deliver(to="r2", from_=bookie, kind="read")
    cluster.deliver_all(client="r1")                         # r1 reads e2 on b1 and writes it back
    assert (r1.machine.last_entry_id, r2.machine.last_entry_id) == (2, 1)
    assert [type(c) for _, c in cluster.metadata_ops] == [ev.WriteMetadata, ev.WriteMetadata]

    cluster.cas(winner)
    cluster.cas(loser)                                       # expected v1: conflict with CLOSED
    closed = cluster.store.metadata
    assert closed.last_entry_id == cluster.clients[winner].machine.last_entry_id
    for recovery in (r1, r2):
        assert recovery.result == ev.CompleteRecovery(metadata=closed, version=2)
    assert len(closes(cluster)) == 1
    assert writer.confirmed <= closed.last_entry_id
    cluster.settle()
    assert cluster.read(0, closed.last_entry_id) == entries(0, closed.last_entry_id)


# -- the writer's close -------------------------------------------------------------------------
def test_close_conflict_rules_seed_000():
    """A writer's close whose CAS conflicts follows docs/internals/protocol.md#closing:
    IN_RECOVERY is an error, CLOSED at the writer's LAC is success, CLOSED elsewhere is an error,
    and a ledger still OPEN is closed again on the new version."""
    # IN_RECOVERY: a recovery marked the ledger before the writer's close landed.
    cluster = ScriptedCluster()
    writer = writer_with_confirmed(cluster, 2)
    writer.close()
    cluster.cas(cluster.recovery())
    outcomes = cluster.cas(writer)
    assert [type(o) for o in outcomes] == [ev.FailAdds, ev.FailClose]
    assert isinstance(outcomes[1].error, LedgerFenced)
    assert cluster.store.metadata.state == IN_RECOVERY

    # CLOSED at the same last entry: a recovery closed the ledger at e1, the writer's LAC.
    cluster = ScriptedCluster()
    writer = writer_with_confirmed(cluster, 2)
    writer.close()
    recovery = cluster.recovery()
    cluster.cas(recovery)
    cluster.deliver_all()
    cluster.cas(recovery)
    assert cluster.store.metadata.last_entry_id == 1
    assert cluster.cas(writer) == [ev.CompleteClose(metadata=cluster.store.metadata, version=2)]

    # CLOSED at another last entry: another client closed the ledger at e0.
    cluster = ScriptedCluster()
    writer = writer_with_confirmed(cluster, 2)
    writer.close()
    cluster.transform_metadata(lambda md: md.closed(0))
    outcomes = cluster.cas(writer)
    assert [type(o) for o in outcomes] == [ev.FailAdds, ev.FailClose]
    assert isinstance(outcomes[1].error, LedgerFenced)
    assert cluster.store.metadata.last_entry_id == 0 and cluster.store.version == 1

    # Still OPEN: another client changed the metadata (say, re-replication); close again on top.
    cluster = ScriptedCluster()
    writer = writer_with_confirmed(cluster, 2)
    writer.close()
    cluster.transform_metadata(lambda md: replace(md, custom={"note": "moved"}))
    assert cluster.cas(writer) == []                         # conflict: OPEN, retried on v1
    assert cluster.store.metadata.state == OPEN
    outcomes = cluster.cas(writer)
    assert outcomes == [ev.CompleteClose(metadata=cluster.store.metadata, version=2)]
    assert cluster.store.metadata.last_entry_id == 1 and cluster.store.metadata.custom == {"note": "moved"}


def test_recovery_replacing_a_bookie_moves_entries_still_being_read():
    """Issue 12: E4/Qw2/Qa2. e3 is still being read when the write-back of e2 finds b4 dead and
    recovery replaces it. The new fragment must start right after the entries written back in
    full (e0, e1), so that e3, read later, goes to b1 and the replacement b5, not to a write set
    still naming b4, where it could never reach Qa and recovery would stall until its timeout.
    (e4 and e5, read already, wait behind e3: nothing past an entry not read yet is written back.
    With write-backs in order, the lowest unfinished one is always right after those written back
    in full, so this guards the order; the fragment-start rule it once caught cannot go wrong.)"""
    cluster = ScriptedCluster(bookies=5, ensemble=4, write_quorum=2, ack_quorum=2)
    writer = cluster.writer()
    writer.append(6)                                         # e0..e5 in one batch: each carries LAC -1
    cluster.deliver_all()
    assert writer.confirmed == 5
    writer.stop()                                            # no explicit LAC: the bookies' LAC stays -1

    recovery = cluster.recovery()
    cluster.cas(recovery)
    cluster.deliver_all(kind="lac")
    assert recovery.machine.start_entry == -1
    cluster.fail(to="b1", kind="read", status=Status.IO_ERROR)   # e0, e3, e4 ... unanswered by b1
    cluster.fail(to="b4", kind="read", status=Status.IO_ERROR)   # e2, e3 ... unanswered by b4
    cluster.deliver(to="b2", kind="read")
    cluster.deliver(to="b3", kind="read")
    cluster.sync("b2")
    cluster.sync("b3")
    cluster.deliver_all(to="recovery", kind="read")          # e0, e1, e2, e4, e5 found; e3 still unknown
    assert recovery.result is None and cluster.queued(kind="add", entry=3) == []
    assert cluster.queued(kind="add", entry=4) == [] and cluster.queued(kind="add", entry=5) == []

    cluster.deliver_all(kind="add", entry=0)                 # e0 and e1 are written back in full
    cluster.deliver_all(kind="add", entry=1)
    cluster.crash("b4")                                      # e2's write-back to b4 fails
    cluster.deliver_all(to="recovery", kind="add")
    cluster.choose(recovery)                                 # b5 replaces b4
    cluster.settle()
    cluster.tick(RETRY_MS)                                   # e3 is asked again, and found on b1
    cluster.settle()

    closed = cluster.store.metadata
    assert recovery.result == ev.CompleteRecovery(metadata=closed, version=2)
    assert closed.last_entry_id == 5
    assert closed.ensembles == {0: ("b1", "b2", "b3", "b4"), 2: ("b1", "b2", "b3", "b5")}
    assert cluster.payload_on("b5", 2) == b"e2" and cluster.payload_on("b5", 3) == b"e3"
    assert cluster.read(0, 5) == entries(0, 5)
