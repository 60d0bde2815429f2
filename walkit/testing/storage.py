"""walkit.testing.storage is the EntryStorage conformance suite; every backend runs it unchanged.

    # tests/storage/test_rocks.py
    import pytest
    from walkit.testing.storage import EntryStorageConformance

    class TestRocksConformance(EntryStorageConformance):
        @pytest.fixture
        def storage_factory(self):
            return lambda path: RocksStorage.from_uri(f"rocks://{path}")

`storage_factory(path)` opens the storage kept at `path` (a directory path the suite picks, which
may not exist yet); called again with the same path it must reopen the same data. The suite
checks the EntryStorage contract of `walkit.spi`: reads, overwrites, last_entry, ledger state,
ledgers(), deletes, payload sizes, many ledgers, and the optional `delete_entries` (skipped by
a backend without it); and, for backends whose `durable` is True, that whatever `sync()`
covered survives close + reopen, an abrupt exit and a SIGKILL at any moment
(`walkit.testing.crash`), byte for byte, trims included. Backends with `durable = False` skip
those checks only.
"""

from __future__ import annotations

import hashlib

import pytest

from walkit.core.bookie import LedgerState
from walkit.testing.crash import kill_self, run_in_child

_SIZES = (0, 1, 37, 1024, 5000)


def payload(ledger_id: int, entry_id: int, size: int | None = None) -> bytes:
    """payload returns the deterministic bytes the suite stores as (ledger, entry)."""
    size = _SIZES[(ledger_id * 7 + entry_id) % len(_SIZES)] if size is None else size
    seed = hashlib.blake2b(f"{ledger_id}:{entry_id}".encode(), digest_size=64).digest()
    return (seed * (size // 64 + 1))[:size]


def state_of(group: int) -> LedgerState:
    """state_of returns the ledger state the crash workload sets in group `group`."""
    return LedgerState(fenced=group % 2 == 0, master_key=b"key-%d" % group, explicit_lac=group,
                       term=group if group % 3 == 0 else 0)


class Workload:
    """Workload is the crash tests' deterministic write pattern: groups of puts, a sync per group.

    Entry n of the stream goes to ledger 1 + n % ledgers as entry n // ledgers; every third
    group also sets the state of one ledger. `reported` groups are known synced.
    """

    def __init__(self, group_size: int = 20, ledgers: int = 3) -> None:
        """__init__ sets the entries per group and the number of ledgers written round robin."""
        self.group_size = group_size
        self.ledger_count = ledgers

    def place(self, n: int) -> tuple[int, int]:
        """place returns (ledger, entry) of the stream's entry number `n`."""
        return 1 + n % self.ledger_count, n // self.ledger_count

    def write_group(self, storage, group: int) -> None:
        """write_group puts one group's entries and, every third group, one ledger's state."""
        for n in range(group * self.group_size, (group + 1) * self.group_size):
            ledger_id, entry_id = self.place(n)
            storage.put(ledger_id, entry_id, payload(ledger_id, entry_id))
        if group % 3 == 0:
            storage.set_ledger_state(1 + group % self.ledger_count, state_of(group))

    def run(self, factory, path, report, groups: int | None, unsynced_tail: int = 0) -> None:
        """run writes and syncs groups (forever if `groups` is None), reporting each synced group."""
        storage = factory(path)
        group = 0
        while groups is None or group < groups:
            self.write_group(storage, group)
            storage.sync()
            report(group)
            group += 1
        for _ in range(unsynced_tail):
            self.write_group(storage, group)
            group += 1

    def check(self, storage, synced_groups: int) -> None:
        """check asserts that the first `synced_groups` groups are intact and nothing later is garbage."""
        synced = synced_groups * self.group_size
        for n in range(synced + 60 * self.group_size):
            ledger_id, entry_id = self.place(n)
            data = storage.get(ledger_id, entry_id)
            if n < synced:
                assert data == payload(ledger_id, entry_id), f"synced entry {ledger_id}:{entry_id} lost or changed"
            else:
                assert data is None or data == payload(ledger_id, entry_id), f"entry {ledger_id}:{entry_id} is garbage"
        for ledger_id in range(1, self.ledger_count + 1):
            entries = [self.place(n)[1] for n in range(synced) if self.place(n)[0] == ledger_id]
            if entries:
                assert storage.last_entry(ledger_id) >= max(entries)
            set_in = [g for g in range(0, synced_groups, 3) if 1 + g % self.ledger_count == ledger_id]
            if set_in:
                state = storage.ledger_state(ledger_id)
                assert state is not None and state.master_key.startswith(b"key-"), \
                    f"synced state of ledger {ledger_id} lost: {state}"
                group = int(state.master_key[4:])
                assert group >= set_in[-1] and state == state_of(group), f"ledger {ledger_id} state {state}"


def trim_point(group: int) -> int:
    """trim_point is where the trimming workload deletes ledger 1's entries up to after group `group`."""
    return max(0, (group - 2) * 20 + group % 7)


def trim_group(storage, group: int) -> None:
    """trim_group writes group `group` of the trimming workload: 20 entries of ledgers 1 and 2, then a trim of 1."""
    for entry_id in range(group * 20, (group + 1) * 20):
        storage.put(1, entry_id, payload(1, entry_id))
        storage.put(2, entry_id, payload(2, entry_id))
    storage.delete_entries(1, trim_point(group))


def check_trimmed(storage, synced_groups: int) -> None:
    """check_trimmed asserts the trimming workload's first `synced_groups` groups: trims applied, the rest intact.

    Later groups may have been synced without being reported (a kill lands anywhere): ledger
    1's entries then start at the trim point of one of them, and every entry from there on is
    intact.
    """
    synced = synced_groups * 20
    for entry_id in range(synced + 40):
        two = storage.get(2, entry_id)
        if entry_id < synced:
            assert two == payload(2, entry_id), f"synced entry 2:{entry_id} lost"
        else:
            assert two in (None, payload(2, entry_id)), f"entry 2:{entry_id} is garbage"
    ones = [storage.get(1, entry_id) for entry_id in range(synced + 40)]
    kept = next((e for e, data in enumerate(ones[:synced]) if data is not None), synced)
    points = {trim_point(group) for group in range(synced_groups - 1, synced_groups + 1000)}
    assert kept >= trim_point(synced_groups - 1), \
        f"entry 1:{kept} came back after a synced delete_entries(1, {trim_point(synced_groups - 1)})"
    assert kept == synced or kept in points, f"ledger 1 starts at entry {kept}, where no trim pointed"
    for entry_id, data in enumerate(ones):
        if kept <= entry_id < synced:
            assert data == payload(1, entry_id), f"synced entry 1:{entry_id} lost (ledger 1 starts at {kept})"
        else:
            assert data in (None, payload(1, entry_id)), f"entry 1:{entry_id} is garbage"


class EntryStorageConformance:
    """EntryStorageConformance holds the tests every EntryStorage must pass (see the module doc)."""

    @pytest.fixture
    def storage_factory(self):
        """storage_factory must be provided by the backend's test class: path -> opened storage."""
        raise NotImplementedError("define a storage_factory fixture: path -> opened EntryStorage")

    @pytest.fixture
    def path(self, tmp_path) -> str:
        """path is where the test's storage lives."""
        return str(tmp_path / "storage")

    @pytest.fixture
    def opened(self, storage_factory, path):
        """opened opens storages at `path` and closes, at teardown, those the test left open."""
        live: list = []

        def open_storage():
            """open_storage opens the storage at `path` and remembers to close it."""
            storage = storage_factory(path)
            live.append(storage)
            return storage
        yield open_storage, live
        for storage in live:
            storage.close()

    @pytest.fixture
    def storage(self, opened):
        """storage is a freshly opened, empty storage."""
        return opened[0]()

    @pytest.fixture
    def reopen(self, opened):
        """reopen is a function that closes a storage and returns it opened again at the same path."""
        open_storage, live = opened

        def reopen(storage):
            """reopen closes `storage` and opens it again."""
            live.remove(storage)
            storage.close()
            return open_storage()
        return reopen

    @pytest.fixture
    def durable_factory(self, storage_factory, path):
        """durable_factory is storage_factory, or a skip for backends that keep nothing across restarts."""
        probe = storage_factory(path)
        durable = getattr(type(probe), "durable", False)
        probe.close()
        if not durable:
            pytest.skip(f"{type(probe).__name__}.durable is False: nothing is kept across restarts")
        return storage_factory

    # -- entries --------------------------------------------------------------------------
    def test_put_then_get_before_and_after_sync(self, storage):
        """test_put_then_get_before_and_after_sync checks that a put is readable at once and after sync()."""
        storage.put(1, 0, b"zero")
        storage.put(1, 1, b"one")
        assert storage.get(1, 0) == b"zero" and storage.get(1, 1) == b"one"
        storage.sync()
        assert storage.get(1, 0) == b"zero" and storage.get(1, 1) == b"one"
        assert isinstance(storage.get(1, 1), bytes)

    def test_overwrite_keeps_the_last_bytes(self, storage):
        """test_overwrite_keeps_the_last_bytes checks that a put replaces a stored entry, synced or not."""
        storage.put(1, 0, b"first")
        storage.sync()
        storage.put(1, 0, b"second")
        assert storage.get(1, 0) == b"second"
        storage.sync()
        storage.put(1, 0, b"third")
        storage.put(1, 0, b"fourth")
        storage.sync()
        assert storage.get(1, 0) == b"fourth"

    def test_stored_bytes_are_a_copy(self, storage):
        """test_stored_bytes_are_a_copy checks that changing the caller's buffer after put changes nothing."""
        data = bytearray(b"original")
        storage.put(1, 0, data)
        data[:] = b"mutated!"
        assert storage.get(1, 0) == b"original"
        storage.sync()
        assert storage.get(1, 0) == b"original"

    def test_absent_entries_and_ledgers_read_as_none(self, storage):
        """test_absent_entries_and_ledgers_read_as_none checks get of gaps and unknown ledgers is None."""
        assert storage.get(9, 0) is None
        storage.put(1, 0, b"a")
        storage.put(1, 5, b"f")
        storage.sync()
        assert storage.get(1, 1) is None and storage.get(1, 4) is None and storage.get(1, 6) is None
        assert storage.get(1, 10 ** 6) is None and storage.get(2, 0) is None

    def test_last_entry_is_the_highest_stored(self, storage):
        """test_last_entry_is_the_highest_stored checks last_entry: -1 if unknown, else the highest id."""
        assert storage.last_entry(1) == -1
        storage.put(1, 3, b"d")
        assert storage.last_entry(1) == 3
        storage.put(1, 1, b"b")
        storage.sync()
        assert storage.last_entry(1) == 3
        storage.put(1, 7, b"h")
        assert storage.last_entry(1) == 7 and storage.last_entry(2) == -1

    def test_empty_and_large_payloads(self, storage):
        """test_empty_and_large_payloads checks that empty and 8 MiB entries come back byte for byte."""
        large = payload(1, 1, 8 << 20)
        storage.put(1, 0, b"")
        storage.put(1, 1, large)
        storage.put(1, 2, payload(1, 2, 100_000))
        assert storage.get(1, 0) == b"" and storage.get(1, 1) == large
        storage.sync()
        assert storage.get(1, 0) == b"" and storage.get(1, 1) == large
        assert storage.get(1, 2) == payload(1, 2, 100_000)

    def test_many_ledgers(self, storage):
        """test_many_ledgers checks that 1,500 ledgers are listed and read back."""
        for ledger_id in range(1, 1501):
            for entry_id in range(3):
                storage.put(ledger_id, entry_id, payload(ledger_id, entry_id))
            if ledger_id % 100 == 0:
                storage.sync()
        storage.sync()
        assert list(storage.ledgers()) == list(range(1, 1501))
        for ledger_id in range(1, 1501, 7):
            assert storage.last_entry(ledger_id) == 2
            assert all(storage.get(ledger_id, e) == payload(ledger_id, e) for e in range(3))

    # -- ledger state -----------------------------------------------------------------------
    def test_get_many_matches_get_when_defined(self, storage):
        get_many = getattr(storage, "get_many", None)
        if get_many is None:
            pytest.skip("this backend has no optional get_many")
        for entry_id in range(0, 300, 3):                  # striped: gaps between stored ids
            storage.put(5, entry_id, payload(5, entry_id))
        storage.sync()
        storage.put(5, 301, payload(5, 301))               # unsynced
        storage.put(6, 1, payload(6, 1))                   # another ledger
        ids = [301, 0, 1, 3, 150, 297, 298, 5000, 3]
        assert get_many(5, ids) == [storage.get(5, e) for e in ids]
        assert get_many(5, []) == []
        assert get_many(99, [0, 1]) == [None, None]
        storage.sync()                                     # nothing unsynced: every id below the last is stored or a gap
        for ids in ([297, 0, 150, 3, 3], [0, 1, 3, 6], [0, 3, 6, 9, 301], [-1, 0, 3]):
            assert get_many(5, ids) == [storage.get(5, e) for e in ids]
        assert get_many(5, [297, 0, 150, 3, 3]) == [payload(5, e) for e in (297, 0, 150, 3, 3)]
        storage.delete_ledger(5)
        assert get_many(5, [0, 3]) == [None, None]

    def test_ledger_state_none_set_get(self, storage):
        """test_ledger_state_none_set_get checks that a state is None until set, then the last one set."""
        assert storage.ledger_state(1) is None
        state = LedgerState(fenced=True, master_key=b"\x00key\xff", explicit_lac=41)
        storage.set_ledger_state(1, state)
        assert storage.ledger_state(1) == state
        storage.sync()
        assert storage.ledger_state(1) == state
        storage.set_ledger_state(1, LedgerState(master_key=b"k2"))
        assert storage.ledger_state(1) == LedgerState(master_key=b"k2")
        state = LedgerState(master_key=b"k2", term=2**40 + 3, truncated=(2**40, 17))     # unbounded ledgers
        storage.set_ledger_state(1, state)
        assert storage.ledger_state(1) == state
        assert list(storage.ledgers()) == [1] and storage.last_entry(1) == -1

    def test_put_makes_the_ledger_known(self, storage):
        """test_put_makes_the_ledger_known checks that a put alone lists the ledger, in the default state."""
        storage.put(4, 0, b"x")
        assert list(storage.ledgers()) == [4]
        assert storage.ledger_state(4) == LedgerState()
        storage.set_ledger_state(2, LedgerState(master_key=b"m"))
        storage.sync()
        assert sorted(storage.ledgers()) == [2, 4]

    # -- delete ---------------------------------------------------------------------------
    @pytest.mark.parametrize("synced_first", [True, False])
    def test_delete_ledger_drops_entries_state_and_last_entry(self, storage, synced_first):
        """test_delete_ledger_drops_entries_state_and_last_entry checks that delete forgets one ledger only."""
        for ledger_id in (1, 2):
            storage.set_ledger_state(ledger_id, LedgerState(master_key=b"k%d" % ledger_id))
            for entry_id in range(10):
                storage.put(ledger_id, entry_id, payload(ledger_id, entry_id))
        if synced_first:
            storage.sync()
        storage.delete_ledger(1)
        for _ in range(2):                       # before and after the delete is synced
            assert storage.get(1, 0) is None and storage.get(1, 9) is None
            assert storage.ledger_state(1) is None and storage.last_entry(1) == -1
            assert list(storage.ledgers()) == [2]
            assert storage.ledger_state(2) == LedgerState(master_key=b"k2") and storage.last_entry(2) == 9
            assert all(storage.get(2, e) == payload(2, e) for e in range(10))
            storage.sync()

    def test_deleted_ledger_can_be_written_again_from_scratch(self, storage):
        """test_deleted_ledger_can_be_written_again_from_scratch checks a reused id starts empty."""
        for entry_id in range(5):
            storage.put(1, entry_id, b"old")
        storage.sync()
        storage.delete_ledger(1)
        storage.put(1, 0, b"new")
        for _ in range(2):
            assert storage.get(1, 0) == b"new" and storage.get(1, 3) is None and storage.last_entry(1) == 0
            storage.sync()

    def test_delete_of_unknown_ledger_is_harmless(self, storage):
        """test_delete_of_unknown_ledger_is_harmless checks that deleting an unknown ledger changes nothing."""
        storage.put(1, 0, b"a")
        storage.delete_ledger(99)
        storage.sync()
        assert storage.get(1, 0) == b"a" and list(storage.ledgers()) == [1]

    # -- delete_entries (optional) ----------------------------------------------------------------
    @pytest.fixture
    def trims(self, storage):
        """trims is the storage, or a skip for backends without the optional delete_entries."""
        if getattr(storage, "delete_entries", None) is None:
            pytest.skip(f"{type(storage).__name__} has no optional delete_entries")
        return storage

    @pytest.mark.parametrize("synced_first", [True, False])
    def test_delete_entries_drops_one_ledger_s_entries_below_the_point_only(self, trims, synced_first):
        storage = trims
        state = LedgerState(master_key=b"k1", term=3, truncated=(3, 40))
        storage.set_ledger_state(1, state)
        for entry_id in range(40):
            storage.put(1, entry_id, payload(1, entry_id))
            storage.put(2, entry_id, payload(2, entry_id))
        if synced_first:
            storage.sync()
        storage.delete_entries(1, 25)
        for _ in range(2):                       # before and after the trim is synced
            assert [storage.get(1, e) for e in range(25)] == [None] * 25
            assert all(storage.get(1, e) == payload(1, e) for e in range(25, 40))
            assert all(storage.get(2, e) == payload(2, e) for e in range(40))
            assert storage.last_entry(1) == 39 and storage.ledger_state(1) == state
            assert sorted(storage.ledgers()) == [1, 2]
            storage.sync()

    def test_a_trim_stays_puts_below_it_store_nothing_and_earlier_points_change_nothing(self, trims):
        storage = trims
        for entry_id in range(30):
            storage.put(1, entry_id, payload(1, entry_id))
        storage.sync()
        storage.delete_entries(1, 10)
        storage.put(1, 5, b"late copy")          # a late add below the point (a stale writer's)
        storage.put(1, 30, payload(1, 30))
        storage.delete_entries(1, 4)             # an earlier point: nothing comes back
        storage.sync()
        assert storage.get(1, 5) is None and storage.get(1, 9) is None and storage.get(1, 10) == payload(1, 10)
        assert storage.get(1, 30) == payload(1, 30) and storage.last_entry(1) == 30
        storage.delete_entries(1, 20)
        storage.sync()
        assert [storage.get(1, e) for e in (10, 19)] == [None, None] and storage.get(1, 20) == payload(1, 20)

    def test_delete_entries_past_every_entry_leaves_the_ledger_known_and_empty(self, trims):
        storage = trims
        storage.set_ledger_state(1, LedgerState(master_key=b"k"))
        for entry_id in range(5):
            storage.put(1, entry_id, payload(1, entry_id))
        storage.sync()
        storage.delete_entries(1, 100)
        storage.delete_entries(7, 10)            # an unknown ledger: harmless
        storage.sync()
        assert [storage.get(1, e) for e in range(5)] == [None] * 5 and storage.get(7, 0) is None
        assert storage.last_entry(1) < 100 and list(storage.ledgers()) == [1]
        assert storage.ledger_state(1) == LedgerState(master_key=b"k")
        storage.put(1, 100, b"next")
        assert storage.get(1, 100) == b"next" and storage.last_entry(1) == 100

    def test_a_deleted_ledger_written_again_has_no_trim(self, trims):
        storage = trims
        for entry_id in range(10):
            storage.put(1, entry_id, b"old")
        storage.delete_entries(1, 8)
        storage.sync()
        storage.delete_ledger(1)
        storage.put(1, 0, b"new")
        storage.sync()
        assert storage.get(1, 0) == b"new" and storage.get(1, 9) is None and storage.last_entry(1) == 0

    def test_get_many_below_a_trim_matches_get(self, trims):
        storage = trims
        get_many = getattr(storage, "get_many", None)
        if get_many is None:
            pytest.skip("this backend has no optional get_many")
        for entry_id in range(0, 60, 2):
            storage.put(3, entry_id, payload(3, entry_id))
        storage.sync()
        storage.delete_entries(3, 21)
        for ids in ([0, 20, 22, 40], [22, 24, 26], list(range(60)), [58, 2]):
            assert get_many(3, ids) == [storage.get(3, e) for e in ids]
        storage.sync()
        assert get_many(3, [20, 22]) == [None, payload(3, 22)]

    def test_trims_survive_close_and_reopen(self, durable_factory, path):
        storage = durable_factory(path)
        if getattr(storage, "delete_entries", None) is None:
            storage.close()
            pytest.skip(f"{type(storage).__name__} has no optional delete_entries")
        for group in range(6):
            trim_group(storage, group)
            storage.sync()
        storage.close()
        storage = durable_factory(path)
        try:
            check_trimmed(storage, 6)
            assert storage.get(1, trim_point(5)) == payload(1, trim_point(5))
            storage.put(1, 0, b"below the trim")         # the point itself is durable
            storage.sync()
            assert storage.get(1, 0) is None
        finally:
            storage.close()

    def test_synced_trims_survive_sigkill_mid_stream(self, durable_factory, path):
        probe = durable_factory(path)
        trimmable = getattr(probe, "delete_entries", None) is not None
        probe.close()
        if not trimmable:
            pytest.skip("this backend has no optional delete_entries")

        def work(report):
            """work writes, trims and syncs groups until the parent kills it."""
            storage = durable_factory(path)
            group = 0
            while True:
                trim_group(storage, group)
                storage.sync()
                report(group)
                group += 1
        reports, how = run_in_child(work, kill_after=25)
        assert how == "killed" and reports == list(range(len(reports))) and len(reports) >= 25
        storage = durable_factory(path)
        try:
            check_trimmed(storage, len(reports))
            top = (len(reports) + 2) * 20
            storage.put(1, top, payload(1, top))
            storage.put(1, 0, b"below a synced trim")        # the trim point came back with the data
            storage.sync()
            assert storage.get(1, top) == payload(1, top) and storage.get(1, 0) is None
        finally:
            storage.close()

    # -- durability -------------------------------------------------------------------------
    def test_identity_is_none_until_set_then_kept(self, storage):
        """test_identity_is_none_until_set_then_kept checks a new storage has no disk identity, then the one set."""
        assert storage.identity() is None
        storage.set_identity(b'{"disk": 1}')
        storage.set_identity(b'{"disk": 2}')
        assert storage.identity() == b'{"disk": 2}'

    def test_identity_survives_sigkill_without_sync(self, durable_factory, path):
        """test_identity_survives_sigkill_without_sync checks set_identity is durable when it returns."""
        def work(report):
            storage = durable_factory(path)
            storage.put(1, 0, b"unsynced")
            storage.set_identity(b"the identity")
            report(0)
            kill_self()
        reports, how = run_in_child(work)
        assert how == "killed" and reports == [0]
        storage = durable_factory(path)
        try:
            assert storage.identity() == b"the identity"
        finally:
            storage.close()

    def test_synced_data_survives_close_and_reopen(self, durable_factory, path):
        """test_synced_data_survives_close_and_reopen checks that entries, states and deletes outlive close()."""
        storage = durable_factory(path)
        workload = Workload()
        workload.run(lambda _: storage, path, lambda _: None, groups=10)
        storage.put(7, 0, payload(7, 0, 3 << 20))
        storage.set_ledger_state(8, LedgerState(fenced=True, master_key=b"m8", explicit_lac=3, term=5, truncated=(4, 9)))
        storage.put(9, 0, b"doomed")
        storage.set_ledger_state(9, LedgerState(master_key=b"m9"))
        storage.sync()
        storage.delete_ledger(9)
        storage.sync()
        storage.close()
        storage = durable_factory(path)
        try:
            workload.check(storage, 10)
            assert storage.get(7, 0) == payload(7, 0, 3 << 20) and storage.last_entry(7) == 0
            assert storage.ledger_state(8) == LedgerState(fenced=True, master_key=b"m8", explicit_lac=3, term=5,
                                                          truncated=(4, 9))
            assert storage.ledger_state(9) is None and storage.get(9, 0) is None and storage.last_entry(9) == -1
            assert sorted(storage.ledgers()) == [1, 2, 3, 7, 8]
        finally:
            storage.close()

    def test_synced_data_survives_exit_without_close(self, durable_factory, path):
        """test_synced_data_survives_exit_without_close checks that os._exit loses nothing synced."""
        workload = Workload()
        reports, how = run_in_child(lambda report: workload.run(durable_factory, path, report, groups=12,
                                                                unsynced_tail=3))
        assert how == "exit 0" and reports == list(range(12))
        self._check_reopened(durable_factory, path, workload, len(reports))

    def test_synced_data_survives_self_sigkill_with_unsynced_puts(self, durable_factory, path):
        """test_synced_data_survives_self_sigkill_with_unsynced_puts checks SIGKILL after puts loses nothing synced."""
        workload = Workload(group_size=50)

        def work(report):
            """work writes eight synced groups and two unsynced ones, then SIGKILLs its process."""
            workload.run(durable_factory, path, report, groups=8, unsynced_tail=2)
            kill_self()
        reports, how = run_in_child(work)
        assert how == "killed" and reports == list(range(8))
        self._check_reopened(durable_factory, path, workload, len(reports))

    def test_synced_data_survives_sigkill_mid_stream(self, durable_factory, path):
        """test_synced_data_survives_sigkill_mid_stream checks SIGKILL at any moment loses nothing synced."""
        workload = Workload(group_size=7, ledgers=4)
        reports, how = run_in_child(lambda report: workload.run(durable_factory, path, report, groups=None),
                                    kill_after=40)
        assert how == "killed" and reports == list(range(len(reports))) and len(reports) >= 40
        self._check_reopened(durable_factory, path, workload, len(reports))

    def test_recovered_storage_keeps_working_across_crashes(self, durable_factory, path):
        """test_recovered_storage_keeps_working_across_crashes checks a recovered storage survives another crash."""
        first = Workload(ledgers=2)
        reports, _ = run_in_child(lambda report: first.run(durable_factory, path, report, groups=5,
                                                           unsynced_tail=1))
        assert len(reports) == 5
        second = Workload(ledgers=5)             # ledgers 1-2 overlap; 3-5 are new

        def work(report):
            """work checks the first workload after its crash, adds five synced groups and SIGKILLs itself."""
            storage = durable_factory(path)
            first.check(storage, 5)
            for group in range(40, 45):
                second.write_group(storage, group)
                storage.sync()
                report(group)
            kill_self()
        reports, how = run_in_child(work)
        assert how == "killed" and reports == list(range(40, 45))
        storage = durable_factory(path)
        try:
            for n in range(40 * second.group_size, 45 * second.group_size):
                ledger_id, entry_id = second.place(n)
                assert storage.get(ledger_id, entry_id) == payload(ledger_id, entry_id)
            assert storage.ledger_state(1 + 42 % 5) == state_of(42)
            assert storage.get(1, 0) == payload(1, 0) and storage.get(2, 0) == payload(2, 0)
        finally:
            storage.close()

    @staticmethod
    def _check_reopened(factory, path, workload: Workload, synced_groups: int) -> None:
        """_check_reopened reopens the storage, checks the synced groups, and checks that it still takes writes."""
        storage = factory(path)
        try:
            workload.check(storage, synced_groups)
            storage.put(1, 10 ** 5, b"after recovery")
            storage.sync()
            assert storage.get(1, 10 ** 5) == b"after recovery"
        finally:
            storage.close()
