"""walkit.errors holds the typed errors that cross walkit's public API.

Every error derives from `WalkitError`, so `except walkit.errors.WalkitError` catches anything
walkit raises on purpose. Errors that a bookie reports carry the bookie's status name.
"""

from __future__ import annotations


class WalkitError(Exception):
    """WalkitError is the base of every error walkit raises on purpose."""


class ConfigError(WalkitError, ValueError):
    """ConfigError is raised for invalid arguments, URIs and configuration values."""


class PluginNotFound(ConfigError):
    """PluginNotFound is raised when a URI names a scheme no installed plugin provides."""


class Timeout(WalkitError, TimeoutError):
    """Timeout is raised when an operation did not finish within its timeout."""


class NotEnoughBookies(WalkitError):
    """NotEnoughBookies is raised when fewer live, writable bookies exist than a ledger needs."""


class NoSuchLedger(WalkitError, KeyError):
    """NoSuchLedger is raised when a ledger id is not in the metadata store."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return Exception.__str__(self)


class LedgerFenced(WalkitError):
    """LedgerFenced is raised when another client fenced (recovered) the ledger.

    As BookKeeper's protocol notes, an add that fails with LedgerFenced may or may not be part
    of the ledger: only the recovered ledger's last entry says. Treat it like a timeout.
    """


class LedgerClosed(WalkitError):
    """LedgerClosed is raised when writing to a ledger that is already closed."""


class BadVersion(WalkitError):
    """BadVersion is raised when a compare-and-swap found a different version than expected."""


class NodeExists(WalkitError):
    """NodeExists is raised when creating a metadata key that already exists."""


class NoSuchKey(WalkitError, KeyError):
    """NoSuchKey is raised when a metadata key does not exist."""

    def __str__(self) -> str:
        return Exception.__str__(self)


class MetadataError(WalkitError):
    """MetadataError is raised when the metadata store cannot complete an operation."""


class MetadataNotAuthorized(MetadataError):
    """MetadataNotAuthorized is raised when the metadata store's ACL does not admit this client for a key."""


class SessionLost(MetadataError):
    """SessionLost is raised for operations in flight when a metadata session is lost."""


class DigestMismatch(WalkitError):
    """DigestMismatch is raised when no replica returned an entry whose digest verifies."""


class Unauthorized(WalkitError):
    """Unauthorized is raised when a bookie refuses the ledger password (master key)."""


class PermissionDenied(Unauthorized):
    """PermissionDenied is raised when the caller's principal lacks the permission an action needs.

    `principal` is the caller's ("" without a key), `needed` the level (read, write, admin),
    `resource` what it was asked for ("log orders", "ledger 7"). Checked by the client before a
    metadata-only action (delete, truncate, roll, grants) and by the metadata store that holds
    per-principal ACLs (walkit.permissions).
    """

    def __init__(self, message: str, principal: str = "", needed: str = "", resource: str = "") -> None:
        super().__init__(message)
        self.principal = principal
        self.needed = needed
        self.resource = resource


class NoSuchEntry(WalkitError):
    """NoSuchEntry is raised when an entry cannot be read from any replica of its write set."""


class BookieError(WalkitError):
    """BookieError is raised when bookies answered with an error that has no narrower type."""

    def __init__(self, message: str, status: str = "IO_ERROR") -> None:
        super().__init__(message)
        self.status = status


class ProtocolError(WalkitError):
    """ProtocolError is raised when a peer sends a message that does not follow the protocol."""


class ClientClosed(WalkitError):
    """ClientClosed is raised for calls made on (or pending in) a client that was closed."""


class StorageError(WalkitError, OSError):
    """StorageError is raised when a bookie's entry storage is corrupt or failed and must be reopened."""


class LedgerStorageError(StorageError):
    """LedgerStorageError is raised by `EntryStorage.sync()` when only some ledgers failed.

    `ledgers` names them; every other change made before the sync is durable, so a bookie fails
    the requests of those ledgers and goes on serving the rest.
    """

    def __init__(self, message: str, ledgers) -> None:
        super().__init__(message)
        self.ledgers = frozenset(ledgers)


class NoSuchLog(WalkitError, KeyError):
    """NoSuchLog is raised when a log name is not in the metadata store."""

    def __str__(self) -> str:
        return Exception.__str__(self)


class LogContention(WalkitError):
    """LogContention is raised when open_log keeps losing the ledger-list CAS to other writers."""


class NotLeader(WalkitError):
    """NotLeader is raised by a replicated node that is not the leader: submit there instead.

    `leader` is the node id of the leader as last known (None while unknown). `maybe_in_log` is
    True when the record had been sent to the log before the node stopped leading: it may be in
    the log (then every node applies it), so it must be treated as an unknown outcome, not a
    refusal. False means the record was never appended.
    """

    def __init__(self, message: str, leader: str | None = None, *, maybe_in_log: bool = False) -> None:
        super().__init__(message)
        self.leader = leader
        self.maybe_in_log = maybe_in_log


class LogTruncated(WalkitError):
    """LogTruncated is raised to a log reader when truncation removed records it had not read yet."""


class RecordTooLarge(WalkitError, ValueError):
    """RecordTooLarge is raised at once for a record (or ledger entry) larger than its limit.

    Nothing was sent and nothing else changed: the writer, the ledger, the log and a replicated
    node's leadership go on as before, and the next record that fits is appended as usual.
    walkit refuses such a record instead of splitting it. `size` is the record's length in
    bytes, `limit` the largest allowed, and `setting` names the setting that sets the limit.
    """

    def __init__(self, message: str, size: int = 0, limit: int = 0, setting: str = "") -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit
        self.setting = setting


class StaleSubmit(WalkitError):
    """StaleSubmit answers a sessioned submit whose seq is below one its client had applied already.

    The record was not applied: the client moved on past it (walkit.core.sessions).
    """


class DuplicateError(WalkitError):
    """DuplicateError answers the retry of a sessioned submit whose first application raised.

    The record was applied once, and raised then; `kind` is the name of that exception's type
    and the message is its message (the exception itself is not kept, only its text).
    """

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind
