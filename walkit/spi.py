"""walkit.spi holds the plugin contracts: EntryStorage (bookie side) and MetadataStore.

A plugin is a class registered under the entry-point group ``walkit.storage`` or
``walkit.metadata`` with its URI scheme as the name, for example in a third-party
pyproject.toml::

    [project.entry-points."walkit.storage"]
    rocks = "walkit_rocks:RocksStorage"

The class is built with ``cls.from_uri(uri, **options)`` and must satisfy the Protocol below.
`walkit.testing` ships a conformance suite per contract; a backend is done when it passes it
unchanged.
"""

from __future__ import annotations

import enum
from typing import Callable, Iterable, Protocol, runtime_checkable

from walkit.core.bookie import LedgerState

__all__ = ["EntryStorage", "LedgerState", "MetadataStore", "Session", "SessionState", "Watch"]


@runtime_checkable
class EntryStorage(Protocol):
    """EntryStorage is where a bookie keeps entries and per-ledger state.

    Durability contract: `put`, `set_ledger_state`, `delete_ledger` (and the optional
    `delete_entries`) may be buffered; when `sync()` returns, every change made before the call
    is durable (survives SIGKILL of the process, and power loss where `durable` is True). The
    bookie calls `sync()` once per group of requests and acknowledges only after it returned.

    Threading: all methods are called from one thread.

    `durable` is a class attribute: False for backends that keep nothing across restarts (the
    conformance suite then skips its restart checks, and only those).
    """

    durable: bool

    @classmethod
    def from_uri(cls, uri: str, **options) -> "EntryStorage":
        """from_uri opens the storage named by `uri` (for example ``files:///var/lib/bookie``)."""
        ...

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """put stores (or overwrites) an entry's bytes; durable after the next sync()."""

    def sync(self) -> None:
        """sync makes every earlier change durable, then returns."""

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        """get returns an entry's bytes, or None if the entry is not stored."""

    # Optional, for speed: get_many(ledger_id, entry_ids) -> list[bytes | None] returns what `get`
    # would for each id, in order; bookies use it for batched reads when a backend defines it.
    # Likewise put_many(ledger_id, entries) stores [(entry_id, data), ...] as `put` would each,
    # all or none (a bad id raises before anything is stored); bookies use it for every add batch.
    #
    # Optional, for unbounded ledgers: delete_entries(ledger_id, before) drops the ledger's entries
    # below `before` and gives their space back (at once, or at the backend's next compaction), as
    # delete_ledger does for a whole ledger (fragments, not ledgers:
    # docs/internals/protocol.md#truncation). It is buffered like delete_ledger: durable after the
    # next sync() (a crash before it may leave any of them). From the call on, `get` of such an
    # entry is None and a `put` below the ledger's highest `before` stores nothing: a trim stays.
    # The ledger stays known with its state; `before` at or below an earlier trim, or a ledger not
    # known here, changes nothing.
    # `last_entry` is the highest id still stored, or, if none is, -1 or an id below `before`
    # (a backend may remember the ledger's last id). Bookies call it from garbage collection
    # (walkit.bookie.server) when a backend defines it; without it, truncation frees space only
    # on bookies no fragment names any more.

    def last_entry(self, ledger_id: int) -> int:
        """last_entry returns the highest entry id stored for a ledger, or -1."""

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        """ledger_state returns a ledger's state, or None if the ledger is unknown here."""

    def set_ledger_state(self, ledger_id: int, state: LedgerState) -> None:
        """set_ledger_state records a ledger's state (the ledger becomes known); durable after sync()."""

    def delete_ledger(self, ledger_id: int) -> None:
        """delete_ledger drops a ledger's entries and state and gives their space back."""

    def ledgers(self) -> Iterable[int]:
        """ledgers lists the ids of the ledgers known here."""

    def identity(self) -> bytes | None:
        """identity returns the disk identity last given to `set_identity`, or None if there is none.

        The bookie keeps its disk identity here (walkit.bookie.identity, BookKeeper's cookie):
        it must live with the data, so that storage emptied or replaced has none. A backend
        that is not `durable` forgets it with everything else.
        """

    def set_identity(self, data: bytes) -> None:
        """set_identity stores the disk identity; it is durable when the call returns (no sync() needed)."""

    def close(self) -> None:
        """close releases files and connections; the storage is unusable afterwards."""


class SessionState(enum.Enum):
    """SessionState is the health of a metadata client's session with its store."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"      # connection lost; the session may still come back
    LOST = "LOST"                # the session (and its ephemeral keys) is gone


class Session(Protocol):
    """Session keeps an ephemeral registration alive; closing it removes the key at once."""

    @property
    def key(self) -> str: ...

    def update(self, value: bytes) -> None:
        """update replaces the registered value (for example when a bookie turns read-only)."""

    def close(self) -> None:
        """close ends the registration and deletes its key."""


class Watch(Protocol):
    """Watch is a registered callback; cancel() stops further calls."""

    def cancel(self) -> None: ...


@runtime_checkable
class MetadataStore(Protocol):
    """MetadataStore is a versioned key space with compare-and-swap (docs/guides/plugins.md#metadata-store).

    Keys are ``/``-separated paths without a leading slash; values are bytes; every key has a
    version that changes on each write. Ledger, log and bookie-registry logic are built on top,
    in walkit itself, so every backend gets them unchanged.

    Errors: NodeExists, NoSuchKey, BadVersion, SessionLost and MetadataError from walkit.errors.
    Every call returns or raises within the store's `timeout` (seconds). A write cut off by a
    lost connection may fail with a MetadataError saying its outcome is unknown (it may or may
    not have been applied); callers re-read before deciding.

    Left to each backend: whether the parents of a key exist as keys of their own (ZooKeeper's
    do, as empty znodes; SQLite's and etcd's do not), so callers neither read nor delete
    parents. Watch callbacks are at-least-once and may name a parent path or the prefix itself.
    The key prefix ``.counters/`` is reserved for `next_id`.
    """

    @classmethod
    def from_uri(cls, uri: str, **options) -> "MetadataStore":
        """from_uri connects to the store named by `uri` (``sqlite:///path``, ``zk://...``)."""
        ...

    def create(self, key: str, value: bytes) -> int:
        """create makes `key` with `value` and returns its version; NodeExists if present."""

    def get(self, key: str) -> tuple[bytes, int]:
        """get returns (value, version); NoSuchKey if absent."""

    def put(self, key: str, value: bytes, expected_version: int) -> int:
        """put replaces the value if the version is `expected_version`, returning the new version.

        It raises BadVersion if the version differs and NoSuchKey if the key is absent.
        """

    def delete(self, key: str, expected_version: int | None = None) -> None:
        """delete removes `key` (only at `expected_version` if given); NoSuchKey if absent."""

    def children(self, prefix: str) -> list[str]:
        """children lists the names directly under `prefix` (a key path), sorted."""

    def next_id(self, counter: str) -> int:
        """next_id returns the next value (0, 1, 2, ...) of a named counter, unique across clients."""

    def register(self, key: str, value: bytes) -> Session:
        """register creates an ephemeral key that lives as long as the returned Session."""

    def watch(self, prefix: str, callback: Callable[[str], None]) -> Watch:
        """watch calls `callback(key)` (from another thread) after keys under `prefix` change."""

    @property
    def state(self) -> SessionState:
        """state is the current session state."""

    def add_state_listener(self, listener: Callable[[SessionState], None]) -> None:
        """add_state_listener calls `listener(state)` on every session state change."""

    def close(self) -> None:
        """close ends the session (ephemeral keys go) and releases connections."""
