"""tests.unit.helpers builds ledger metadata and entries, and picks commands out of step results.

The unit tests drive walkit.core machines by hand; these helpers keep each test down to the
events it feeds and the commands it expects.
"""

from __future__ import annotations

from walkit.core import events as ev
from walkit.core.digest import Digest, master_key
from walkit.core.messages import Entry
from walkit.core.metadata import OPEN, LedgerMetadata

LEDGER_ID = 7
PASSWORD = b"secret"
MASTER_KEY = master_key(PASSWORD)
DIGEST = Digest("crc32c")


def bookies(count: int, first: int = 1) -> tuple[str, ...]:
    """bookies returns the addresses "B<first>" .. "B<first + count - 1>"."""
    return tuple(f"B{i}" for i in range(first, first + count))


def make_metadata(ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2, *,
                  fragments: dict[int, tuple[str, ...]] | None = None, state: str = OPEN,
                  last_entry_id: int | None = None, ledger_id: int = LEDGER_ID) -> LedgerMetadata:
    """make_metadata returns ledger metadata; the default single fragment is B1..BE from entry 0."""
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=ensemble_size, write_quorum=write_quorum,
                          ack_quorum=ack_quorum, ensembles=fragments or {0: bookies(ensemble_size)},
                          state=state, last_entry_id=last_entry_id)


def make_entry(entry_id: int, payload: bytes | None = None, *, lac: int = -1, ledger_id: int = LEDGER_ID,
               digest: Digest = DIGEST) -> Entry:
    """make_entry returns a correctly signed entry (payload defaults to b"e<entry_id>")."""
    payload = f"e{entry_id}".encode() if payload is None else payload
    return Entry(ledger_id, entry_id, lac, digest.sign(ledger_id, entry_id, lac, payload), payload)


def corrupt(entry: Entry) -> Entry:
    """corrupt returns the entry with a payload its digest no longer covers."""
    return entry._replace(payload=entry.payload + b"!")


def of_type(commands: list, kind: type) -> list:
    """of_type returns the commands of exactly type `kind`, in order."""
    return [c for c in commands if type(c) is kind]


def only(commands: list, kind: type):
    """only returns the single command of type `kind`, failing if there are none or several."""
    found = of_type(commands, kind)
    assert len(found) == 1, f"expected one {kind.__name__}, got {commands!r}"
    return found[0]


def sent_adds(commands: list) -> dict[str, list[int]]:
    """sent_adds maps each bookie to the entry ids the SendAdds commands send it."""
    out: dict[str, list[int]] = {}
    for command in of_type(commands, ev.SendAdds):
        out.setdefault(command.bookie, []).extend(e.entry_id for e in command.entries)
    return out


def sent_reads(commands: list) -> dict[str, list[int]]:
    """sent_reads maps each bookie to the entry ids the SendRead commands ask it for."""
    out: dict[str, list[int]] = {}
    for command in of_type(commands, ev.SendRead):
        out.setdefault(command.bookie, []).extend(command.entry_ids)
    return out
