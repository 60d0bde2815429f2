"""The real Client against in-process bookies (MemoryCluster): no processes, real frames.

These run in the fast tier. Faults are injected in the network: bookies killed and revived,
reply frames reordered or corrupted.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import pytest

import walkit
from walkit.core.messages import ReadResponse, WriteLacRequest
from walkit.errors import (
    ClientClosed, DigestMismatch, LedgerClosed, LedgerFenced, NoSuchEntry, NoSuchLedger, NotEnoughBookies,
    Timeout, Unauthorized, WalkitError,
)
from walkit.wire.codec import decode_requests, decode_responses, encode_requests, encode_responses

from .helpers import wait_until

PASSWORD = b"pw"


def payloads(count: int, size: int = 100, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def read_all(client, ledger_id: int, password: bytes = PASSWORD) -> list[bytes]:
    reader = client.open_ledger(ledger_id, password=password)
    entries = list(reader.read())
    assert [e.entry_id for e in entries] == list(range(len(entries)))
    return [e.payload for e in entries]


class ReorderingTransport:
    """ReorderingTransport wraps a client transport and delivers bookie replies out of order.

    It holds reply frames back until two frames from the same bookie are waiting (or nothing
    new arrived for 20 ms), then delivers everything it holds in the reverse of the arrival
    order: a later request's answer overtakes an earlier one's. `inversions` counts frames
    delivered before one that arrived earlier, `same_bookie_inversions` those where both came
    from the same bookie; `sends` counts frames sent.
    """

    QUIET_S = 0.02

    def __init__(self, inner) -> None:
        self.inner = inner
        self.held: list[tuple[int, str, bytes]] = []
        self.arrived = 0
        self.sends = 0
        self.inversions = 0
        self.same_bookie_inversions = 0
        self._last_arrival = 0.0

    def send(self, address: str, frame: bytes) -> bool:
        self.sends += 1
        return self.inner.send(address, frame)

    def is_up(self, address: str) -> bool:
        return self.inner.is_up(address)

    def wake(self) -> None:
        self.inner.wake()

    def close(self) -> None:
        self.inner.close()

    def poll(self, timeout_ms: int):
        received, down = self.inner.poll(min(timeout_ms, 5) if self.held else timeout_ms)
        now = time.monotonic()
        for bookie, frame in received:
            self.held.append((self.arrived, bookie, frame))
            self.arrived += 1
            self._last_arrival = now
        bookies = [bookie for _, bookie, _ in self.held]
        if not self.held or (len(set(bookies)) == len(bookies) and now - self._last_arrival < self.QUIET_S):
            return [], down
        release = sorted(self.held, key=lambda item: item[0], reverse=True)
        self.held = []
        for i, (seq, bookie, _) in enumerate(release):
            later = release[i + 1:]
            self.inversions += bool(later)
            self.same_bookie_inversions += any(b == bookie for _, b, _ in later)
        return [(bookie, frame) for _, bookie, frame in release], down


def corrupt_reads(bad: set[str], counter: dict[str, int]):
    """corrupt_reads returns a MemoryNetwork.tamper hook flipping read payloads from `bad` bookies."""
    lock = threading.Lock()

    def tamper(address: str, frame: bytes) -> bytes:
        if address not in bad:
            return frame
        out = []
        for response in decode_responses(frame):
            if isinstance(response, ReadResponse) and response.entries:
                with lock:
                    counter[address] = counter.get(address, 0) + len(response.entries)
                response = dataclasses.replace(response, entries=[
                    e._replace(payload=bytes([e.payload[0] ^ 0x01]) + e.payload[1:]) for e in response.entries])
            out.append(response)
        return encode_responses(out)
    return tamper


# -- basics ----------------------------------------------------------------------------------------
def test_append_and_read_round_trip(memory_cluster):
    data = payloads(50, 300)
    writer_client, reader_client = memory_cluster.client(), memory_cluster.client()
    writer = writer_client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    assert writer.last_add_confirmed == -1
    assert [writer.append(p) for p in data[:10]] == list(range(10))
    futures = [writer.append_async(p) for p in data[10:]]
    assert [f.result(10) for f in futures] == list(range(10, 50))
    assert writer.last_add_confirmed == 49
    closed = writer.close()
    assert (closed.state, closed.last_entry_id) == (walkit.CLOSED, 49)
    assert writer_client.list_ledgers() == [writer.ledger_id]
    assert read_all(reader_client, writer.ledger_id) == data
    reader = reader_client.open_ledger(writer.ledger_id, password=PASSWORD)
    assert [e.payload for e in reader.read(17, 23)] == data[17:24]


def test_empty_ledger_closes_at_minus_one_and_reads_nothing(memory_cluster):
    client = memory_cluster.client()
    writer = client.create_ledger(password=PASSWORD)
    closed = writer.close()
    assert (closed.state, closed.last_entry_id) == (walkit.CLOSED, -1)
    reader = client.open_ledger(writer.ledger_id, password=PASSWORD)
    assert reader.last_add_confirmed == -1 and list(reader.read()) == []


@pytest.mark.parametrize("digest", ["crc32c", "hmac-sha256", "none"])
def test_every_digest_type_round_trips(memory_cluster, digest):
    client = memory_cluster.client()
    writer = client.create_ledger(password=PASSWORD, digest=digest)
    data = payloads(20, 64, seed=1) + [b""]
    for p in data:
        writer.append(p)
    writer.close()
    assert client.ledger_metadata(writer.ledger_id).digest_type == digest
    assert read_all(memory_cluster.client(), writer.ledger_id) == data


def test_append_after_close_raises_ledger_closed(memory_cluster):
    writer = memory_cluster.client().create_ledger(password=PASSWORD)
    writer.append(b"only")
    writer.close()
    with pytest.raises(LedgerClosed):
        writer.append(b"more", timeout=5)
    with pytest.raises(TypeError):
        writer.append_async("not bytes")


def test_reading_past_the_lac_raises_no_such_entry(memory_cluster):
    client = memory_cluster.client()
    writer = client.create_ledger(password=PASSWORD)
    for p in payloads(5):
        writer.append(p)
    writer.close()
    reader = client.open_ledger(writer.ledger_id, password=PASSWORD)
    with pytest.raises(NoSuchEntry):
        reader.read(0, 5)


def test_unknown_ledger_and_wrong_password(memory_cluster):
    client = memory_cluster.client()
    with pytest.raises(NoSuchLedger):
        client.open_ledger(424242)
    with pytest.raises(NoSuchLedger):
        client.delete_ledger(424242)
    writer = client.create_ledger(password=PASSWORD)
    writer.append(b"x")
    for recover in (False, True):
        with pytest.raises(Unauthorized):
            memory_cluster.client().open_ledger(writer.ledger_id, password=b"nope", recover=recover)
    assert writer.append(b"y") == 1                # nothing was fenced by the refused opens


def test_closed_client_refuses_calls(memory_cluster):
    client = memory_cluster.client()
    writer = client.create_ledger(password=PASSWORD)
    writer.append(b"x")
    client.close()
    with pytest.raises(ClientClosed):
        client.create_ledger(password=PASSWORD)
    with pytest.raises(ClientClosed):
        client.list_ledgers()
    with pytest.raises(ClientClosed):
        writer.append_async(b"after close")


# -- out-of-order replies --------------------------------------------------------------------------
def test_out_of_order_replies_still_complete_adds_in_order(memory_cluster):
    transport = ReorderingTransport(memory_cluster.network.transport())
    data = payloads(1500, 64, seed=2)
    completed: list[int] = []
    with walkit.Client(memory_cluster.store, transport=transport, add_timeout=5.0, request_timeout=5.0) as client:
        writer = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        futures = []
        for start in range(0, 1500, 50):            # 30 batches, each sent in frames of its own
            sent = transport.sends
            for p in data[start:start + 50]:
                future = writer.append_async(p)
                future.add_done_callback(lambda f: completed.append(f.result()))
                futures.append(future)
            wait_until(lambda: transport.sends > sent, timeout=10)
        assert [f.result(10) for f in futures] == list(range(1500))
        writer.close()
        assert completed == list(range(1500))       # futures resolved strictly in entry order
        assert transport.inversions > 0 and transport.same_bookie_inversions > 0
        # Reads through the same reordering transport come back in entry order too.
        before = transport.inversions
        assert read_all(client, writer.ledger_id) == data
        assert transport.inversions > before
    assert read_all(memory_cluster.client(), writer.ledger_id) == data


# -- losing a bookie ----------------------------------------------------------------------------
def test_killing_a_bookie_during_pipelined_appends_changes_the_ensemble(memory_cluster):
    spare = memory_cluster.add_bookie()
    client = memory_cluster.client()
    writer = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    first_ensemble = writer.metadata.ensembles[0]
    spare_address = memory_cluster.addresses[spare]
    if spare_address in first_ensemble:           # the 4th bookie was picked: another one is spare then
        (spare_address,) = set(memory_cluster.addresses) - set(first_ensemble)
    victim_address = first_ensemble[1]
    victim = memory_cluster.addresses.index(victim_address)

    data = payloads(3000, 200, seed=3)
    futures = []
    reached = threading.Event()                   # entry 1000 is acknowledged
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for i, p in enumerate(data):
                futures.append(writer.append_async(p))
                if i == 1000:
                    futures[i].add_done_callback(lambda _: reached.set())
                if i >= 200:
                    futures[i - 200].result(10)       # keep ~200 in flight
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        assert reached.wait(20)
        memory_cluster.kill(victim)
        produced = len(futures)
        in_flight = produced < len(data) or not futures[-1].done()
    finally:
        producer.join(30)
    assert not errors, errors
    assert in_flight, "the stream of appends was over before the kill"
    assert [f.result(20) for f in futures] == list(range(3000))
    closed = writer.close()
    assert closed.last_entry_id == 2999

    metadata = memory_cluster.client().ledger_metadata(writer.ledger_id)
    starts = metadata.fragment_starts
    assert len(starts) == 2 and starts[0] == 0 and 1000 < starts[1] <= 3000
    assert metadata.ensembles[0] == first_ensemble
    second = metadata.ensembles[starts[1]]
    assert victim_address not in second and spare_address in second
    assert [b for b in second if b != spare_address] == [b for b in first_ensemble if b != victim_address]
    # The victim stays down: reads of its entries fall back to the other replica.
    assert read_all(memory_cluster.client(), writer.ledger_id) == data


def test_reads_survive_one_dead_replica_and_fail_cleanly_without_any(memory_cluster):
    client = memory_cluster.client(request_timeout=1.0)
    writer = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    data = payloads(30)
    for p in data:
        writer.append(p)
    writer.close()
    ensemble = writer.metadata.ensembles[0]
    memory_cluster.kill(memory_cluster.addresses.index(ensemble[0]))
    assert read_all(memory_cluster.client(), writer.ledger_id) == data
    memory_cluster.kill(memory_cluster.addresses.index(ensemble[1]))
    reader = memory_cluster.client().open_ledger(writer.ledger_id, password=PASSWORD)
    # Entry 0 lives on ensemble[0] and ensemble[1] only: both are down.
    with pytest.raises(WalkitError) as failure:
        list(reader.read(0, 0, timeout=10))
    assert not isinstance(failure.value, (Timeout, DigestMismatch))
    assert [e.payload for e in reader.read(1, 1)] == [data[1]]     # entry 1 is also on ensemble[2]
    memory_cluster.revive(memory_cluster.addresses.index(ensemble[0]))
    assert [e.payload for e in reader.read(0, 0)] == [data[0]]


def test_no_replacement_bookie_fails_appends_with_not_enough_bookies(memory_cluster):
    client = memory_cluster.client()
    writer = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
    assert writer.append(b"before") == 0
    memory_cluster.kill(0)
    with pytest.raises(NotEnoughBookies):
        writer.append(b"after", timeout=15)


# -- recovery ----------------------------------------------------------------------------------
def test_recovery_fences_the_writer_and_keeps_every_acked_entry(memory_cluster):
    writer_client, recoverer = memory_cluster.client(), memory_cluster.client()
    writer = writer_client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    data = payloads(200)
    assert [f.result(10) for f in [writer.append_async(p) for p in data]] == list(range(200))
    reader = recoverer.open_ledger(writer.ledger_id, password=PASSWORD, recover=True)
    assert reader.is_closed and reader.last_add_confirmed == 199
    with pytest.raises(LedgerFenced):
        writer.append(b"fenced", timeout=10)
    assert [e.payload for e in reader.read()] == data


def test_concurrent_recoveries_converge_on_one_last_entry(memory_cluster):
    writer = memory_cluster.client().create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    for p in payloads(100):
        writer.append(p)
    results: list = []
    barrier = threading.Barrier(3)

    def recover() -> None:
        client = memory_cluster.client()
        barrier.wait()
        try:
            results.append(client.open_ledger(writer.ledger_id, password=PASSWORD, recover=True).metadata)
        except BaseException as exc:  # noqa: BLE001
            results.append(exc)

    threads = [threading.Thread(target=recover) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 3 and not [r for r in results if isinstance(r, BaseException)], results
    assert {(m.state, m.last_entry_id) for m in results} == {(walkit.CLOSED, 99)}


# -- corrupt replies ----------------------------------------------------------------------------
def test_tampered_replies_from_one_bookie_make_reads_fall_back(memory_cluster):
    client = memory_cluster.client()
    writer = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    data = payloads(120, 50, seed=9)
    for p in data:
        writer.append(p)
    writer.close()
    bad = writer.metadata.ensembles[0][2]
    counter: dict[str, int] = {}
    memory_cluster.network.tamper = corrupt_reads({bad}, counter)
    assert read_all(memory_cluster.client(), writer.ledger_id) == data
    assert counter.get(bad, 0) >= 40                # it was asked first for a third of the entries

    memory_cluster.network.tamper = corrupt_reads(set(memory_cluster.addresses), counter)
    with pytest.raises(DigestMismatch):
        list(memory_cluster.client().open_ledger(writer.ledger_id, password=PASSWORD).read())


# -- more reading ------------------------------------------------------------------------------
def test_long_read_streams_past_the_read_window(memory_cluster):
    """10,000 entries: more than the reader's window (4,096), so consumption must refill it."""
    client = memory_cluster.client()
    writer = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    data = [b"%05d" % i for i in range(10_000)]
    assert [f.result(20) for f in [writer.append_async(p) for p in data]][-1] == 9_999
    writer.close()
    reader = memory_cluster.client().open_ledger(writer.ledger_id, password=PASSWORD)
    assert [e.payload for e in reader.read()] == data
    assert [e.payload for e in reader.read(4_000, 8_500)] == data[4_000:8_501]


