"""Ledgers end to end on real bookie processes (LocalCluster: 3 bookies), on every metadata backend.

Every test runs three times: with SQLite metadata, on a real ZooKeeper server and on a real etcd
server. A test that stops, restarts or adds bookies gets a cluster of its own (`local_cluster`,
which overrides the shared one); the others share one cluster per backend (`shared_cluster`),
each working on ledgers it created.
"""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest

import walkit
from walkit.core.messages import ReadResponse, Status
from walkit.errors import (
    ConfigError, DigestMismatch, LedgerFenced, NoSuchEntry, NoSuchLedger, NotEnoughBookies, Unauthorized,
)
from walkit.transport.zmq import ZmqTransport
from walkit.wire.codec import decode_responses, encode_responses

from walkit.local import LocalCluster

from ..conftest import BACKENDS, fresh_metadata_url
from .helpers import RawBookie, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=BACKENDS)
def shared_cluster(request, tmp_path_factory):
    """shared_cluster is 3 real bookie processes (memory storage) on each metadata backend, shared by
    the tests that leave the bookies as they found them."""
    data = tmp_path_factory.mktemp("shared")
    with LocalCluster(bookies=3, data_dir=str(data / "cluster"), storage="memory",
                      metadata=fresh_metadata_url(request, request.param, data),
                      bookie_args=("--gc-interval", "0.2")) as cluster:
        yield cluster


