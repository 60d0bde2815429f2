"""walkit.client.api is the public client: Client, WriteHandle and ReadHandle (docs/guides/ledgers-and-logs.md).

    client = walkit.Client("sqlite:///walkit-data/metadata.db")
    w = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
    w.append(b"data")                     # blocks until acknowledged; returns the entry id
    w.append_async(b"more")               # a concurrent.futures.Future[int]; pipelined
    w.close()
    r = client.open_ledger(w.ledger_id, password=b"pw")
    for entry in r.read(0, r.last_add_confirmed): ...

Every blocking call takes `timeout` (seconds; default: the client's) and raises
walkit.errors.Timeout when it runs out.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

from walkit.client.drivers import Batch, OutcomeDriver, ReaderDriver, WriterDriver
from walkit.client.log import LogWriter, delete_log, list_logs, open_log, read_log, read_log_metadata
from walkit.client.loop import ClientLoop, now_ms, result_within
from walkit.core import events as ev
from walkit.core.digest import DIGEST_TYPES, Digest, master_key, password_check
from walkit.core.loglist import LogConfig
from walkit.core.messages import DEFAULT_MAX_READ_BYTES, NOOP_PAYLOAD, Entry
from walkit.core.metadata import (
    CLOSED, LEDGER_ID_COUNTER, LEDGER_PREFIX, LedgerMetadata, check_quorums, ledger_id_of, ledger_key,
)
from walkit.core.reader import LacReader, RangeReader
from walkit import deletions, permissions
from walkit.core.recovery import LedgerRecovery
from walkit.core.writer import DEFAULT_FRAGMENT_MAX_BYTES, DEFAULT_MAX_BYTES_IN_FLIGHT, LedgerWriter
from walkit.errors import (
    BadVersion, ClientClosed, ConfigError, NodeExists, NoSuchEntry, NoSuchKey, NoSuchLedger, RecordTooLarge, Timeout,
    Unauthorized,
)
from walkit.metrics import client_metrics
from walkit.plugins import open_metadata
from walkit.registry import BookieInfo, BookieRegistry
from walkit.wire.codec import DEFAULT_MAX_FRAME

#: The largest `max_entry_bytes`: a bookie frame (walkit.wire.codec.DEFAULT_MAX_FRAME) less room
#: for what travels with the payload (the envelope, the add's fields and digest: a few hundred bytes).
MAX_ENTRY_BYTES = DEFAULT_MAX_FRAME - 64 * 1024
#: The default of `max_entry_bytes`: 60 MiB, so an entry leaves 4 MiB of its 64 MiB frame to the
#: requests the client sends to the same bookie in the same frame.
DEFAULT_MAX_ENTRY_BYTES = DEFAULT_MAX_FRAME - 4 * 1024 * 1024


#: How many ledger ids create_ledger draws before it gives up on ids that are taken.
CREATE_ATTEMPTS = 100


def _password(password: bytes | str) -> bytes:
    if isinstance(password, str):
        return password.encode()
    if not isinstance(password, (bytes, bytearray)):
        raise ConfigError(f"password must be bytes or str, not {type(password).__name__}")
    return bytes(password)


def _fragment_limits(entries, size, age_s, unbounded: bool = True) -> dict:
    """_fragment_limits checks the fragment rotation settings and returns them as LedgerWriter's keywords.

    Only unbounded ledgers rotate: a bounded one given other values than the defaults is a
    ConfigError (its defaults are ignored).
    """
    for name, value in (("fragment_max_entries", entries), ("fragment_max_bytes", size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{name} must be a non-negative integer (0: no limit), got {value!r}")
    if (not isinstance(age_s, (int, float)) or isinstance(age_s, bool) or not 0 <= age_s < math.inf):
        raise ConfigError(f"fragment_max_age_s must be 0 (no limit) or positive seconds, got {age_s!r}")
    if not unbounded:
        if (entries, size, age_s) != (0, DEFAULT_FRAGMENT_MAX_BYTES, 0):
            raise ConfigError("fragment_max_entries, fragment_max_bytes and fragment_max_age_s apply to unbounded "
                              "ledgers only (a bounded ledger ends; it is never rotated)")
        return {}
    return {"fragment_max_entries": entries, "fragment_max_bytes": size,
            "fragment_max_ms": math.ceil(age_s * 1000)}


class Client:
    """Client talks to one walkit cluster: its metadata store and its bookies.

    `metadata` is a metadata URI (``sqlite:///path``, ``zk://host:port/root``,
    ``etcd://host:port/root``) or an open MetadataStore. `timeout` is the default for every
    blocking call; `add_timeout` is how long a bookie may take to acknowledge an add before the
    writer replaces it; `request_timeout` is how long any request may go unanswered. Use it as
    a context manager or call `close()`.

    Reads are speculative, as BookKeeper's: an entry a bookie has not returned within
    `speculative_read_timeout` seconds is also asked of the next replica (the first may still
    answer), and that bookie is asked last for a minute, so a stalled bookie delays a read by
    about that long. 0 turns it off (a stalled bookie then costs `request_timeout`).

    On a secured cluster `key` is the client's key pair, the ``NAME.key_secret`` file that
    `walkit keys new NAME` wrote; it defaults to the file named by the WALKIT_KEY environment
    variable (so every walkit server and command finds it: `walkit --key FILE ...` sets it).
    The key's public half is the client's principal (`principal`), which owns the ledgers and
    logs it creates.

    `min_racks` is the default placement rule of `create_ledger`: every write set spans at
    least that many racks (bookies register with `--rack`; walkit.placement), capped at each
    ledger's write quorum. Appends are counted in the process's client metrics
    (walkit.metrics.client_metrics).

    `max_bytes_in_flight` bounds the payload bytes each writer (ledger or log) has sent to
    bookies and not yet had acknowledged; appends beyond it wait in the client, in order, and
    go as earlier ones complete, so a large window of large entries slows down instead of
    making every bookie miss the add timeout.

    `max_read_bytes` bounds the bytes of entries one bookie answer to a read holds (BookKeeper
    BP-62): 8 MiB by default (walkit.core.messages.DEFAULT_MAX_READ_BYTES). A bookie stops an
    answer before the entry that would pass it (it always returns one entry, however large)
    and says which ids it did not look at; reads, recoveries and log readers ask for those
    again, so a read of any length and entry size streams in answers that fit a frame. A
    bookie never answers with more than its own bound (a frame, 64 MiB, less 64 KiB).

    `max_entry_bytes` is the largest entry (ledger entry or log record) an append takes: 60 MiB
    by default, at most MAX_ENTRY_BYTES (a bookie frame, 64 MiB, less 64 KiB). A larger one is
    refused at once with RecordTooLarge before anything is queued or sent; the writer goes on.
    Entries are refused, never split: split a large payload into records yourself.
    """

    def __init__(self, metadata, *, timeout: float = 30.0, add_timeout: float = 5.0,
                 request_timeout: float = 10.0, transport=None, key: str | None = None,
                 min_racks: int = 1, max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT,
                 max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
                 speculative_read_timeout: float = 2.0, max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> None:
        if timeout <= 0 or add_timeout <= 0 or request_timeout <= 0:
            raise ConfigError("timeouts must be positive")
        if (not isinstance(speculative_read_timeout, (int, float)) or isinstance(speculative_read_timeout, bool)
                or not 0 <= speculative_read_timeout < math.inf):
            raise ConfigError(f"speculative_read_timeout must be 0 (off) or positive seconds, "
                              f"got {speculative_read_timeout!r}")
        if not isinstance(min_racks, int) or isinstance(min_racks, bool) or min_racks < 1:
            raise ConfigError(f"min_racks must be a positive integer, got {min_racks!r}")
        if not isinstance(max_bytes_in_flight, int) or isinstance(max_bytes_in_flight, bool) or max_bytes_in_flight < 1:
            raise ConfigError(f"max_bytes_in_flight must be a positive integer, got {max_bytes_in_flight!r}")
        if not isinstance(max_read_bytes, int) or isinstance(max_read_bytes, bool) or max_read_bytes < 1:
            raise ConfigError(f"max_read_bytes must be a positive integer, got {max_read_bytes!r}")
        if (not isinstance(max_entry_bytes, int) or isinstance(max_entry_bytes, bool)
                or not 1 <= max_entry_bytes <= MAX_ENTRY_BYTES):
            raise ConfigError(f"max_entry_bytes must be an integer from 1 to {MAX_ENTRY_BYTES} (a bookie frame "
                              f"of {DEFAULT_MAX_FRAME} bytes less room for its envelope), got {max_entry_bytes!r}")
        self.timeout = timeout
        self.max_entry_bytes = max_entry_bytes
        self.add_timeout = add_timeout
        self.max_bytes_in_flight = max_bytes_in_flight
        self.max_read_bytes = max_read_bytes
        self.min_racks = min_racks
        self.speculative_read_ms = int(speculative_read_timeout * 1000)
        self.metrics = client_metrics()
        self.principal = ""
        curve = None
        if key is None:
            key = os.environ.get("WALKIT_KEY") or None
        if key is not None:                  # a secured cluster: talk CurveZMQ with this key pair
            from walkit.security import load_keys, principal
            public, secret = load_keys(key)
            if secret is None:
                raise ConfigError(f"{key!r} holds no secret key: use the NAME.key_secret file")
            curve, self.principal = (public, secret), principal(public)
        self._owns_store = isinstance(metadata, str)
        self.metadata_url = metadata if isinstance(metadata, str) else getattr(metadata, "uri", repr(metadata))
        self.store = open_metadata(metadata) if isinstance(metadata, str) else metadata
        self._check_identity()
        self.registry = BookieRegistry(self.store)
        if transport is None:
            from walkit.transport.zmq import ZmqTransport
            transport = ZmqTransport(curve=curve, lookup=self.registry.info)   # ids to endpoints and keys
        self._loop = ClientLoop(transport, self.store, request_timeout_ms=int(request_timeout * 1000))
        self._loop.dispatcher.max_read_bytes = max_read_bytes      # every ReadRequest's max_bytes
        self._closed = False

    def check_entry(self, size: int, what: str = "an entry") -> None:
        """check_entry raises RecordTooLarge if an entry of `size` bytes is over `max_entry_bytes`.

        Appends call it before they queue anything, so a refused entry changes nothing.
        """
        if size > self.max_entry_bytes:
            raise RecordTooLarge(f"{what} of {size} bytes is over the limit of {self.max_entry_bytes} bytes "
                                 f"(walkit.Client's max_entry_bytes, at most {MAX_ENTRY_BYTES}: a bookie frame "
                                 f"carries {DEFAULT_MAX_FRAME}); it was refused, not sent, and not split",
                                 size, self.max_entry_bytes, "walkit.Client(max_entry_bytes=...)")

    # -- ledgers ----------------------------------------------------------------------------
    def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, *,
                      password: bytes | str = b"", digest: str = "crc32c",
                      custom: dict[str, str] | None = None, timeout: float | None = None,
                      min_racks: int | None = None,
                      guaranteed_write_quorum: bool = False, unbounded: bool = False,
                      deferred_sync: bool = False, fragment_max_entries: int = 0,
                      fragment_max_bytes: int = DEFAULT_FRAGMENT_MAX_BYTES,
                      fragment_max_age_s: float = 0) -> "WriteHandle":
        """create_ledger makes a new ledger on `ensemble` random live bookies and opens it for writing.

        An `unbounded` ledger (docs/internals/protocol.md#unbounded-ledgers) has no end: any client
        may take it over with `reopen_ledger`, which fences the current writer by moving the ledger
        to a new term, and `truncate_ledger` deletes its oldest entries with the fragments that held
        them. Unbounded ledgers always use guaranteed write quorum. Readers never see the no-op
        entries that end each takeover's recovery; appending the no-op payload itself
        (walkit.core.messages.NOOP_PAYLOAD) is refused.

        An unbounded ledger's writer rotates fragments: once the current fragment holds
        `fragment_max_entries` entries, `fragment_max_bytes` payload bytes (64 MiB by default,
        as a log's `roll_bytes`) or has been written for `fragment_max_age_s` seconds (0 turns
        each off), a new fragment starts, on other bookies where the cluster has writable ones,
        else on the same ones (walkit.core.writer). A bookie gives back the space of truncated
        entries up to the start of the last fragment, so the limits bound what truncation
        leaves on disk. The writer writes on through a rotation (appends complete after its
        metadata write). Bounded ledgers take no fragment limits.

        With `guaranteed_write_quorum`, appends are still acknowledged at `ack_quorum`, but the
        writer keeps every entry until it is on all `write_quorum` bookies (replacing failed
        bookies as needed), and close and recovery wait for that: every entry of the closed
        ledger is on `write_quorum` bookies, not only `ack_quorum` (see walkit.core.writer).

        With `deferred_sync` (BookKeeper's WriteFlag.DEFERRED_SYNC) bookies acknowledge appends
        before they are durable: appends complete sooner, and `WriteHandle.force()` makes every
        entry appended before it durable on `ack_quorum` bookies. The LAC (what readers see)
        moves only over forced entries; close forces everything first. A crash may take back
        acknowledged entries that were not forced, and the writer never replaces a bookie: one
        that fails or restarts ends it (NotEnoughBookies), and recovery closes the ledger with
        every forced entry. It cannot be combined with guaranteed write quorum or unbounded.

        The ensemble is placed rack-aware: each write set spans as many racks as the writable
        bookies allow, and at least `min_racks` (default: the client's, capped at the write
        quorum); NotEnoughBookies says so when the racks cannot give that.

        It raises ConfigError unless ensemble >= write_quorum >= ack_quorum >= 1 (and
        1 <= min_racks <= write_quorum), and NotEnoughBookies when fewer than `ensemble`
        writable bookies are registered. Creating
        takes three metadata calls (pick bookies, draw an id, create the record), each bounded
        by the metadata store's own timeout; `timeout` becomes the default timeout of the
        returned handle's blocking calls.
        """
        self._check_open()
        check_quorums(ensemble, write_quorum, ack_quorum)
        rotation = _fragment_limits(fragment_max_entries, fragment_max_bytes, fragment_max_age_s, bool(unbounded))
        if deferred_sync and (guaranteed_write_quorum or unbounded):
            raise ConfigError("deferred_sync cannot be combined with guaranteed_write_quorum or unbounded")
        if digest not in DIGEST_TYPES:
            raise ConfigError(f"unknown digest {digest!r}; expected one of {', '.join(DIGEST_TYPES)}")
        password = _password(password)
        racks = min(self.min_racks, write_quorum) if min_racks is None else min_racks
        permissions.check_create(self.store, self.principal, "a ledger")
        bookies = self.registry.choose(ensemble, write_quorum=write_quorum, min_racks=racks)
        for attempt in range(CREATE_ATTEMPTS):
            ledger_id = self.store.next_id(LEDGER_ID_COUNTER)
            metadata = LedgerMetadata(
                ledger_id=ledger_id, ensemble_size=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
                ensembles={0: tuple(bookies)}, digest_type=digest, password_check=password_check(password),
                created_ms=int(time.time() * 1000), custom=dict(custom or {}), owner=self.principal,
                guaranteed_write_quorum=bool(guaranteed_write_quorum or unbounded), unbounded=bool(unbounded),
                term=1 if unbounded else 0).with_fragment(0, tuple(bookies),
                                                          tuple(bookies.disks.get(b, 0) for b in bookies))
            try:
                version = self.store.create(ledger_key(ledger_id), metadata.to_bytes())
                break
            except NodeExists:
                # The id is taken (a counter wound back, or an id of a deleted ledger in ZooKeeper's principal
                # mode, walkit.plugins.metadata.zookeeper_principals): draw the next one, as the dispatcher does.
                if attempt == CREATE_ATTEMPTS - 1:
                    raise
        machine = LedgerWriter(metadata, version, master_key=master_key(password),
                               digest=Digest(digest, password), add_timeout_ms=int(self.add_timeout * 1000),
                               now_ms=now_ms(), max_bytes_in_flight=self.max_bytes_in_flight,
                               deferred_sync=bool(deferred_sync), **rotation)
        return WriteHandle(self, machine, timeout or self.timeout)

    def open_ledger(self, ledger_id: int, *, password: bytes | str = b"", recover: bool = False,
                    timeout: float | None = None) -> "ReadHandle":
        """open_ledger opens a ledger for reading.

        With recover=False nothing is fenced: a live writer goes on, and entries are readable up
        to the LAC read at open time (refresh with `read_last_add_confirmed`). With recover=True
        the ledger is fenced, recovered and closed (the writer, if alive, gets LedgerFenced), and
        every entry up to its last one is readable. A wrong password raises Unauthorized.
        """
        self._check_open()
        timeout = timeout or self.timeout
        password = _password(password)
        metadata, version = self._get_metadata(ledger_id)
        self.check_ledger(metadata, "append" if recover and metadata.state != CLOSED else "read")
        if metadata.password_check and metadata.password_check != password_check(password):
            raise Unauthorized(f"wrong password for ledger {ledger_id}")
        digest = Digest(metadata.digest_type, password)
        if recover and metadata.state != CLOSED:
            machine = LedgerRecovery(metadata, version, master_key=master_key(password), digest=digest,
                                     timeout_ms=int(timeout * 1000), add_timeout_ms=int(self.add_timeout * 1000),
                                     now_ms=now_ms(), holder=secrets.token_hex(8))
            metadata, version = self._run(machine, timeout, f"recovery of ledger {ledger_id}")
        if metadata.state == CLOSED:
            lac = metadata.last_entry_id
        else:
            lac = self._run(LacReader(metadata), timeout, f"reading the LAC of ledger {ledger_id}")
        return ReadHandle(self, metadata, digest, lac, timeout)

    def reopen_ledger(self, ledger_id: int, *, password: bytes | str = b"", timeout: float | None = None,
                      fragment_max_entries: int = 0, fragment_max_bytes: int = DEFAULT_FRAGMENT_MAX_BYTES,
                      fragment_max_age_s: float = 0) -> "WriteHandle":
        """reopen_ledger takes over an unbounded ledger and returns a WriteHandle in a new term.

        The ledger moves to the next term (its current writer's appends fail with LedgerFenced
        from then on), is recovered (every entry that may have been acknowledged stays, on all
        write-quorum bookies), and a no-op entry ends the old term's tail on every bookie of the
        last fragment; appends then continue after it. Two clients reopening at once battle:
        one of them wins, the other gets LedgerFenced. ConfigError for a bounded ledger,
        LedgerClosed for a closed one, Unauthorized for a wrong password. The fragment limits
        are the new writer's (as in `create_ledger`; a fragment it took over counts its entries
        by id, its bytes and age from the takeover).
        """
        self._check_open()
        rotation = _fragment_limits(fragment_max_entries, fragment_max_bytes, fragment_max_age_s)
        timeout = timeout or self.timeout
        password = _password(password)
        metadata, version = self._get_metadata(ledger_id)
        if not metadata.unbounded:
            raise ConfigError(f"ledger {ledger_id} is not unbounded: only unbounded ledgers can be reopened "
                              "(open it with open_ledger(recover=True) to close it)")
        self.check_ledger(metadata, "append")
        if metadata.password_check and metadata.password_check != password_check(password):
            raise Unauthorized(f"wrong password for ledger {ledger_id}")
        digest = Digest(metadata.digest_type, password)
        machine = LedgerRecovery(metadata, version, master_key=master_key(password), digest=digest,
                                 timeout_ms=int(timeout * 1000), add_timeout_ms=int(self.add_timeout * 1000),
                                 now_ms=now_ms(), reopen=True, holder=secrets.token_hex(8))
        done = self._run(machine, timeout, f"reopening ledger {ledger_id}", whole=True)
        writer = LedgerWriter(done.metadata, done.version, master_key=master_key(password), digest=digest,
                              add_timeout_ms=int(self.add_timeout * 1000), now_ms=now_ms(),
                              last_entry_id=done.last_entry_id, max_bytes_in_flight=self.max_bytes_in_flight,
                              **rotation)
        return WriteHandle(self, writer, timeout)

    def truncate_ledger(self, ledger_id: int, before: int) -> LedgerMetadata:
        """truncate_ledger deletes the entries of an unbounded ledger below `before`.

        The fragments that held only such entries leave the metadata (so it stays small however
        long the ledger lives). At their next garbage collection, bookies no longer named by any
        fragment drop the ledger, and every other bookie drops its entries below `before` up
        to the start of the last fragment (recovery reads from there) and gives the space
        back: rotation (`create_ledger`'s fragment limits) keeps that bound close behind the
        writer. `before` may not pass the last entry confirmed to readers (the LAC the bookies
        report). Reading below the new first entry raises NoSuchEntry. It needs `write` on the
        ledger (walkit.permissions), else PermissionDenied.
        """
        self._check_open()
        while True:
            metadata, version = self._get_metadata(ledger_id)
            self.check_ledger(metadata, "truncate")
            if not metadata.unbounded:
                raise ConfigError(f"ledger {ledger_id} is not unbounded: delete the ledger instead")
            end = self.ledger_lac(ledger_id, metadata)
            if before > end + 1:
                raise ConfigError(f"cannot truncate ledger {ledger_id} before entry {before}: only entries "
                                  f"up to {end} are confirmed")
            truncated = metadata.truncated(before)
            if truncated == metadata:
                return metadata
            try:
                self.store.put(ledger_key(ledger_id), truncated.to_bytes(), version)
                return truncated
            except BadVersion:
                continue                     # the writer changed the ensemble meanwhile: again

    def ledger_lac(self, ledger_id: int, metadata: LedgerMetadata | None = None, timeout: float | None = None) -> int:
        """ledger_lac returns a ledger's last entry confirmed to readers: the last entry once closed,
        else the LAC the bookies of its last fragment report."""
        metadata = metadata or self.ledger_metadata(ledger_id)
        if metadata.state == CLOSED:
            return metadata.last_entry_id
        return self._run(LacReader(metadata), timeout or self.timeout, f"reading the LAC of ledger {ledger_id}")

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """ledger_metadata returns the current metadata of a ledger (NoSuchLedger if absent)."""
        return self._get_metadata(ledger_id)[0]

    def list_ledgers(self) -> list[int]:
        """list_ledgers returns the ids of all ledgers, ascending."""
        self._check_open()
        return sorted(ledger_id_of(name) for name in self.store.children(LEDGER_PREFIX.rstrip("/"))
                      if len(name) == 20 and name.isascii() and name.isdigit())     # only keys ledger_key writes

    def delete_ledger(self, ledger_id: int) -> None:
        """delete_ledger removes a ledger; its bookies drop its data at their next garbage collection.

        It leaves a deletion marker first (walkit.deletions): bookies drop data only on that sign.
        It needs `write` on the ledger's log, or `admin` on a ledger of no log (its owner):
        anyone else gets PermissionDenied and nothing changes (walkit.permissions).
        """
        self._check_open()
        self.check_ledger(self._get_metadata(ledger_id)[0], "delete")
        deletions.delete_ledger(self.store, ledger_id)

    # -- logs ------------------------------------------------------------------------------
    def open_log(self, name: str, *, password: bytes | str = b"", timeout: float | None = None,
                 **config) -> LogWriter:
        """open_log makes this client the single writer of log `name`, creating it if needed.

        Any previous writer is fenced (its appends fail with LedgerFenced). Keyword options of
        walkit.LogConfig (ensemble, write_quorum, ack_quorum, roll_entries, roll_bytes,
        roll_age_s, retention_age_s, retention_bytes, digest) apply when the log is created.
        An open that does not finish within `timeout` raises Timeout and is stopped (closed, if
        it got as far as opening), so no writer is left holding the log; it may have fenced the
        previous writer.
        """
        self._check_open()
        return open_log(self, name, password=_password(password), config=LogConfig(**config) if config else None,
                        timeout=timeout)

    def read_log(self, name: str, start=None, follow: bool = False, *, password: bytes | str = b"",
                 poll: float = 1.0):
        """read_log yields LogRecord(position, payload) of log `name` from `start` (a Position).

        With follow=True it tails the log forever: across rolls and writer handovers, each
        record exactly once, in order. `poll` bounds how long it waits between checks.
        """
        self._check_open()
        return read_log(self, name, start=start, follow=follow, password=_password(password), poll_s=poll)

    def log_metadata(self, name: str):
        """log_metadata returns a log's LogMetadata (its ledgers in order); NoSuchLog if absent."""
        self._check_open()
        return read_log_metadata(self.store, name)[0]

    def list_logs(self) -> list[str]:
        """list_logs returns the names of all logs."""
        self._check_open()
        return list_logs(self.store)

    def delete_log(self, name: str) -> None:
        """delete_log removes a log and all its ledgers; it needs `admin` on the log (its owner, or a grant)."""
        self._check_open()
        delete_log(self, name)

    def bookies(self) -> dict[str, BookieInfo]:
        """bookies maps the address of every live bookie to what it registered."""
        return self.registry.live()

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """close stops the I/O thread (pending calls fail with ClientClosed) and the metadata session."""
        if self._closed:
            return
        self._closed = True
        self._loop.stop()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- permissions ------------------------------------------------------------------------
    def _check_identity(self) -> None:
        """_check_identity refuses a metadata user named by a principal other than this client's key's: it would
        own what this client creates in ZooKeeper (principal mode) while bookies know the client as its key."""
        from walkit.plugins.metadata.principals import is_principal
        user = getattr(self.store, "user", None)
        if is_principal(user) and user != self.principal:
            if self._owns_store:
                self.store.close()
            held = f"key {self.principal}" if self.principal else "no key"
            raise ConfigError(f"the metadata store's user {user} is a principal, and this client has {held}: give the "
                              f"client that principal's key (walkit.Client(url, key=...), --key, WALKIT_KEY)")

    def check_ledger(self, metadata: LedgerMetadata, action: str) -> None:
        """check_ledger raises PermissionDenied unless this client's principal may do `action`
        (read, append, truncate, delete) on the ledger (walkit.permissions; read afresh)."""
        permissions.check_ledger(self.store, self.principal, metadata, action)

    def check_log(self, name: str, action: str, metadata=None) -> None:
        """check_log raises PermissionDenied unless this client's principal may do `action`
        (read, append, roll, truncate, delete, grant) on log `name` (walkit.permissions)."""
        permissions.check_log(self.store, self.principal, name, action, metadata)

    # -- internals --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed")

    def _get_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        self._check_open()
        try:
            value, version = self.store.get(ledger_key(ledger_id))
        except NoSuchKey:
            raise NoSuchLedger(f"no ledger {ledger_id}") from None
        return LedgerMetadata.from_bytes(value), version

    def ledger_end(self, ledger_id: int, *, timeout: float | None = None) -> int:
        """ledger_end returns the highest entry of a ledger that may have been acknowledged.

        For a closed ledger that is its last entry. For an unclosed one it is the highest entry
        stored by the bookies that answered (at least EC = (E - Qa) + 1 of the last fragment's),
        which bounds every entry the writer acknowledged so far, even those the bookies' LAC does
        not cover yet. Linearizable read barriers wait for it (walkit.replicate).
        """
        metadata = self.ledger_metadata(ledger_id)
        if metadata.state == CLOSED:
            return metadata.last_entry_id
        timeout = timeout or self.timeout
        done = self._run(LacReader(metadata), timeout, f"reading the end of ledger {ledger_id}", whole=True)
        return done.last_entry_id

    def _run(self, machine, timeout: float, what: str, whole: bool = False):
        """_run drives a one-shot machine (recovery, LAC read) on the I/O thread and waits."""
        future: Future = Future()
        driver = OutcomeDriver(machine, future, whole)
        self._loop.call(lambda: self._loop.attach(driver, machine.start()))
        return result_within(future, timeout, what)


class WriteHandle:
    """WriteHandle appends to a ledger this client created; only one writer exists per ledger."""

    def __init__(self, client: Client, machine: LedgerWriter, timeout: float) -> None:
        self._client = client
        self._loop = client._loop
        self._machine = machine
        self._driver = WriterDriver(machine)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._submitted: list = []                  # (payload, Future) and (payloads, Batch), in order
        self._forces = 0                            # force tokens drawn (on the I/O thread)
        self.ledger_id = machine.ledger_id
        self._loop.call(lambda: self._loop.attach(self._driver, []))

    @property
    def metadata(self) -> LedgerMetadata:
        """metadata is the ledger's metadata as this writer last wrote or read it."""
        return self._machine.metadata

    @property
    def last_add_confirmed(self) -> int:
        """last_add_confirmed is the writer's LAC: the highest entry id confirmed (-1 if none).

        Every entry up to it is durable on Qa bookies. On a deferred-sync ledger it moves only
        with forces; `last_add_acked` is the highest entry acknowledged to `append`.
        """
        return self._machine.last_add_confirmed

    @property
    def last_add_acked(self) -> int:
        """last_add_acked is the highest entry id whose append completed (-1 if none)."""
        return self._machine.last_add_acked

    @property
    def deferred_sync(self) -> bool:
        """deferred_sync is True if bookies acknowledge this ledger's appends before they are durable."""
        return self._machine.deferred_sync

    @property
    def rotations_put_off(self) -> tuple[int, str]:
        """rotations_put_off is how many fragment rotations this writer put off, and why the last was.

        A rotation is put off when a position has no writable bookie, cleaning a bookie it
        brings in fails, or no bookies are chosen within the add timeout; the fragment then
        grows past its limit until the rotation is tried again a second later. (0, "") when
        none was.
        """
        return self._machine.rotations_put_off, self._machine.rotation_put_off_because

    def force_async(self) -> Future:
        """force_async makes every entry appended before it durable; the Future resolves to the LAC then.

        It covers appends still queued behind `max_bytes_in_flight` too. On a deferred-sync
        ledger it asks the bookies to sync; on an ordinary one it waits for those appends to
        complete (they are durable once complete). It raises what failed the writer.
        """
        future: Future = Future()

        def start() -> None:
            self._drain()
            token = self._forces = self._forces + 1
            self._driver.force_futures[token] = future
            self._loop.step(self._driver, ev.ForceRequested(token=token))
        self._loop.call(start)
        return future

    def force(self, timeout: float | None = None) -> int:
        """force blocks until every entry appended before it is durable on Qa bookies; it returns the LAC."""
        return result_within(self.force_async(), timeout or self._timeout, f"forcing ledger {self.ledger_id}")

    def append_async(self, data: bytes) -> Future:
        """append_async sends `data` as the next entry; the Future resolves to its entry id.

        Many appends may be in flight; they complete in entry order. A failed append raises,
        from `result()`, LedgerFenced, LedgerClosed, NotEnoughBookies or another WalkitError.
        An entry over the client's `max_entry_bytes` raises RecordTooLarge here, at once, and
        takes no entry id: the writer goes on.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"entries are bytes, not {type(data).__name__}")
        data = bytes(data)
        self._client.check_entry(len(data), f"an entry of ledger {self.ledger_id}")
        future: Future = self._client.metrics.future()
        self._submit(data, future)
        return future

    def _submit(self, payload, item) -> None:
        """_submit queues one append (payload, Future) or append_many (payloads, Batch) for the I/O thread."""
        with self._lock:
            self._submitted.append((payload, item))
            first = len(self._submitted) == 1
        if first:
            self._loop.call(self._drain)

    def append_many_async(self, records) -> Future:
        """append_many_async sends `records` (bytes each) as consecutive entries, with one Future for all.

        The Future resolves to the `range` of their entry ids once the last is acknowledged
        (entries complete in order, so every one of them is), or raises the first failure; on
        a failure the entries below `last_add_confirmed` were written. One Future and one
        completion per call instead of one per record: the way to append many records at once.
        If any record is over the client's `max_entry_bytes`, RecordTooLarge is raised at once
        and none of them is appended.
        """
        payloads = []
        for data in records:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"entries are bytes, not {type(data).__name__}")
            payloads.append(bytes(data))
            self._client.check_entry(len(payloads[-1]), f"entry {len(payloads) - 1} of an append_many to ledger "
                                                        f"{self.ledger_id}")
        future: Future = Future()
        if not payloads:
            future.set_result(range(0))
            return future
        self._client.metrics.timed(future, len(payloads))
        self._submit(payloads, Batch(future, len(payloads)))
        return future

    def append_many(self, records, timeout: float | None = None) -> range:
        """append_many appends `records` as consecutive entries and blocks until all are acknowledged.

        It returns the range of their entry ids (see append_many_async).
        """
        timeout = timeout or self._timeout
        return result_within(self.append_many_async(records), timeout, f"append_many to ledger {self.ledger_id}")

    def _drain(self) -> None:
        with self._lock:
            submitted, self._submitted = self._submitted, []
        payloads = []
        for payload, future in submitted:
            if type(future) is Batch:
                payloads += payload
            else:
                payloads.append(payload)
        self._driver.futures.extend(f for _, f in submitted)
        self._loop.step(self._driver, ev.AppendRequested(payloads=payloads))

    def append(self, data: bytes, timeout: float | None = None) -> int:
        """append sends `data` and blocks until it is acknowledged; it returns the entry id."""
        timeout = timeout or self._timeout
        return result_within(self.append_async(data), timeout, f"append to ledger {self.ledger_id}")

    def close(self, timeout: float | None = None) -> LedgerMetadata:
        """close waits for pending appends, then closes the ledger at its LAC; returns the metadata."""
        timeout = timeout or self._timeout
        future: Future = Future()

        def start() -> None:
            self._drain()
            self._driver.close_futures.append(future)
            self._loop.step(self._driver, ev.CloseRequested())
        self._loop.call(start)
        return result_within(future, timeout, f"closing ledger {self.ledger_id}")

    def __enter__(self) -> "WriteHandle":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if not self._machine.closed and self._machine.error is None:
            self.close()


class ReadHandle:
    """ReadHandle reads a ledger opened with `Client.open_ledger`."""

    def __init__(self, client: Client, metadata: LedgerMetadata, digest: Digest, lac: int, timeout: float) -> None:
        self._client = client
        self._loop = client._loop
        self._digest = digest
        self._timeout = timeout
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.last_add_confirmed = lac

    @property
    def is_closed(self) -> bool:
        """is_closed is True when the ledger was closed when opened (its end is final)."""
        return self.metadata.state == CLOSED

    def read(self, first: int = 0, last: int | None = None, timeout: float | None = None) -> Iterator[Entry]:
        """read yields the entries first..last (default: up to the LAC), streaming in order.

        Reading past the LAC is refused with NoSuchEntry. Each entry has `.entry_id` and
        `.payload`. A replica with corrupt bytes is skipped for another; DigestMismatch is raised
        only if no replica verifies. An unbounded ledger's no-op entries (one per takeover) are
        skipped, so entry ids have gaps there; reading below its first entry (after
        `truncate_ledger`) is refused with NoSuchEntry.
        """
        last = self.last_add_confirmed if last is None else last
        if last > self.last_add_confirmed:
            raise NoSuchEntry(f"entry {last} of ledger {self.ledger_id} is beyond the last add "
                              f"confirmed ({self.last_add_confirmed})")
        if first < self.metadata.first_entry_id:
            raise NoSuchEntry(f"entries of ledger {self.ledger_id} below {self.metadata.first_entry_id} were "
                              f"truncated")
        timeout = timeout or self._timeout
        machine = RangeReader(self.metadata, first, last, self._digest,
                              timeout_ms=self._client._loop.request_timeout_ms,
                              speculative_ms=self._client.speculative_read_ms, now_ms=now_ms())
        return self._stream(machine, timeout)

    def _stream(self, machine: RangeReader, timeout: float) -> Iterator[Entry]:
        driver = ReaderDriver(machine)
        self._loop.call(lambda: self._loop.attach(driver, machine.start()))
        while True:
            try:
                item = driver.queue.get(timeout=timeout)
            except Exception:
                raise Timeout(f"reading ledger {self.ledger_id} stalled for {timeout:g} s") from None
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            if self.metadata.unbounded:
                yield from (entry for entry in item if entry.payload != NOOP_PAYLOAD)
            else:
                yield from item
            consumed = ev.EntriesConsumed(upto=item[-1].entry_id)
            self._loop.call(lambda consumed=consumed: self._loop.step(driver, consumed))

    def read_last_add_confirmed(self, timeout: float | None = None) -> int:
        """read_last_add_confirmed refreshes the metadata and the LAC, and returns the LAC.

        The metadata is re-read because the writer may have changed the ensemble; once the
        ledger is CLOSED its last entry is the final LAC.
        """
        if self.is_closed:
            return self.last_add_confirmed
        self.metadata = self._client.ledger_metadata(self.ledger_id)
        if self.metadata.state == CLOSED:
            lac = self.metadata.last_entry_id
        else:
            lac = self._client._run(LacReader(self.metadata), timeout or self._timeout,
                                    f"reading the LAC of ledger {self.ledger_id}")
        self.last_add_confirmed = max(self.last_add_confirmed, lac)
        return self.last_add_confirmed

    def wait_for_lac(self, above: int, timeout: float | None = None) -> int:
        """wait_for_lac blocks until the LAC passes `above` (long poll), or `timeout` runs out.

        It returns the LAC, which is still `above` or less if nothing new was confirmed in
        time. Bookies hold the request until an add (or the writer's explicit LAC) moves their
        LAC past `above`, so a tailing reader learns of a new entry within a round trip.
        """
        timeout = timeout or self._timeout
        if self.last_add_confirmed > above:
            return self.last_add_confirmed
        self.metadata = self._client.ledger_metadata(self.ledger_id)
        if self.metadata.state == CLOSED:
            self.last_add_confirmed = self.metadata.last_entry_id
            return self.last_add_confirmed
        machine = LacReader(self.metadata, previous_lac=above, timeout_ms=max(1, int(timeout * 1000)))
        lac = self._client._run(machine, timeout + self._client._loop.request_timeout_ms / 1000,
                                f"waiting for the LAC of ledger {self.ledger_id}")
        self.last_add_confirmed = max(self.last_add_confirmed, lac)
        return self.last_add_confirmed
