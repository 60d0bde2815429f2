"""Unbounded ledgers and guaranteed write quorum (issue 19) with real bookie and writer processes."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import wait as wait_futures

import pytest

import walkit
from walkit.core.distribution import write_set_bookies
from walkit.core.digest import master_key
from walkit.core.messages import NOOP_PAYLOAD, AddRequest, Entry, Status
from walkit.errors import ConfigError, LedgerFenced, NoSuchEntry
from walkit.local import LocalCluster
from tests.support import unbounded_writer
from tests.support.unbounded_writer import PASSWORD

from .helpers import RawBookie, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        yield cluster


class WriterProcess:
    """WriterProcess runs tests/support/unbounded_writer.py and collects what it reports."""

    def __init__(self, cluster: LocalCluster, ledger_id: int, name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, unbounded_writer.__file__, cluster.metadata_url, str(ledger_id), name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.strip())

    def send(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def count(self, prefix: str) -> int:
        return sum(1 for line in list(self.lines) if line.startswith(prefix))

    def acked(self) -> list[tuple[int, str]]:
        return [(int(line.split()[1]), line.split()[2]) for line in list(self.lines) if line.startswith("acked ")]

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        return self.process.stderr.read()


def test_two_writer_processes_take_an_unbounded_ledger_from_each_other_ten_times(cluster):
    with walkit.Client(cluster.metadata_url) as client:
        ledger_id = client.create_ledger(3, 3, 2, password=PASSWORD, unbounded=True).ledger_id
    writers = [WriterProcess(cluster, ledger_id, name) for name in ("A", "B")]
    try:
        for turn in range(10):
            writer = writers[turn % 2]
            taken, acked = writer.count("took "), len(writer.acked())
            writer.send("take")                      # fences the other one while it appends
            wait_until(lambda: writer.count("took ") > taken, 60,
                       message=lambda: f"{writer.name} did not take turn {turn}: {writer.lines[-5:]}")
            wait_until(lambda: len(writer.acked()) >= acked + 20, 60,
                       message=lambda: f"{writer.name} appended nothing in turn {turn}: {writer.lines[-5:]}")
        last = writers[9 % 2]
        last.send("close")
        wait_until(lambda: last.count("closed ") == 1, 60, message=lambda: f"no close: {last.lines[-5:]}")
    finally:
        errors = [w.stop() for w in writers]
    fenced = writers[0].count("fenced") + writers[1].count("fenced")
    assert fenced >= 9, (fenced, errors)                      # every takeover fenced the other writer
    acknowledged: dict[int, str] = {}
    for writer in writers:
        for entry_id, payload in writer.acked():
            assert acknowledged.setdefault(entry_id, payload) == payload, f"entry {entry_id} acknowledged twice"
    with walkit.Client(cluster.metadata_url) as client:
        metadata = client.ledger_metadata(ledger_id)
        assert metadata.state == "CLOSED" and metadata.term == 11
        read = [(e.entry_id, e.payload.decode()) for e in client.open_ledger(ledger_id, password=PASSWORD).read()]
    assert all(payload.encode() != NOOP_PAYLOAD for _, payload in read)
    assert [entry_id for entry_id, _ in read] == sorted(entry_id for entry_id, _ in read)
    payloads = [payload for _, payload in read]
    assert len(payloads) == len(set(payloads)), "a payload was read twice"
    by_id = dict(read)
    missing = {entry_id: payload for entry_id, payload in acknowledged.items() if by_id.get(entry_id) != payload}
    assert not missing, f"acknowledged but not read back: {sorted(missing.items())[:5]}"
    for name in ("A", "B"):                      # each writer's payloads are read in the order it wrote them
        numbers = [int(p.split("-")[1]) for p in payloads if p.startswith(name + "-")]
        assert numbers == sorted(numbers)


def test_writer_processes_that_take_the_ledger_at_the_same_moment_never_share_a_term(cluster):
    """Three processes reopen the ledger at once, round after round, while the last winner appends:
    no two ever hold one term (each takeover's metadata names its holder), and every acknowledged
    entry is read back once (no recovery write-back lands past the end it found)."""
    with walkit.Client(cluster.metadata_url) as client:
        ledger_id = client.create_ledger(3, 3, 2, password=PASSWORD, unbounded=True).ledger_id
    writers = [WriterProcess(cluster, ledger_id, name) for name in ("A", "B", "C")]
    try:
        for turn in range(6):
            answered = [w.count("took ") + w.count("take failed") for w in writers]
            acked = sum(len(w.acked()) for w in writers)
            for writer in writers:
                writer.send("take")
            for writer, before in zip(writers, answered):
                wait_until(lambda: writer.count("took ") + writer.count("take failed") > before, 60,
                           message=lambda: f"{writer.name} did not answer turn {turn}: {writer.lines[-5:]}")
            wait_until(lambda: sum(len(w.acked()) for w in writers) >= acked + 10, 60,
                       message=lambda: f"no appends after turn {turn}: {[w.lines[-3:] for w in writers]}")
        terms = [int(line.split()[1]) for w in writers for line in list(w.lines) if line.startswith("took ")]
        assert len(terms) == len(set(terms)), f"two writers took one term: {sorted(terms)}"
        last = writers[0]
        took = last.count("took ")
        last.send("take")                                     # alone this time: it must win
        wait_until(lambda: last.count("took ") > took, 60, message=lambda: f"{last.name} did not take: {last.lines[-5:]}")
        last.send("close")
        wait_until(lambda: last.count("closed ") == 1, 60, message=lambda: f"no close: {last.lines[-5:]}")
    finally:
        errors = [w.stop() for w in writers]
    acknowledged: dict[int, str] = {}
    for writer in writers:
        for entry_id, payload in writer.acked():
            assert acknowledged.setdefault(entry_id, payload) == payload, f"entry {entry_id} acknowledged twice"
    with walkit.Client(cluster.metadata_url) as client:
        read = dict((e.entry_id, e.payload.decode()) for e in client.open_ledger(ledger_id, password=PASSWORD).read())
    missing = {entry_id: payload for entry_id, payload in acknowledged.items() if read.get(entry_id) != payload}
    assert not missing, (f"acknowledged but not read back: {sorted(missing.items())[:5]}", errors)


def test_a_reopened_ledger_fences_the_old_writer_and_continues_after_the_noop(cluster):
    with walkit.Client(cluster.metadata_url) as client:
        writer = client.create_ledger(3, 2, 2, password=b"pw", unbounded=True)
        for i in range(5):
            assert writer.append(b"a%d" % i) == i
        taken = client.reopen_ledger(writer.ledger_id, password=b"pw")
        assert taken.metadata.term == 2
        with pytest.raises(LedgerFenced):
            writer.append(b"late", timeout=10)
        assert [taken.append(b"b%d" % i) for i in range(3)] == [6, 7, 8]       # 5 is the no-op
        reader = client.open_ledger(writer.ledger_id, password=b"pw")
        assert [e.payload for e in reader.read()] == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b0", b"b1"]
        with pytest.raises(ConfigError):
            client.reopen_ledger(client.create_ledger(3, 2, 2).ledger_id)          # bounded ledgers end
        with pytest.raises(walkit.errors.Unauthorized):
            client.reopen_ledger(writer.ledger_id, password=b"wrong")
        with pytest.raises(ConfigError):
            client.truncate_ledger(writer.ledger_id, 100)                           # past the LAC
        client.truncate_ledger(writer.ledger_id, 3)
        taken.close()
        reader = client.open_ledger(writer.ledger_id, password=b"pw")
        assert [e.payload for e in reader.read(3)] == [b"a3", b"a4", b"b0", b"b1", b"b2"]
        with pytest.raises(NoSuchEntry):
            list(reader.read(0))


def test_guaranteed_write_quorum_leaves_every_entry_of_the_closed_ledger_on_qw_bookies(tmp_path):
    with LocalCluster(bookies=5, data_dir=str(tmp_path / "cluster"), storage="files") as cluster, \
            walkit.Client(cluster.metadata_url, add_timeout=5, request_timeout=2) as client:
        # add_timeout is also how long a pinned bookie (stopped below) may take to come back: a
        # bookie restart on a loaded machine takes seconds.
        writer = client.create_ledger(3, 3, 2, password=b"pw", guaranteed_write_quorum=True)
        first = writer.metadata.current_ensemble
        killed, stopped = cluster.addresses.index(first[0]), cluster.addresses.index(first[1])
        futures = [writer.append_async(b"e%d" % i) for i in range(300)]
        wait_futures(futures[:150], timeout=60)
        cluster.kill_bookie(killed)                                # SIGKILL mid-stream
        futures += [writer.append_async(b"e%d" % i) for i in range(300, 600)]
        cluster.stop_bookie(stopped)                               # and another one for a while
        futures += [writer.append_async(b"e%d" % i) for i in range(600, 900)]
        cluster.start_bookie(stopped)
        wait_futures(futures, timeout=120)
        assert [f.result() for f in futures] == list(range(900))
        metadata = writer.close()
        assert metadata.last_entry_id == 899 and len(metadata.ensembles) >= 2
        assert first[0] not in metadata.current_ensemble
        cluster.start_bookie(killed)         # only to read what it holds: it had them before it died
        for entry_id in range(900):
            write_set = write_set_bookies(entry_id, metadata.ensemble_at(entry_id), metadata.write_quorum)
            copies = 0
            for address in write_set:
                with RawBookie(address) as raw:
                    response = raw.read(metadata.ledger_id, [entry_id], timeout=10)
                copies += response.status == Status.OK and [e.payload for e in response.entries] == [b"e%d" % entry_id]
            assert copies == 3, f"entry {entry_id} is on {copies} of its write set {write_set}"


def test_a_log_backed_by_one_unbounded_ledger_keeps_the_log_api_across_takeovers(cluster):
    with walkit.Client(cluster.metadata_url) as client:
        reading = None
        try:
            first = client.open_log("orders", unbounded=True, write_quorum=3)
            reading = client.read_log("orders", follow=True, poll=0.2)
            acked = [first.append(b"a%d" % i) for i in range(50)]
            second = client.open_log("orders")                          # takes the ledger over
            with pytest.raises(LedgerFenced):
                first.append(b"late", timeout=10)
            acked += [second.append(b"b%d" % i) for i in range(50)]
            assert {p.ledger_id for p in acked} == {first.ledger_id} == set(client.log_metadata("orders").ledger_ids)
            assert second.roll() == first.ledger_id                    # one ledger: nothing to roll
            third = client.open_log("orders")
            acked += [third.append(b"c%d" % i) for i in range(50)]
            got = []
            for record in reading:
                got.append((record.position, record.payload))
                if len(got) == 150:
                    break
            expected = [b"a%d" % i for i in range(50)] + [b"b%d" % i for i in range(50)] + [b"c%d" % i for i in range(50)]
            assert [payload for _, payload in got] == expected
            assert [position for position, _ in got] == acked
            third.truncate(acked[100])
            assert [r.payload for r in client.read_log("orders")][:1] == [b"c0"]
            third.close()
            assert client.ledger_metadata(first.ledger_id).state == "OPEN"   # closing a writer leaves it open
        finally:
            if reading is not None:
                reading.close()


def test_truncation_drops_fragments_and_bookies_outside_them_give_the_space_back(tmp_path):
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="files",
                      bookie_args=("--gc-interval", "0.2", "--no-autorecovery")) as cluster, \
            walkit.Client(cluster.metadata_url, add_timeout=1, request_timeout=2) as client:
        writer = client.create_ledger(3, 3, 2, password=b"pw", unbounded=True)
        first = writer.metadata.current_ensemble
        for i in range(100):
            writer.append(b"e%d" % i)
        leaving = cluster.addresses.index(first[0])
        cluster.stop_bookie(leaving)                       # its fragment ends: the writer replaces it
        for i in range(100, 200):
            writer.append(b"e%d" % i)
        metadata = client.ledger_metadata(writer.ledger_id)
        # The new fragment starts at the first entry the stopped bookie had not acknowledged: at 100,
        # or a little before when its ack of the last appends (Qa 2 of Qw 3) was still on its way.
        boundary = metadata.last_fragment_start
        assert sorted(metadata.ensembles) == [0, boundary] and 0 < boundary <= 100
        assert first[0] not in metadata.ensembles[boundary]
        cluster.start_bookie(leaving)
        with RawBookie(first[0]) as raw:
            assert raw.read_lac(writer.ledger_id).status == Status.OK           # it still holds entries of 0..99
        truncated = client.truncate_ledger(writer.ledger_id, 150)
        assert sorted(truncated.ensembles) == [boundary] and truncated.first_entry_id == 150
        assert len(truncated.to_bytes()) < len(metadata.to_bytes())

        def dropped() -> bool:
            with RawBookie(first[0]) as raw:
                return raw.read_lac(writer.ledger_id).status == Status.NO_SUCH_LEDGER
        wait_until(dropped, 30, message="the bookie outside every fragment kept the truncated ledger")
        for i in range(200, 210):
            writer.append(b"e%d" % i)
        reader = client.open_ledger(writer.ledger_id, password=b"pw")
        assert [e.payload for e in reader.read(150)] == [b"e%d" % i for i in range(150, reader.last_add_confirmed + 1)]
        with pytest.raises(NoSuchEntry):
            list(reader.read(100))


def test_a_replacement_bookie_keeps_no_older_term_entry_from_its_fragment_s_start_on(tmp_path):
    """docs/internals/protocol.md#stale-bookie with real bookie processes: the only spare holds
    entries an older term wrote where the new fragment will start (planted with the ledger's key,
    as a writer of term 1 would have left them); a bookie of the ensemble stops, the writer of
    term 2 replaces it with the spare, and from the new fragment's start on the spare holds none
    of them, also after a SIGKILL and restart, and the ledger reads back the writer's entries.
    (The run where an old entry there loses data needs a lost message: the simulator's
    stale_bookie_counterexample scripts it.)"""
    with LocalCluster(bookies=5, data_dir=str(tmp_path / "cluster"), storage="files",
                      bookie_args=("--no-autorecovery",)) as cluster, \
            walkit.Client(cluster.metadata_url, add_timeout=1, request_timeout=2) as client:
        created = client.create_ledger(4, 2, 2, password=b"pw", unbounded=True)
        ledger_id = created.ledger_id
        for i in range(5):
            created.append(b"e%d" % i)
        writer = client.reopen_ledger(ledger_id, password=b"pw")             # term 2, after the no-op
        assert writer.metadata.term == 2
        ensemble = writer.metadata.current_ensemble
        spare = next(a for a in cluster.addresses if a not in ensemble)
        stale = [Entry(ledger_id, i, i - 1, b"", b"stale-%d" % i) for i in range(6, 40)]
        with RawBookie(spare) as raw:
            planted = raw.request(AddRequest(txn=raw.next_txn(), ledger_id=ledger_id, master_key=master_key(b"pw"),
                                             entries=stale, term=1))
            assert planted.status == Status.OK
        for i in range(6, 10):
            writer.append(b"w%d" % i)
        cluster.stop_bookie(cluster.addresses.index(ensemble[1]))           # the spare takes its place
        for i in range(10, 20):
            writer.append(b"w%d" % i)
        metadata = client.ledger_metadata(ledger_id)
        start = metadata.last_fragment_start
        assert spare in metadata.current_ensemble and 6 < start < 19

        def stale_on_spare() -> dict[int, bytes]:
            with RawBookie(spare) as raw:
                answer = raw.read(ledger_id, list(range(start, 40)))
                return {e.entry_id: e.payload for e in answer.entries if e.payload.startswith(b"stale")}
        assert stale_on_spare() == {}
        cluster.kill_bookie(cluster.addresses.index(spare))
        cluster.start_bookie(cluster.addresses.index(spare))
        assert stale_on_spare() == {}
        reader = client.open_ledger(ledger_id, password=b"pw")
        assert [e.payload for e in reader.read(6)][:14] == [b"w%d" % i for i in range(6, 20)]
