"""walkit.bookie.identity proves which disk and which cluster a bookie's storage is, before it serves.

This is BookKeeper's cookie, in walkit's terms. Three records take part:

- the cluster id, under ``cluster`` in the metadata store: a random id written once, by the
  first bookie that starts on an empty store (or by `walkit bookies format-and-rejoin`);
- the storage's identity (`DiskIdentity`), kept by the storage itself (EntryStorage's
  `identity()` / `set_identity()`): a random disk id drawn when the storage was first used,
  the cluster id, and the bookie id it was formatted for (`address`: by default the address
  the bookie advertised then; a bookie restarted on another address keeps this id, see
  `bookie_id`);
- the cookie, under ``cookies/<id>`` in the metadata store: the cluster's copy of the
  identity of the disk that serves that bookie id.

`check_identity` runs at start, before the bookie registers, serves, fences or deletes
anything, and refuses to start (IdentityError, with what to do) rather than guess:

| storage holds            | cookie of the address   | outcome                                        |
| ------------------------ | ----------------------- | ---------------------------------------------- |
| its identity             | the same disk           | start                                          |
| its identity             | missing                 | start; the cookie is written again             |
| its identity             | another disk            | refuse: two disks claim the address            |
| identity of another      | any                     | refuse: the storage was formatted for another  |
| cluster or --bookie-id   |                         | cluster or bookie (wrong --metadata or root?)   |
| nothing, and no data     | missing                 | a new bookie: identity and cookie are written  |
| nothing, and no data     | present                 | refuse: the disk was emptied or replaced; its  |
|                          |                         | acknowledged entries are gone (see below)      |
| data but no identity     | missing                 | a bookie from before identities: adopted, if   |
|                          |                         | one of its ledgers in the store names it       |

A storage that keeps nothing across restarts (``memory://``, `durable` False) is a new disk at
every start: it takes a new disk id and replaces the cookie, and clients treat it as new.

Why an emptied disk must not simply start again: it would answer NO_SUCH_ENTRY for entries it
acknowledged, and recovery proves an entry absent by such answers, so a ledger whose writer
died could be closed before an acknowledged entry; it has also forgotten the fences recovery
put on it. Clients therefore record each fragment's disks in the ledger metadata and never
count an answer from another disk (walkit.core.metadata.LedgerMetadata.disks), and the bookie
refuses to start until the operator says the disk is new: `walkit bookies format-and-rejoin
ADDRESS` records the old disk in every fragment that names the address without one (ledgers
written before disks were recorded), removes the cookie, and marks those ledgers for
re-replication (auto-recovery copies the entries back to the new disk, or to another bookie).
Cookies are created, never overwritten, except by a memory bookie's new disk: two bookies
starting on one address at once cannot both pass.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import asdict, dataclass

from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import ConfigError, NodeExists, NoSuchKey

log = logging.getLogger("walkit.bookie")

#: The metadata key of the cluster's id.
CLUSTER_KEY = "cluster"
#: Cookies live under this prefix, one per bookie address.
COOKIE_PREFIX = "cookies"


class IdentityError(ConfigError):
    """IdentityError says why a bookie's storage may not serve in this cluster, and what to do."""


def cookie_key(address: str) -> str:
    """cookie_key is the metadata key of the cookie of the bookie at `address`."""
    return f"{COOKIE_PREFIX}/{address}"


def new_disk_id() -> int:
    """new_disk_id draws a disk id: random, non-zero, 63 bits (0 means unknown on the wire)."""
    return secrets.randbits(63) | 1


