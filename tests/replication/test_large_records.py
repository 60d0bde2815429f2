"""walkit.replicate and records larger than an entry can hold: refused at once, leadership untouched (issue 39).

Before, a record above the 64 MiB bookie frame failed its append on every bookie, the writer
failed, and a failed append deposes the leader: a bulk load became a leadership flap. Now
`submit` refuses it before anything is queued, and the group-commit batcher
(walkit.replication.batch.take) never packs records into an entry above the client's
`max_entry_bytes`.
"""

from __future__ import annotations

import collections
import random
import threading
import time

import pytest

import walkit
from walkit.errors import ConfigError, RecordTooLarge
from walkit.replication import batch

from walkit.testing.memory import MemoryCluster

from .machines import Counter
from .test_node import leader_of, same_history
from walkit.testing.processes import wait_until

HUNDRED_MIB = 100 * 1024 * 1024


@pytest.fixture
def cluster(tmp_path):
    """cluster is 4 in-process bookies with 10 s sessions (conftest's nodes fixture starts its nodes here).

    These tests check that leadership does not move; a 1 s session starved on a loaded machine
    would move it for a reason they are not about.
    """
    with MemoryCluster(f"sqlite://{tmp_path}/metadata.db?ttl=10", bookies=4, add_timeout=2.0,
                       request_timeout=2.0) as made:
        yield made


def leadership(node) -> tuple:
    """leadership is what a change of leadership would change: who leads, the election's epoch, the log's ledgers."""
    return (node.leader, node.election.epoch, node.ledger_id,
            tuple(node.client.log_metadata(node.log_name).ledger_ids))


def test_a_100_mib_submit_is_refused_at_once_and_the_leader_keeps_leading(nodes):
    group = nodes(3)
    leader = leader_of(group)
    assert leader.submit(b"first:1") == 1
    same_history(group)
    before = leadership(leader)
    end_before = leader._log_end()

    record = b"x" * HUNDRED_MIB
    started = time.monotonic()
    with pytest.raises(RecordTooLarge) as refused:          # raised by submit_async itself: no Future, no wait
        leader.submit_async(record)
    with pytest.raises(RecordTooLarge):
        leader.submit(record, timeout=60)
    assert time.monotonic() - started < 5.0
    error = refused.value
    assert (error.size, error.limit) == (HUNDRED_MIB, leader.max_record_bytes)
    assert error.limit == batch.max_record(leader.client.max_entry_bytes)
    assert error.setting == "walkit.replicate(max_record_bytes=...)"
    assert str(HUNDRED_MIB) in str(error) and str(error.limit) in str(error) and "max_record_bytes" in str(error)

    assert leader.is_leader and leader.election.is_leader
    assert leadership(leader) == before                   # same leader, epoch and ledger: nothing rolled
    assert leader._log_end() == end_before                # nothing was appended
    assert leader.submit(b"after:2") == 3                 # the next normal record is appended and applied
    assert same_history(group) == ["first", "after"]
    assert leadership(leader) == before
    for follower in (n for n in group if n is not leader):
        assert follower.machine.value == 3
        assert wait_until(lambda f=follower: f.leader) == leader.node_id


def test_a_follower_refuses_an_oversized_record_as_too_large_not_as_not_leader(nodes):
    group = nodes(2)
    leader = leader_of(group)
    follower = next(n for n in group if n is not leader)
    with pytest.raises(RecordTooLarge):
        follower.submit_async(b"y" * (follower.max_record_bytes + 1))


def test_max_record_bytes_is_a_setting_a_record_at_it_is_applied_and_one_byte_more_is_refused(nodes):
    group = nodes(2, max_record_bytes=1000)
    leader = leader_of(group)
    at_limit = b"a" * (1000 - 2) + b":1"
    assert leader.submit(at_limit) == 1
    with pytest.raises(RecordTooLarge) as refused:
        leader.submit(b"b" * (1001 - 2) + b":1")
    assert (refused.value.size, refused.value.limit) == (1001, 1000)
    assert leader.is_leader
    assert leader.submit(b"c:1") == 2
    assert same_history(group) == ["a" * 998, "c"]


def test_a_record_of_the_default_limit_fits_a_bookie_frame_and_reaches_every_node(nodes):
    """The default limit is no promise on paper: a record of exactly that size goes through real frames."""
    group = nodes(2)
    leader = leader_of(group)
    record = b"z" * (leader.max_record_bytes - 2) + b":5"
    assert leader.submit(record, timeout=120) == 5
    assert leader.submit(b"small:1") == 6
    for node in group:
        wait_until(lambda node=node: node.machine.value == 6, timeout=120, message=f"{node.node_id} applies both")
    assert leader.is_leader


