"""A bookie whose disk was emptied and formatted since a fragment was written never speaks for it.

Played message by message over walkit.testing.scripted: `restart(address, empty=True)` brings a
bookie back on a new, empty disk (what `walkit bookies format-and-rejoin` lets a real bookie do,
and what a memory bookie does at every restart). Its answers carry the new disk; the ledger's
metadata records the disks each fragment was written with (LedgerMetadata.disks). Each rule is
also played with the check switched off, to show the script provokes the loss it guards against.
"""

from __future__ import annotations

import pytest

from walkit.core import events as ev
from walkit.core.digest import Digest
from walkit.core.messages import Status
from walkit.core.metadata import CLOSED, IN_RECOVERY, LedgerMetadata
from walkit.core.reader import RangeReader
from walkit.core.recovery import LedgerRecovery
from walkit.core.writer import LedgerWriter
from walkit.errors import BookieError, ConfigError, LedgerFenced, NoSuchEntry, NotEnoughBookies
from walkit.testing.scripted import LEDGER_ID, ScriptedCluster


class RecoveryCountingEveryDisk(LedgerRecovery):
    """RecoveryCountingEveryDisk counts answers from any disk (the rule switched off)."""

    CHECK_DISKS = False


class WriterCountingEveryDisk(LedgerWriter):
    """WriterCountingEveryDisk counts acknowledgements from any disk (the rule switched off)."""

    CHECK_DISKS = False


def entries(first: int, last: int) -> list[bytes]:
    return [f"e{i}".encode() for i in range(first, last + 1)]


# -- metadata -----------------------------------------------------------------------------------
def metadata(**fields) -> LedgerMetadata:
    base = dict(ledger_id=1, ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles={0: ("a", "b", "c")},
                disks={0: (11, 12, 13)})
    return LedgerMetadata(**{**base, **fields})


def test_disks_round_trip_and_follow_fragments():
    md = metadata().with_fragment(10, ("a", "d", "c"), (11, 14, 13))
    assert LedgerMetadata.from_bytes(md.to_bytes()) == md
    assert md.disk_of(9, "b") == 12 and md.disk_of(10, "d") == 14 and md.disk_of(10, "b") == 0
    assert md.answer_counts(9, "b", 12) and not md.answer_counts(9, "b", 99)
    assert md.answer_counts(10, "b", 99)                  # b is not in that fragment: nothing recorded


def test_unknown_disks_record_nothing_and_every_answer_counts():
    md = metadata(disks={}).with_fragment(5, ("a", "b", "d"), (0, 0, 0))
    assert md.disks == {} and b'"disks"' not in md.to_bytes()
    assert md.answer_counts(7, "b", 1234)


def test_truncation_drops_the_disks_of_dropped_fragments():
    md = metadata(guaranteed_write_quorum=True, unbounded=True).with_fragment(10, ("a", "b", "d"), (11, 12, 14))
    assert md.truncated(12).disks == {10: (11, 12, 14)}
    assert LedgerMetadata.from_bytes(md.to_bytes()) == md


def test_disks_must_match_a_fragment():
    with pytest.raises(ConfigError):
        metadata(disks={5: (1, 2, 3)})
    with pytest.raises(ConfigError):
        metadata(disks={0: (1, 2)})


# -- recovery -----------------------------------------------------------------------------------
def play_emptied_disk_recovery(recovery_cls: type) -> tuple[ScriptedCluster, object]:
    """E3/Qw2/Qa2: the writer has e0..e4 acknowledged (sent together, so every entry carries LAC -1)
    and dies; b2, which held e0, e1, e3 and e4, restarts on an empty disk; recovery hears b2's
    NO_SUCH_ENTRY for them before the other replicas' copies."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=2, ack_quorum=2)
    writer = cluster.writer()
    writer.append(5)
    cluster.deliver_all()
    assert writer.confirmed == 4 and cluster.write_set(4) == ("b2", "b3")
    writer.stop()                                              # the writer dies
    cluster.crash("b2")
    cluster.restart("b2", empty=True)
    recovery = cluster.recovery(cls=recovery_cls)
    cluster.cas(recovery)
    cluster.deliver_all(kind="lac")
    cluster.deliver(to="b2", kind="read")
    cluster.sync("b2")
    cluster.deliver(to="recovery", from_="b2", kind="read")    # NO_SUCH_ENTRY for e4, from the new disk
    cluster.settle()
    return cluster, writer


def test_recovery_never_counts_no_such_entry_from_an_emptied_disk():
    cluster, writer = play_emptied_disk_recovery(LedgerRecovery)
    closed = cluster.store.metadata
    assert closed.state == CLOSED and closed.last_entry_id == writer.confirmed == 4
    assert cluster.read(0, 4) == entries(0, 4)
    assert cluster.payload_on("b2", 4) == b"e4"                # written back to the new disk

    cluster, writer = play_emptied_disk_recovery(RecoveryCountingEveryDisk)
    assert cluster.store.metadata.last_entry_id < writer.confirmed == 4   # acknowledged entries lost


def test_fencing_counts_an_emptied_disk_but_absence_does_not():
    """EC = (E - Qa) + 1 = 2 fencing answers: b2 on its new disk is fenced now (and no writer counts
    its acknowledgements), so it is one of them; its NO_SUCH_ENTRY for e1 (write set b2, b3)
    proves nothing, so recovery waits for b3, which holds it."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=2, ack_quorum=2)
    writer = cluster.writer()
    writer.append(3)
    cluster.deliver_all()
    writer.stop()
    cluster.crash("b2")
    cluster.restart("b2", empty=True)
    recovery = cluster.recovery()
    cluster.cas(recovery)
    cluster.fail(to="b3", kind="lac")                          # b3 unreachable for now
    cluster.deliver_all(kind="lac")                            # b1 and b2 (new disk) answered: fenced
    cluster.deliver_all(to="b1")
    cluster.deliver_all(to="b2")
    cluster.deliver_all(to="recovery")
    assert recovery.result is None                             # e1 unknown: b2's answer is not absence
    cluster.tick(200)
    cluster.settle()
    assert cluster.store.metadata.last_entry_id == 2


def test_recovery_counts_no_such_ledger_from_an_older_bookie_only_for_ledgers_that_record_no_disks():
    """An older secured bookie cannot read metadata that records disks and answers NO_SUCH_LEDGER
    for a ledger it holds: from a bookie that names no disk, that is not absence."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=2, ack_quorum=2)
    md = cluster.store.metadata
    recovery = LedgerRecovery(md, 0, master_key=cluster.master_key, digest=cluster.digest)
    recovery.start()
    recovery.step(ev.MetadataWritten(metadata=md.in_recovery(), version=1))
    for bookie in ("b1", "b2"):
        recovery.step(ev.LacRead(bookie=bookie, ledger_id=LEDGER_ID, status=Status.OK, lac=-1, disk=md.disk_of(0, bookie)))
    # e0's write set is b1, b2: b1 (no disk named) says NO_SUCH_LEDGER, b2 never answers
    assert recovery.step(ev.ReadFailed(bookie="b1", ledger_id=LEDGER_ID, entry_ids=[0], status=Status.NO_SUCH_LEDGER,
                                       disk=0)) == []
    assert recovery.last_entry_id is None
    legacy = LedgerMetadata(ledger_id=LEDGER_ID, ensemble_size=3, write_quorum=2, ack_quorum=2,
                            ensembles={0: ("b1", "b2", "b3")})
    recovery = LedgerRecovery(legacy, 0, master_key=cluster.master_key, digest=cluster.digest)
    recovery.start()
    recovery.step(ev.MetadataWritten(metadata=legacy.in_recovery(), version=1))
    for bookie in ("b1", "b2"):
        recovery.step(ev.LacRead(bookie=bookie, ledger_id=LEDGER_ID, status=Status.OK, lac=-1))
    recovery.step(ev.ReadFailed(bookie="b1", ledger_id=LEDGER_ID, entry_ids=[0], status=Status.NO_SUCH_LEDGER))
    assert recovery.last_entry_id == -1                        # no disks recorded: it counts, as before


def test_the_lac_reader_never_counts_a_replaced_disk():
    """Entry 5 is on b3 and b1; b3's disk was replaced (NO_SUCH_LEDGER) and b2 never held it: two
    answers, but only b2's counts, so the reader waits for b1 instead of ending at 4."""
    from walkit.core.reader import LacReader
    md = LedgerMetadata(ledger_id=LEDGER_ID, ensemble_size=3, write_quorum=2, ack_quorum=2,
                        ensembles={0: ("b1", "b2", "b3")}, disks={0: (1, 2, 3)})
    reader = LacReader(md)
    reader.start()
    assert reader.step(ev.LacRead(bookie="b3", ledger_id=LEDGER_ID, status=Status.NO_SUCH_LEDGER, disk=99)) == []
    assert reader.step(ev.LacRead(bookie="b2", ledger_id=LEDGER_ID, status=Status.OK, lac=3, last_entry_id=4,
                                  disk=2)) == []
    [done] = reader.step(ev.LacRead(bookie="b1", ledger_id=LEDGER_ID, status=Status.OK, lac=4, last_entry_id=5, disk=1))
    assert done.last_entry_id == 5