def test_tailing_reader_follows_the_writer_across_an_ensemble_change(memory_cluster):
    memory_cluster.add_bookie()
    writer = memory_cluster.client().create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    data = payloads(200, 40, seed=21)
    for p in data[:50]:
        writer.append(p)
    reader = memory_cluster.client().open_ledger(writer.ledger_id, password=PASSWORD, recover=False)
    seen = reader.last_add_confirmed
    assert [e.payload for e in reader.read()] == data[:seen + 1]

    memory_cluster.kill(memory_cluster.addresses.index(writer.metadata.ensembles[0][0]))
    assert [f.result(10) for f in [writer.append_async(p) for p in data[50:]]] == list(range(50, 200))
    assert len(writer.metadata.ensembles) == 2

    wait_until(lambda: reader.read_last_add_confirmed() >= 198, timeout=10)
    assert len(reader.metadata.ensembles) == 2           # the refresh picked up the new fragment
    assert [e.payload for e in reader.read(seen + 1, reader.last_add_confirmed)] == \
        data[seen + 1:reader.last_add_confirmed + 1]
    assert memory_cluster.client().ledger_metadata(writer.ledger_id).state == walkit.OPEN


def test_recovery_of_a_ledger_whose_writer_went_away(memory_cluster):
    writer_client = memory_cluster.client()
    writer = writer_client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
    data = payloads(77)
    for future in [writer.append_async(p) for p in data]:
        future.result(10)
    writer_client.close()                                # the writer is gone; the ledger stays OPEN
    client = memory_cluster.client()
    assert client.ledger_metadata(writer.ledger_id).state == walkit.OPEN
    reader = client.open_ledger(writer.ledger_id, password=PASSWORD, recover=True)
    assert (reader.metadata.state, reader.metadata.last_entry_id) == (walkit.CLOSED, 76)
    assert [e.payload for e in reader.read()] == data
    # Recovering a closed ledger again changes nothing.
    again = memory_cluster.client().open_ledger(writer.ledger_id, password=PASSWORD, recover=True)
    assert again.metadata == reader.metadata


