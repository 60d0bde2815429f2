"""walkit.plugins.storage.memory keeps a bookie's entries in process memory (``memory://``).

Nothing survives a restart, so `durable` is False; `sync()` has nothing to wait for. Useful for
tests and for the embedded cluster when durability does not matter.
"""

from __future__ import annotations

from walkit.core.bookie import LedgerState


class MemoryStorage:
    """MemoryStorage is the ``memory://`` EntryStorage."""

    durable = False

    def __init__(self) -> None:
        self._entries: dict[int, dict[int, bytes]] = {}
        self._last: dict[int, int] = {}
        self._states: dict[int, LedgerState] = {}
        self._firsts: dict[int, int] = {}           # ledger -> its entries below this were deleted
        self._identity: bytes | None = None

    @classmethod
    def from_uri(cls, uri: str, **options) -> "MemoryStorage":
        """from_uri accepts ``memory://`` (anything after the scheme is ignored)."""
        return cls()

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """put stores an entry (none below the ledger's delete_entries point)."""
        if entry_id < self._firsts.get(ledger_id, 0):
            return
        self._entries.setdefault(ledger_id, {})[entry_id] = bytes(data)
        if entry_id > self._last.get(ledger_id, -1):
            self._last[ledger_id] = entry_id
        self._states.setdefault(ledger_id, LedgerState())

    def sync(self) -> None:
        """sync returns at once: memory is as durable as it gets."""

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        """get returns an entry or None."""
        entries = self._entries.get(ledger_id)
        return None if entries is None else entries.get(entry_id)

    def last_entry(self, ledger_id: int) -> int:
        """last_entry returns the highest stored entry id or -1."""
        return self._last.get(ledger_id, -1)

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        """ledger_state returns the ledger's state or None."""
        return self._states.get(ledger_id)

    def set_ledger_state(self, ledger_id: int, state: LedgerState) -> None:
        """set_ledger_state records the ledger's state."""
        self._states[ledger_id] = state

    def delete_ledger(self, ledger_id: int) -> None:
        """delete_ledger drops everything about a ledger."""
        self._entries.pop(ledger_id, None)
        self._last.pop(ledger_id, None)
        self._states.pop(ledger_id, None)
        self._firsts.pop(ledger_id, None)

    def delete_entries(self, ledger_id: int, before: int) -> None:
        """delete_entries drops a ledger's entries below `before`; later puts below it store nothing."""
        if before <= self._firsts.get(ledger_id, 0) or ledger_id not in self._states:
            return
        self._firsts[ledger_id] = before
        entries = self._entries.get(ledger_id)
        if entries:
            for entry_id in [e for e in entries if e < before]:
                del entries[entry_id]

    def identity(self) -> bytes | None:
        """identity returns the disk identity set since this storage was made (a restart makes a new disk)."""
        return self._identity

    def set_identity(self, data: bytes) -> None:
        """set_identity keeps the disk identity for as long as the process lives."""
        self._identity = bytes(data)

    def ledgers(self) -> list[int]:
        """ledgers lists the known ledger ids."""
        return sorted(self._states)

    def close(self) -> None:
        """close drops everything."""
        self._entries.clear()
        self._last.clear()
        self._states.clear()
        self._firsts.clear()