@dataclass(frozen=True, slots=True)
class DiskIdentity:
    """DiskIdentity is which disk a storage is, which cluster and bookie address it was formatted for."""

    disk: int
    cluster: str
    address: str
    created_ms: int = 0

    def to_bytes(self) -> bytes:
        """to_bytes encodes the identity (the storage's copy and the cookie are the same bytes)."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "DiskIdentity":
        """from_bytes decodes an identity; anything else is an IdentityError naming `where` it was read."""
        try:
            doc = json.loads(data)
            return cls(disk=int(doc["disk"]), cluster=str(doc["cluster"]), address=str(doc["address"]),
                       created_ms=int(doc.get("created_ms", 0)))
        except (ValueError, TypeError, KeyError) as exc:
            raise IdentityError(f"the disk identity in {where} is unreadable ({exc}); refusing to start") from None


def cluster_id(store) -> str | None:
    """cluster_id is the id of the cluster the metadata store holds, or None on an empty store."""
    try:
        value, _ = store.get(CLUSTER_KEY)
    except NoSuchKey:
        return None
    try:
        return str(json.loads(value)["id"])
    except (ValueError, TypeError, KeyError) as exc:
        raise IdentityError(f"the metadata store's {CLUSTER_KEY!r} key is not a walkit cluster id ({exc}): is this "
                            f"store (its address and root) walkit's?") from None


def ensure_cluster(store) -> str:
    """ensure_cluster returns the store's cluster id, creating one if the store has none."""
    found = cluster_id(store)
    if found is not None:
        return found
    new = secrets.token_hex(16)
    try:
        store.create(CLUSTER_KEY, json.dumps({"id": new, "created_ms": int(time.time() * 1000)}).encode())
        log.info("metadata store has no cluster id: this is a new cluster, %s", new)
        return new
    except NodeExists:
        return cluster_id(store)


def read_cookie(store, address: str) -> DiskIdentity | None:
    """read_cookie returns the cluster's record of the disk serving `address`, or None."""
    try:
        value, _ = store.get(cookie_key(address))
    except NoSuchKey:
        return None
    return DiskIdentity.from_bytes(value, f"the cookie {cookie_key(address)}")


def write_cookie(store, identity: DiskIdentity) -> None:
    """write_cookie records `identity` as the disk serving its address, replacing any other (a new memory disk)."""
    key = cookie_key(identity.address)
    try:
        store.create(key, identity.to_bytes())
    except NodeExists:
        _, version = store.get(key)
        store.put(key, identity.to_bytes(), version)


def create_cookie(store, identity: DiskIdentity) -> None:
    """create_cookie records `identity` as the disk serving its address; NodeExists if one is recorded already."""
    store.create(cookie_key(identity.address), identity.to_bytes())


def delete_cookie(store, address: str) -> DiskIdentity | None:
    """delete_cookie removes the cookie of `address` and returns what it held (None if there was none)."""
    cookie = read_cookie(store, address)
    if cookie is not None:
        try:
            store.delete(cookie_key(address))
        except NoSuchKey:
            pass
    return cookie


def bookie_id(storage, configured: str, endpoint: str) -> str:
    """bookie_id is the id a bookie serves as (BP-41): `configured` if set, else the id its storage
    was formatted with, else (a new storage, or one that keeps nothing) the address it advertises.

    So a bookie keeps its id, and its ledgers, when it restarts on another address with its
    storage. A configured id that differs from the storage's is refused by `check_identity`.
    """
    if configured:
        return configured
    if getattr(storage, "durable", True) and callable(getattr(storage, "identity", None)):
        raw = storage.identity()
        if raw is not None:
            return DiskIdentity.from_bytes(raw, "the storage").address
    return endpoint


def check_identity(storage, store, address: str, storage_uri: str, metadata_uri: str) -> DiskIdentity:
    """check_identity decides whether `storage` may serve `address` in the store's cluster (see the module doc).

    It returns the storage's identity (writing it, and the cookie, where the table says so)
    or raises IdentityError. Nothing is deleted either way.
    """
    where = f"storage {storage_uri}"
    if not callable(getattr(storage, "identity", None)) or not callable(getattr(storage, "set_identity", None)):
        raise ConfigError(f"{where}: the storage plugin {type(storage).__name__} keeps no disk identity "
                          f"(identity() and set_identity(), walkit.spi.EntryStorage): upgrade it")
    try:
        return _check(storage, store, address, where, metadata_uri)
    except NodeExists:                  # another process wrote the cookie meanwhile: decide again
        return _check(storage, store, address, where, metadata_uri)