# -- the writer ---------------------------------------------------------------------------------
def play_forgotten_fence(writer_cls: type) -> tuple[ScriptedCluster, object]:
    """E3/Qw3/Qa2: recovery fences b1 and b2 and closes the ledger at e0; b1 restarts on an empty
    disk, forgetting its fence; the old writer's e1 reaches b1 and the unfenced b3."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = cluster._client("writer", writer_cls(cluster.store.metadata, cluster.store.version,
                                                  master_key=cluster.master_key, digest=cluster.digest), None)
    writer.append()
    cluster.deliver_all()
    assert writer.confirmed == 0
    recovery = cluster.recovery()
    cluster.cas(recovery)
    cluster.drop(to="b3", kind="lac")
    cluster.deliver_all(kind="lac")
    cluster.deliver_all(to="b1")
    cluster.deliver_all(to="b2")
    cluster.drop_all(to="b3")
    cluster.settle()
    assert cluster.store.metadata.state == CLOSED and cluster.store.metadata.last_entry_id == 0
    cluster.crash("b1")
    cluster.restart("b1", empty=True)
    writer.append()                                            # e1 -> b1 (new disk), b2 (fenced), b3
    cluster.deliver_all(to="b1")
    cluster.deliver_all(to="b3")
    cluster.deliver_all(to="writer", from_="b1")
    cluster.deliver_all(to="writer", from_="b3")
    return cluster, writer


def test_writer_never_counts_an_ack_from_a_disk_that_forgot_its_fence():
    cluster, writer = play_forgotten_fence(LedgerWriter)
    assert writer.completions == [0]
    cluster.settle()                                           # its ensemble change meets the CLOSED ledger
    assert writer.completions == [0] and [type(e) for e in writer.errors] == [LedgerFenced]
    assert writer.confirmed <= cluster.store.metadata.last_entry_id

    cluster, writer = play_forgotten_fence(WriterCountingEveryDisk)
    assert writer.completions == [0, 1]
    assert writer.confirmed > cluster.store.metadata.last_entry_id == 0    # e1 acknowledged after the close


def test_writer_takes_an_emptied_bookie_back_in_a_new_fragment_with_its_new_disk():
    """With no spare bookie, b2 back on a new disk replaces itself: a fragment from the LAC on,
    recording its new disk, and every entry not yet confirmed is sent to it again."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = cluster.writer()
    writer.append(2)
    cluster.deliver_all()
    cluster.crash("b2")
    cluster.restart("b2", empty=True)
    new_disk = cluster.bookies["b2"].disk
    writer.append()                                            # e2: b1 and b3 complete it, b2 answers last
    cluster.settle()
    md = cluster.store.metadata
    assert writer.completions[-1] == 2 and md.state == "OPEN"
    assert md.fragment_starts == [0, 3] and md.ensembles[3] == md.ensembles[0]
    assert md.disk_of(3, "b2") == new_disk and md.disk_of(2, "b2") != new_disk
    writer.append(2)
    cluster.settle()
    assert writer.completions[-1] == 4 and cluster.store.metadata.fragment_starts == [0, 3]
    assert cluster.payload_on("b2", 4) == b"e4"


def test_a_writer_with_adds_pending_forgets_what_the_old_disk_acknowledged():
    """b2 acknowledged e2 from its old disk, then restarted empty: that acknowledgement no longer
    counts, and e2 completes only with two acknowledgements from disks that hold it."""
    cluster = ScriptedCluster(bookies=4, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = cluster.writer()
    writer.append(2)
    cluster.deliver_all()
    writer.append()                                            # e2
    cluster.deliver(to="b2", kind="add")
    cluster.sync("b2")
    cluster.deliver(to="writer", from_="b2")                   # one ack of e2, from the old disk
    cluster.crash("b2")
    cluster.restart("b2", empty=True)
    writer.append()                                            # e3 -> b1, b2 (new disk), b3
    cluster.deliver(to="b2", kind="add")
    cluster.sync("b2")
    cluster.deliver(to="writer", from_="b2")                   # the new disk answers
    cluster.deliver(to="b1", kind="add", entry=2)
    cluster.sync("b1")
    assert cluster.deliver(to="writer", from_="b1") == []      # b1 + the old disk's ack: not Qa
    assert writer.completions[-1] == 1
    cluster.settle()
    assert writer.completions[-1] == 3
    md = cluster.store.metadata
    assert md.fragment_starts == [0, 2]
    assert [cluster.payload_on(b, 2) for b in md.ensembles[2]].count(b"e2") == 3


# -- reads --------------------------------------------------------------------------------------
def test_a_range_read_tells_an_emptied_disk_from_an_absent_entry():
    md = LedgerMetadata(ledger_id=LEDGER_ID, ensemble_size=2, write_quorum=2, ack_quorum=2,
                        ensembles={0: ("b1", "b2")}, disks={0: (1, 2)}, state=CLOSED, last_entry_id=0)
    reader = RangeReader(md, 0, 0, Digest("crc32c", b""))
    reader.start()
    reader.step(ev.EntriesRead(bookie="b1", ledger_id=LEDGER_ID, entries=[], missing=[0], lac=-1, disk=1))
    [failed] = reader.step(ev.EntriesRead(bookie="b2", ledger_id=LEDGER_ID, entries=[], missing=[0], lac=-1,
                                          disk=77))
    assert isinstance(failed.error, BookieError) and not isinstance(failed.error, NoSuchEntry)
    assert "replaced disk" in str(failed.error)

    reader = RangeReader(md, 0, 0, Digest("crc32c", b""))
    reader.start()
    reader.step(ev.ReadFailed(bookie="b1", ledger_id=LEDGER_ID, entry_ids=[0], status=Status.NO_SUCH_LEDGER, disk=1))
    [failed] = reader.step(ev.EntriesRead(bookie="b2", ledger_id=LEDGER_ID, entries=[], missing=[0], lac=-1, disk=2))
    assert isinstance(failed.error, NoSuchEntry)                 # both disks are the ones recorded


def test_recovery_of_a_ledger_in_recovery_starts_fencing_with_the_disks_recorded():
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=2, ack_quorum=2)
    assert cluster.store.metadata.disks == {0: (1, 2, 3)}
    cluster.transform_metadata(lambda md: md.in_recovery())
    assert cluster.store.metadata.state == IN_RECOVERY and cluster.store.metadata.disks == {0: (1, 2, 3)}


def test_a_pinned_bookie_back_on_a_new_disk_fails_the_writer_instead_of_renewing_in_place():
    """Guaranteed write quorum, E3/Qw3/Qa2: e0 is confirmed by b1 and b2 but not yet on b3, so b2 is
    pinned. b2 comes back on a new disk: a new fragment from LAFR + 1 = 0 would record the new disk
    over e0, which it lacks. The writer fails instead; the metadata still records b2's old disk."""
    from dataclasses import replace
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    cluster.store.metadata = replace(cluster.store.metadata, guaranteed_write_quorum=True)
    writer = cluster.writer()
    writer.append()
    for bookie in ("b1", "b2"):
        cluster.deliver(to=bookie, kind="add")
        cluster.sync(bookie)
        cluster.deliver(to="writer", from_=bookie)
    assert writer.completions == [0]
    cluster.crash("b2")
    cluster.restart("b2", empty=True)
    writer.append()                                            # e1 -> b1, b2 (new disk), b3
    cluster.deliver(to="b2", kind="add", entry=1)
    cluster.sync("b2")
    cluster.deliver(to="writer", from_="b2")
    assert [type(e) for e in writer.errors] == [NotEnoughBookies]
    assert cluster.store.metadata.fragment_starts == [0] and cluster.store.metadata.disk_of(0, "b2") == 2


def test_a_late_answer_from_a_replaced_disk_never_counts():
    """b2's old disk acknowledged e0, but the answer is late; meanwhile b2 came back on a new disk and
    its answer to e1 arrived first. The old disk's answer arrives next and counts for nothing: with
    b1's, e0 would have reached Qa on a copy that no longer exists."""
    cluster = ScriptedCluster(bookies=3, ensemble=3, write_quorum=3, ack_quorum=2)
    writer = cluster.writer()
    writer.append()                                            # e0
    cluster.deliver(to="b2", kind="add")
    cluster.sync("b2")                                         # b2's answer to e0 waits on the network
    cluster.crash("b2")
    cluster.restart("b2", empty=True)
    writer.append()                                            # e1
    cluster.deliver(to="b2", kind="add")
    cluster.sync("b2")
    cluster.deliver(to="writer", from_="b2", entry=1)          # the new disk first: b2 is renewed
    cluster.choose()                                           # b2 takes its own place: the CAS is in flight
    cluster.deliver(to="writer", from_="b2", entry=0)          # then the old disk's late answer
    cluster.deliver(to="b1", kind="add", entry=0)
    cluster.sync("b1")
    cluster.deliver(to="writer", from_="b1", entry=0)
    cluster.cas()                                              # the new fragment records b2's new disk
    assert writer.completions == []                            # b1 alone: e0 is not confirmed
    cluster.settle()
    assert writer.completions[-1] == 1 and cluster.read(0, 1) == entries(0, 1)