def test_max_record_bytes_above_what_an_entry_holds_is_a_config_error(cluster):
    client = cluster.client(own_store=True, max_entry_bytes=4096)
    with pytest.raises(ConfigError, match="max_record_bytes"):
        walkit.replicate(Counter(), client=client, name="counter", node_id="n", max_record_bytes=4096)
    node = walkit.replicate(Counter(), client=client, name="counter", node_id="n", max_record_bytes=4096 - 9)
    node.close()


# -- the batcher ----------------------------------------------------------------------------------
def cut_all(sizes: list[int], max_records: int, max_bytes: int, max_entry: int) -> list[list[bytes]]:
    """cut_all cuts queued records of `sizes` into entries with batch.take until none is left."""
    queued = collections.deque((bytes([i % 251]) * size, i) for i, size in enumerate(sizes))
    entries = []
    while queued:
        taken, size = batch.take(queued, max_records, max_bytes, max_entry)
        assert taken, "take returned an empty entry with records queued"
        assert size == sum(len(r) for r, _ in taken)
        entries.append([r for r, _ in taken])
    return entries


def test_the_batcher_cuts_an_entry_before_the_record_that_would_take_it_over_the_limit():
    # 96-byte records cost 100 bytes each in an entry (their length), plus 5 bytes of header:
    # 9 records make 905 bytes, a 10th would make 1005 > 1000, though their 960 record bytes are under 1000
    entries = cut_all([96] * 20, max_records=4096, max_bytes=1000, max_entry=1000)
    assert [len(e) for e in entries] == [9, 9, 2]
    assert all(len(batch.encode(e)) <= 1000 for e in entries)
    # a record of exactly max_record(max_entry) fills an entry alone
    largest = batch.max_record(1000)
    entries = cut_all([10, largest, 10], max_records=4096, max_bytes=1 << 20, max_entry=1000)
    assert [len(e) for e in entries] == [1, 1, 1]
    assert len(batch.encode(entries[1])) == 1000


def test_the_batcher_never_builds_an_entry_over_the_limit():
    for seed in range(500):
        check_cuts(seed)


def check_cuts(seed: int) -> None:
    """check_cuts cuts random records under random limits (from `seed`) and checks every entry."""
    rng = random.Random(seed)
    max_entry = rng.choice([64, 200, 1000, 4096, 65536])
    largest = batch.max_record(max_entry)
    sizes = [rng.choice([0, 1, rng.randint(0, largest), largest, rng.randint(0, largest // 8 + 1)])
             for _ in range(rng.randint(1, 300))]
    max_records = rng.choice([1, 2, 7, 4096])
    max_bytes = rng.choice([1, 100, max_entry, 2 * max_entry, 1 << 20])
    entries = cut_all(sizes, max_records, max_bytes, max_entry)
    assert [len(r) for e in entries for r in e] == sizes, f"seed {seed}: records lost or reordered"
    for i, entry in enumerate(entries):
        encoded = batch.encode(entry)
        assert len(encoded) == batch.entry_size(sum(map(len, entry)), len(entry))
        assert len(encoded) <= max_entry, f"seed {seed}: entry {i} is {len(encoded)} bytes"
        assert len(entry) <= max_records
        assert len(entry) == 1 or sum(map(len, entry)) <= max_bytes
        if i + 1 < len(entries):                  # cut only where the next record would break a limit
            following = len(entries[i + 1][0])
            assert (len(entry) == max_records or sum(map(len, entry)) + following > max_bytes
                    or len(encoded) + batch.RECORD_OVERHEAD + following > max_entry), f"seed {seed}: cut early"


def test_records_queued_behind_a_full_window_leave_in_entries_cut_at_the_clients_limit(cluster):
    """max_batch_bytes (1 MiB) would let 119 queued 305-byte records share an entry; a 4 KiB entry limit cuts them."""
    client = cluster.client(own_store=True, max_entry_bytes=4096)
    node = walkit.replicate(Counter(), client=client, name="small", node_id="n", max_entries_in_flight=1,
                            max_batch_bytes=1 << 20)
    try:
        leader_of([node])
        gate = threading.Event()
        client._loop.call(lambda: gate.wait(30))   # hold the client's I/O thread: the first entry stays in flight
        try:
            futures = [node.submit_async(f"{'p' * 300}{i:03d}:1".encode()) for i in range(120)]
        finally:
            gate.set()
        assert [f.result(60) for f in futures] == list(range(1, 121))
        per_position = collections.Counter(position for position, _ in node.machine.log)
        sizes = [batch.entry_size(305 * count, count) for _, count in sorted(per_position.items())]
        per_entry = (4096 - batch.HEADER_BYTES) // (batch.RECORD_OVERHEAD + 305)          # 13
        # The 120 submits reach the leader's machine in one round of the held I/O thread: every
        # entry is cut at the 4 KiB limit, none at max_batch_bytes.
        assert sizes == [batch.entry_size(305 * n, n) for n in [per_entry] * (120 // per_entry) + [120 % per_entry]]
        assert max(sizes) <= 4096
        assert node.is_leader
    finally:
        node.close()