def test_concurrent_ledger_creation_gets_distinct_ids(memory_cluster):
    ids: list[int] = []
    lock = threading.Lock()

    def create(n: int) -> None:
        client = memory_cluster.client()
        for i in range(5):
            writer = client.create_ledger(password=PASSWORD)
            writer.append(b"%d-%d" % (n, i))
            writer.close()
            with lock:
                ids.append(writer.ledger_id)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(ids) == 40 and len(set(ids)) == 40
    assert memory_cluster.client().list_ledgers() == sorted(ids)


class NoExplicitLacTransport:
    """NoExplicitLacTransport drops WriteLac requests, so bookies only know the LACs entries carried.

    A pipelined batch carries LAC -1, so a recoverer must then read and write back every entry:
    the write-back path is exercised for sure.
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.dropped = 0

    def send(self, address: str, frame: bytes) -> bool:
        requests = decode_requests(frame)
        kept = [r for r in requests if not isinstance(r, WriteLacRequest)]
        self.dropped += len(requests) - len(kept)
        return True if not kept else self.inner.send(address, encode_requests(kept))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _write_without_explicit_lac(memory_cluster, count: int):
    transport = NoExplicitLacTransport(memory_cluster.network.transport())
    client = walkit.Client(memory_cluster.store, transport=transport, add_timeout=2.0, request_timeout=2.0)
    writer = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    data = payloads(count)
    assert [f.result(10) for f in [writer.append_async(p) for p in data]] == list(range(count))
    return client, writer, data


def test_recovery_with_one_bookie_down_writes_back_to_a_spare(memory_cluster):
    memory_cluster.add_bookie()
    writer_client, writer, data = _write_without_explicit_lac(memory_cluster, 90)
    try:
        ensemble = writer.metadata.ensembles[0]
        dead = ensemble[2]
        memory_cluster.kill(memory_cluster.addresses.index(dead))
        # Precondition: the bookies know little of the LAC, so recovery must write entries back.
        assert max(memory_cluster.service(memory_cluster.addresses.index(b)).handler.lac(writer.ledger_id)
                   for b in ensemble[:2]) < 80
        reader = memory_cluster.client().open_ledger(writer.ledger_id, password=PASSWORD, recover=True)
        assert (reader.metadata.state, reader.metadata.last_entry_id) == (walkit.CLOSED, 89)
        assert [e.payload for e in reader.read()] == data
        # The spare replaces the dead bookie from the first entry not yet written back in full
        # when the replacement was chosen: a later fragment, or fragment 0 itself if none was.
        spare = next(b for b in memory_cluster.addresses if b not in ensemble)
        fragments = reader.metadata.ensembles
        assert len(fragments) in (1, 2) and min(fragments) == 0
        assert fragments[max(fragments)] == tuple(spare if b == dead else b for b in ensemble)
        with pytest.raises(LedgerFenced):
            writer.append(b"late", timeout=10)
    finally:
        writer_client.close()


def test_recovery_that_cannot_fence_times_out_and_can_be_resumed(memory_cluster):
    writer = memory_cluster.client().create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    data = payloads(30)
    for future in [writer.append_async(p) for p in data]:
        future.result(10)
    down = [memory_cluster.addresses.index(b) for b in writer.metadata.ensembles[0][:2]]
    for i in down:
        memory_cluster.kill(i)                     # EC = E - Qa + 1 = 2 answers needed, 1 bookie left
    client = memory_cluster.client()
    with pytest.raises(Timeout):
        client.open_ledger(writer.ledger_id, password=PASSWORD, recover=True, timeout=1.5)
    assert client.ledger_metadata(writer.ledger_id).state == walkit.IN_RECOVERY
    for i in down:
        memory_cluster.revive(i)
    reader = memory_cluster.client().open_ledger(writer.ledger_id, password=PASSWORD, recover=True)
    assert (reader.metadata.state, reader.metadata.last_entry_id) == (walkit.CLOSED, 29)
    assert [e.payload for e in reader.read()] == data
    with pytest.raises(LedgerFenced):
        writer.append(b"late", timeout=10)


def test_recovery_without_a_replacement_for_a_dead_bookie_fails_within_its_timeout(memory_cluster):
    """E = 3 on 3 bookies, one dead: write-backs cannot reach Qa = 2 anywhere, so recovery must fail, not hang."""
    writer_client, writer, _ = _write_without_explicit_lac(memory_cluster, 30)
    try:
        memory_cluster.kill(memory_cluster.addresses.index(writer.metadata.ensembles[0][2]))
        client = memory_cluster.client()
        started = time.monotonic()
        with pytest.raises(WalkitError) as failure:
            client.open_ledger(writer.ledger_id, password=PASSWORD, recover=True, timeout=2.0)
        assert time.monotonic() - started < 10
        assert str(failure.value)
        assert client.ledger_metadata(writer.ledger_id).state != walkit.CLOSED
    finally:
        writer_client.close()


# -- long-poll tailing ---------------------------------------------------------------------------
def test_wait_for_lac_returns_when_the_writer_confirms_more(memory_cluster):
    writer = memory_cluster.client().create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
    writer.append(b"zero")
    writer.append(b"one")
    reader = memory_cluster.client().open_ledger(writer.ledger_id, password=PASSWORD)
    above = reader.read_last_add_confirmed()
    result: list[int] = []
    waiter = threading.Thread(target=lambda: result.append(reader.wait_for_lac(above, timeout=20)))
    started = time.monotonic()
    waiter.start()
    writer.append(b"two")
    writer.append(b"three")
    waiter.join(30)
    assert result and result[0] > above
    assert time.monotonic() - started < 10          # woken by the add, not by the 20 s poll timeout
    assert [e.payload for e in reader.read(0, result[0])] == [b"zero", b"one", b"two", b"three"][:result[0] + 1]


def test_wait_for_lac_without_new_entries_returns_after_its_timeout(memory_cluster):
    writer = memory_cluster.client().create_ledger(password=PASSWORD)
    writer.append(b"zero")
    writer.append(b"one")
    reader = memory_cluster.client().open_ledger(writer.ledger_id, password=PASSWORD)
    lac = wait_until(lambda: reader.read_last_add_confirmed() == 1 and 1, timeout=10)
    started = time.monotonic()
    assert reader.wait_for_lac(lac, timeout=0.5) == lac
    assert 0.4 <= time.monotonic() - started < 5
    writer.close()
    assert reader.wait_for_lac(lac, timeout=5) == 1       # closed: the final LAC at once
    assert reader.wait_for_lac(0, timeout=5) == 1         # already above: no waiting