def _check(storage, store, address: str, where: str, metadata_uri: str) -> DiskIdentity:
    if not getattr(storage, "durable", True):
        identity = DiskIdentity(new_disk_id(), ensure_cluster(store), address, int(time.time() * 1000))
        storage.set_identity(identity.to_bytes())
        write_cookie(store, identity)
        log.info("bookie %s: %s keeps nothing across restarts; it serves as a new disk (%x)",
                 address, where, identity.disk)
        return identity
    raw = storage.identity()
    cookie = read_cookie(store, address)
    cluster = cluster_id(store)
    if raw is not None:
        identity = DiskIdentity.from_bytes(raw, where)
        if cluster is None:
            raise IdentityError(
                f"{where} belongs to cluster {identity.cluster}, but the metadata store {metadata_uri} holds no "
                f"cluster at all: is --metadata (its address or root) the one this bookie ran with? Refusing "
                f"to start, and deleting nothing")
        if cluster != identity.cluster:
            raise IdentityError(
                f"{where} belongs to cluster {identity.cluster}, but the metadata store {metadata_uri} is cluster "
                f"{cluster}: wrong --metadata (address or root)? Refusing to start, and deleting nothing")
        if identity.address != address:
            raise IdentityError(
                f"{where} was formatted for bookie id {identity.address}, not {address}: start it with "
                f"--bookie-id {identity.address} (or without --bookie-id), or give bookie {address} its own storage")
        if cookie is None:
            create_cookie(store, identity)
            log.warning("bookie %s: its cookie was missing from the metadata store; written again from the "
                        "identity of %s (disk %x)", address, where, identity.disk)
        elif cookie.disk != identity.disk:
            raise IdentityError(
                f"bookie {address}: {where} is disk {identity.disk:x}, but the cluster knows {address} as disk "
                f"{cookie.disk:x}: two disks claim this address (a swapped disk, or two bookies configured with "
                f"one address?). Refusing to start")
        return identity
    held = list(storage.ledgers())
    if cookie is not None:
        what = f"holds {len(held)} ledger(s) but no identity" if held else "is empty"
        raise IdentityError(
            f"bookie {address}: {where} {what}, yet the cluster knows {address} as disk {cookie.disk:x}: its "
            f"data is gone (a replaced or wiped disk, a container started without its volume, a wrong path?). "
            f"Refusing to start: entries it acknowledged would look absent to recovery. If the old disk "
            f"can come back, start with it. Otherwise run `walkit bookies format-and-rejoin {address}`, "
            f"then start it: it serves as a new disk and auto-recovery copies its ledgers' entries back "
            f"(to keep it out of them instead, run `walkit recover {address}` first)")
    if held and not _names_address(store, held, address):
        raise IdentityError(
            f"{where} holds {len(held)} ledger(s) written before disk identities, but none of the ledgers the "
            f"metadata store {metadata_uri} holds under those ids names {address}: is --metadata (its address "
            f"or root) the one this bookie ran with? Refusing to start, and deleting nothing")
    identity = DiskIdentity(new_disk_id(), ensure_cluster(store), address, int(time.time() * 1000))
    storage.set_identity(identity.to_bytes())          # durable before the cluster hears of it
    create_cookie(store, identity)
    if held:
        log.warning("bookie %s: %s holds %d ledger(s) from before disk identities; adopted as disk %x",
                    address, where, len(held), identity.disk)
    else:
        log.info("bookie %s: %s is new; formatted as disk %x of cluster %s", address, where, identity.disk,
                 identity.cluster)
    return identity


def _names_address(store, ledger_ids: list[int], address: str, sample: int = 50) -> bool:
    """_names_address tells whether the store holds, under one of (up to `sample` of) `ledger_ids`, a
    ledger whose fragments name `address`: a positive sign the store is the one the data was written for
    (another cluster's store may well hold ledgers with the same small ids)."""
    for ledger_id in ledger_ids[-sample:]:
        try:
            value, _ = store.get(ledger_key(ledger_id))
            if address in LedgerMetadata.from_bytes(value).bookies:
                return True
        except (NoSuchKey, ConfigError, ValueError, TypeError, KeyError):
            continue
    return False