@pytest.fixture
def local_cluster(tmp_path, backend_metadata_url):
    """local_cluster is 3 real bookie processes (memory storage) on each metadata backend."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory", metadata=backend_metadata_url,
                      bookie_args=("--gc-interval", "0.2")) as cluster:
        yield cluster

PASSWORD = b"secret"


def payloads(count: int, size: int = 1024, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def write_ledger(client: walkit.Client, data: list[bytes], *, close: bool = True, **quorums) -> walkit.WriteHandle:
    quorums = {"ensemble": 3, "write_quorum": 2, "ack_quorum": 2, **quorums}
    writer = client.create_ledger(**quorums, password=PASSWORD)
    futures = [writer.append_async(p) for p in data]
    assert [f.result(timeout=30) for f in futures] == list(range(len(data)))
    if close:
        writer.close()
    return writer


class CorruptingTransport(ZmqTransport):
    """CorruptingTransport flips payload bytes of read responses from some bookies.

    Only ReadResponse entries are touched (adds, LAC reads and errors pass unchanged), so the
    digest check is the only thing between the reader and the bad bytes.
    """

    def __init__(self, corrupt: set[str], **options) -> None:
        super().__init__(**options)
        self.corrupt = set(corrupt)
        self.corrupted: dict[str, int] = {}          # bookie -> entries it served corrupted
        self._lock = threading.Lock()

    def poll(self, timeout_ms: int):
        received, down = super().poll(timeout_ms)
        return [(bookie, self._rewrite(bookie, frame)) for bookie, frame in received], down

    def _rewrite(self, bookie: str, frame: bytes) -> bytes:
        if bookie not in self.corrupt:
            return frame
        responses = decode_responses(frame)
        rewritten = []
        for response in responses:
            if isinstance(response, ReadResponse) and response.entries:
                entries = [e._replace(payload=bytes(b ^ 0xFF for b in e.payload[:8]) + e.payload[8:])
                           for e in response.entries]
                with self._lock:
                    self.corrupted[bookie] = self.corrupted.get(bookie, 0) + len(entries)
                response = dataclasses.replace(response, entries=entries)
            rewritten.append(response)
        return encode_responses(rewritten)


# -- the big round trip ----------------------------------------------------------------------------
def test_2000_pipelined_1k_entries_read_back_identical_by_a_second_client(shared_cluster):
    data = payloads(2000, 1024, seed=42)
    with walkit.Client(shared_cluster.metadata_url) as writer_client:
        writer = writer_client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        futures = [writer.append_async(p) for p in data]
        assert [f.result(timeout=60) for f in futures] == list(range(2000))
        assert writer.last_add_confirmed == 1999
        closed = writer.close()
        assert (closed.state, closed.last_entry_id) == (walkit.CLOSED, 1999)
        ledger_id = writer.ledger_id

    with walkit.Client(shared_cluster.metadata_url) as reader_client:
        metadata = reader_client.ledger_metadata(ledger_id)
        assert (metadata.state, metadata.last_entry_id) == (walkit.CLOSED, 1999)
        assert (metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum) == (3, 2, 2)
        assert set(metadata.ensembles[0]) == set(shared_cluster.addresses)
        reader = reader_client.open_ledger(ledger_id, password=PASSWORD)
        assert reader.is_closed and reader.last_add_confirmed == 1999
        entries = list(reader.read(0, 1999))
        assert [e.entry_id for e in entries] == list(range(2000))
        assert [e.payload for e in entries] == data


def test_entries_are_replicated_on_their_write_sets(shared_cluster):
    """Each entry is on exactly the Qw bookies of its write set (E3/Qw2), as the raw bookies show."""
    data = payloads(30, 64, seed=7)
    with walkit.Client(shared_cluster.metadata_url) as client:
        writer = write_ledger(client, data)
        ensemble = client.ledger_metadata(writer.ledger_id).ensembles[0]
    for index, address in enumerate(ensemble):
        with RawBookie(address) as raw:
            stored = {e.entry_id: e.payload for e in raw.read(writer.ledger_id, list(range(30))).entries}
        expected = {e for e in range(30) if index in ((e % 3), (e + 1) % 3)}
        assert set(stored) == expected
        assert all(stored[e] == data[e] for e in stored)


# -- tailing without fencing ---------------------------------------------------------------------
def test_non_fencing_reader_tails_a_live_writer_without_disturbing_it(shared_cluster):
    data = payloads(300, 256, seed=3)
    with walkit.Client(shared_cluster.metadata_url) as writer_client, \
            walkit.Client(shared_cluster.metadata_url) as reader_client:
        writer = writer_client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        for p in data[:10]:
            writer.append(p)

        reader = reader_client.open_ledger(writer.ledger_id, password=PASSWORD, recover=False)
        assert not reader.is_closed
        seen = reader.last_add_confirmed
        assert 0 <= seen <= 9                         # entry 9 carries LAC 8; an explicit LAC may say 9
        entries = list(reader.read())
        assert [e.entry_id for e in entries] == list(range(seen + 1))
        assert [e.payload for e in entries] == data[:seen + 1]
        with pytest.raises(NoSuchEntry):
            reader.read(0, seen + 1)                  # beyond what it saw confirmed

        written = 10
        for chunk_end in (100, 200, 300):
            futures = [writer.append_async(p) for p in data[written:chunk_end]]
            assert [f.result(timeout=30) for f in futures] == list(range(written, chunk_end))
            written = chunk_end
            previous = seen
            seen = wait_until(lambda: reader.read_last_add_confirmed() >= written - 2 and reader.last_add_confirmed,
                              timeout=10, message="the reader's LAC did not follow the writer")
            assert previous < seen <= written - 1
            fresh = list(reader.read(previous + 1, seen))
            assert [e.entry_id for e in fresh] == list(range(previous + 1, seen + 1))
            assert [e.payload for e in fresh] == data[previous + 1:seen + 1]
            # Still OPEN for everyone: the reader fenced nothing.
            assert reader_client.ledger_metadata(writer.ledger_id).state == walkit.OPEN
            assert writer_client.ledger_metadata(writer.ledger_id).state == walkit.OPEN

        assert writer.append(b"after tailing") == 300
        closed = writer.close()
        assert (closed.state, closed.last_entry_id) == (walkit.CLOSED, 300)
        assert reader.read_last_add_confirmed() == 300
        assert [e.payload for e in reader.read(299, 300)] == [data[299], b"after tailing"]


# -- passwords -----------------------------------------------------------------------------------
@pytest.mark.parametrize("recover", [False, True], ids=["no-recovery", "recovery"])
def test_wrong_password_is_refused_and_the_right_one_works(shared_cluster, recover):
    data = payloads(5, 100, seed=5)
    with walkit.Client(shared_cluster.metadata_url) as writer_client, \
            walkit.Client(shared_cluster.metadata_url) as other:
        writer = writer_client.create_ledger(password=PASSWORD)
        for p in data:
            writer.append(p)
        for wrong in (b"wrong", b"", "secret ", PASSWORD + b"\x00"):
            with pytest.raises(Unauthorized):
                other.open_ledger(writer.ledger_id, password=wrong, recover=recover)
        # The refused attempts changed nothing: still OPEN and the writer goes on.
        assert other.ledger_metadata(writer.ledger_id).state == walkit.OPEN
        assert writer.append(b"six") == 5

        reader = other.open_ledger(writer.ledger_id, password=PASSWORD, recover=recover)
        if recover:
            assert reader.is_closed and reader.last_add_confirmed == 5
        else:
            assert not reader.is_closed and reader.last_add_confirmed >= 4   # entry 5 carried LAC 4
        entries = list(reader.read())
        assert [e.payload for e in entries] == (data + [b"six"])[:reader.last_add_confirmed + 1]


def test_password_given_as_str_matches_the_same_bytes(shared_cluster):
    with walkit.Client(shared_cluster.metadata_url) as client:
        writer = client.create_ledger(password="pässword")
        writer.append(b"x")
        writer.close()
        reader = client.open_ledger(writer.ledger_id, password="pässword".encode())
        assert [e.payload for e in reader.read()] == [b"x"]


# -- corrupt replicas ------------------------------------------------------------------------------
def test_reader_skips_a_replica_that_returns_corrupt_bytes(shared_cluster):
    data = payloads(300, 512, seed=11)
    with walkit.Client(shared_cluster.metadata_url) as client:
        ledger_id = write_ledger(client, data).ledger_id
        bad = client.ledger_metadata(ledger_id).ensembles[0][0]     # first replica of entries 0, 3, 6, ...

    transport = CorruptingTransport({bad})
    with walkit.Client(shared_cluster.metadata_url, transport=transport) as reader_client:
        entries = list(reader_client.open_ledger(ledger_id, password=PASSWORD).read())
    assert [e.entry_id for e in entries] == list(range(300))
    assert [e.payload for e in entries] == data
    # The corruption really happened: the bad bookie answered (corrupted) for its entries.
    assert transport.corrupted.get(bad, 0) >= 100


@pytest.mark.parametrize("digest", ["crc32c", "hmac-sha256"])
def test_corruption_on_every_replica_raises_digest_mismatch(shared_cluster, digest):
    data = payloads(20, 128, seed=13)
    with walkit.Client(shared_cluster.metadata_url) as client:
        writer = client.create_ledger(password=PASSWORD, digest=digest)
        for p in data:
            writer.append(p)
        writer.close()

    transport = CorruptingTransport(set(shared_cluster.addresses))
    with walkit.Client(shared_cluster.metadata_url, transport=transport) as reader_client:
        reader = reader_client.open_ledger(writer.ledger_id, password=PASSWORD)
        with pytest.raises(DigestMismatch):
            list(reader.read())
        # A range whose entries are all corrupt fails too, even a single entry.
        with pytest.raises(DigestMismatch):
            list(reader.read(7, 7))
    assert sum(transport.corrupted.values()) >= 2


# -- configuration errors --------------------------------------------------------------------------
def test_ensemble_larger_than_the_live_bookies_raises_not_enough_bookies(local_cluster):
    with walkit.Client(local_cluster.metadata_url) as client:
        with pytest.raises(NotEnoughBookies):
            client.create_ledger(ensemble=4, write_quorum=2, ack_quorum=2)
        assert client.list_ledgers() == []
        local_cluster.stop_bookie(2)                  # deregisters at once: 2 live bookies left
        with pytest.raises(NotEnoughBookies):
            client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
        writer = client.create_ledger(ensemble=2, write_quorum=2, ack_quorum=2)
        assert set(writer.metadata.ensembles[0]) == set(local_cluster.addresses[:2])
        assert writer.append(b"fits") == 0
        writer.close()


@pytest.mark.parametrize("ensemble,write_quorum,ack_quorum", [
    (2, 3, 2),          # E < Qw
    (3, 2, 3),          # Qw < Qa
    (3, 2, 0),          # Qa < 1
    (0, 0, 0),
])
def test_invalid_quorums_raise_config_error(shared_cluster, ensemble, write_quorum, ack_quorum):
    with walkit.Client(shared_cluster.metadata_url) as client:
        before = client.list_ledgers()                # the ledgers the module's other tests made
        with pytest.raises(ConfigError):
            client.create_ledger(ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum)
        assert client.list_ledgers() == before


# -- deletion ------------------------------------------------------------------------------------
def test_deleted_ledger_leaves_the_metadata_and_the_bookies(shared_cluster):
    with walkit.Client(shared_cluster.metadata_url) as client:
        others = client.list_ledgers()                # the ledgers the module's other tests made
        doomed = write_ledger(client, payloads(20, 100, seed=1)).ledger_id
        kept_data = payloads(20, 100, seed=2)
        kept = write_ledger(client, kept_data).ledger_id
        assert client.list_ledgers() == sorted(others + [doomed, kept])

        raws = [RawBookie(a) for a in shared_cluster.addresses]
        try:
            for raw in raws:                        # every bookie holds both ledgers (E = 3)
                assert raw.read_lac(doomed).status == Status.OK
                assert raw.read_lac(kept).status == Status.OK

            client.delete_ledger(doomed)
            assert client.list_ledgers() == sorted(others + [kept])
            with pytest.raises(NoSuchLedger):
                client.ledger_metadata(doomed)
            with pytest.raises(NoSuchLedger):
                client.open_ledger(doomed, password=PASSWORD)
            with pytest.raises(NoSuchLedger):
                client.delete_ledger(doomed)

            # The bookies' garbage collection (every 0.2 s here) drops the data.
            for raw in raws:
                wait_until(lambda raw=raw: raw.read_lac(doomed).status == Status.NO_SUCH_LEDGER, timeout=15,
                           message=f"bookie {raw.address} still holds deleted ledger {doomed}")
                assert raw.read(doomed, [0, 1]).status == Status.NO_SUCH_LEDGER
                assert raw.read_lac(kept).status == Status.OK
        finally:
            for raw in raws:
                raw.close()
        assert [e.payload for e in client.open_ledger(kept, password=PASSWORD).read()] == kept_data


# -- recovery against a live writer --------------------------------------------------------------
def test_recovery_fences_a_live_writer_and_closes_with_every_acked_entry(shared_cluster):
    data = payloads(500, 200, seed=17)
    with walkit.Client(shared_cluster.metadata_url) as writer_client, \
            walkit.Client(shared_cluster.metadata_url) as recoverer:
        writer = writer_client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        futures = [writer.append_async(p) for p in data]
        acked = [f.result(timeout=30) for f in futures]
        assert acked == list(range(500))

        reader = recoverer.open_ledger(writer.ledger_id, password=PASSWORD, recover=True)
        assert reader.is_closed
        metadata = recoverer.ledger_metadata(writer.ledger_id)
        assert (metadata.state, metadata.last_entry_id) == (walkit.CLOSED, 499)
        assert reader.last_add_confirmed == 499

        with pytest.raises(LedgerFenced):
            writer.append(b"too late", timeout=15)
        with pytest.raises(LedgerFenced):
            writer.append_async(b"later still").result(timeout=15)
        assert writer.last_add_confirmed == 499

        entries = list(reader.read())
        assert [e.entry_id for e in entries] == list(range(500))
        assert [e.payload for e in entries] == data
        # The fenced writer's attempts did not change the recovered end.
        after = walkit.Client(shared_cluster.metadata_url)
        try:
            assert after.ledger_metadata(writer.ledger_id).last_entry_id == 499
            assert len(list(after.open_ledger(writer.ledger_id, password=PASSWORD).read())) == 500
        finally:
            after.close()


# -- losing a bookie under load ------------------------------------------------------------------
def test_killed_bookie_is_replaced_while_appending(local_cluster):
    """SIGKILL an ensemble member in the middle of a pipelined stream: appends go on (ensemble change)."""
    local_cluster.add_bookie()
    data = payloads(1500, 256, seed=19)
    with walkit.Client(local_cluster.metadata_url, add_timeout=2.0) as client:
        writer = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        victim_address = writer.metadata.ensembles[0][0]
        (spare_address,) = set(local_cluster.addresses) - set(writer.metadata.ensembles[0])
        victim = local_cluster.addresses.index(victim_address)
        futures = [writer.append_async(p) for p in data[:500]]
        futures[499].result(timeout=30)
        local_cluster.kill_bookie(victim)
        futures += [writer.append_async(p) for p in data[500:]]
        assert [f.result(timeout=30) for f in futures] == list(range(1500))
        closed = writer.close()
        assert closed.last_entry_id == 1499

    with walkit.Client(local_cluster.metadata_url) as reader_client:
        metadata = reader_client.ledger_metadata(writer.ledger_id)
        starts = metadata.fragment_starts
        assert len(starts) == 2 and 0 < starts[1] <= 500
        assert victim_address in metadata.ensembles[0]
        assert victim_address not in metadata.ensembles[starts[1]]
        assert spare_address in metadata.ensembles[starts[1]]
        entries = list(reader_client.open_ledger(writer.ledger_id, password=PASSWORD).read())
        assert [e.payload for e in entries] == data


# -- bookies going away under readers -----------------------------------------------------------
def test_read_survives_a_bookie_killed_in_the_middle_of_it(local_cluster):
    """5,000 entries are more than one read window, so part of the read is sent after the kill."""
    data = payloads(5000, 64, seed=23)
    with walkit.Client(local_cluster.metadata_url) as client:
        ledger_id = write_ledger(client, data).ledger_id
    with walkit.Client(local_cluster.metadata_url) as reader_client:
        stream = reader_client.open_ledger(ledger_id, password=PASSWORD).read()
        got = [next(stream)]
        local_cluster.kill_bookie(1)
        got += list(stream)
    assert [e.entry_id for e in got] == list(range(5000))
    assert [e.payload for e in got] == data


def test_a_connected_reader_falls_back_when_a_bookie_restarts_empty(local_cluster):
    """memory:// bookies lose their data on restart; a client connected before reads on regardless."""
    data = payloads(60, 100, seed=29)
    with walkit.Client(local_cluster.metadata_url) as client:
        ledger_id = write_ledger(client, data).ledger_id
        assert [e.payload for e in client.open_ledger(ledger_id, password=PASSWORD).read()] == data
        local_cluster.stop_bookie(0)
        local_cluster.start_bookie(0)
        with RawBookie(local_cluster.addresses[0]) as raw:
            assert raw.read_lac(ledger_id).status == Status.NO_SUCH_LEDGER      # it really forgot
        assert [e.payload for e in client.open_ledger(ledger_id, password=PASSWORD).read()] == data


def test_long_poll_tailing_reader_sees_every_entry_of_a_live_writer(shared_cluster):
    data = payloads(200, 64, seed=31)
    with walkit.Client(shared_cluster.metadata_url) as writer_client, \
            walkit.Client(shared_cluster.metadata_url) as reader_client:
        writer = writer_client.create_ledger(password=PASSWORD)
        reader = reader_client.open_ledger(writer.ledger_id, password=PASSWORD)
        assert reader.last_add_confirmed == -1
        got: list[bytes] = []
        errors: list[BaseException] = []

        def tail() -> None:
            try:
                while len(got) < len(data):
                    lac = reader.wait_for_lac(len(got) - 1, timeout=10)
                    assert lac >= len(got) - 1
                    got.extend(e.payload for e in reader.read(len(got), lac))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        tailer = threading.Thread(target=tail)
        tailer.start()
        try:
            for start in range(0, 200, 20):
                for future in [writer.append_async(p) for p in data[start:start + 20]]:
                    future.result(10)
        finally:
            tailer.join(60)
        assert not errors, errors
        assert got == data
        assert reader_client.ledger_metadata(writer.ledger_id).state == walkit.OPEN
        writer.close()
