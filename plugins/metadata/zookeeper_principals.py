"""walkit.plugins.metadata.zookeeper_principals gives every client principal a ZooKeeper identity of its own.

Without it every process of a cluster shares one ZooKeeper user, so walkit's permissions
(walkit.permissions) hold only for processes that go through walkit. In *principal mode* a
client whose key is allowed with a metadata password (`walkit clients allow PRINCIPAL
--metadata-password-file FILE`) connects as ZooKeeper digest user PRINCIPAL
(``zk://PRINCIPAL@host/root?password_file=FILE``), and ZooKeeper itself enforces the model:

- *Resources* carry ACLs per principal. A ledger's znode (``ledgers/<id>``) and the znodes of a
  replicated name N (``replication/N/...``, ``elections/replication/N/...`` and its election
  counter) belong to a log. A ledger's owner and its log's owner get ``crwd`` on it; the log's
  `write` and `admin` grants get ``crd`` (read, and request deletion: truncation); `read` grants
  ``r``. A log's own znode (``logs/<name>``) gives ``crwda`` to its owner (admin, so that it sees
  the ACL in full and refuses a log planted in its name, as it does one without its witness,
  OWNERS_DIR: `Policy.check_own_log`), ``crd`` to
  `admin` grants, ``r`` to `write` and `read` grants. A replicated name's znodes hold no owner; the
  cluster makes them (`make_name`, on a principal's hint), and the log's owner and its `write` and
  `admin` grants read and write them, create and delete only snapshot index entries and the
  election's leader key (`_name_perms`), so none can make one again with an ACL of its own. A ledger of no log is its
  owner's alone. The cluster's user (bookies, the auditor, the operator) holds every right
  everywhere; everyone else nothing.
- *Changes by grantees*: an owner is in its resource's value, and a grantee that could rewrite
  it would keep the resource after its grant is revoked. So a grantee's store asks the reaper
  for a change (``put-requests/<name>/<nonce>``, which ZooKeeper lets only the log's owner
  and its `write` and `admin` grants create, and a hint ``put|<name>|<nonce>``); the reaper
  makes it only if it keeps the owner, the log and the id (walkit.permissions.check_change).
- *Shared* znodes (the roots of the lists, bookie registrations, counters, the allow-list and
  the grants, deletion markers) are readable by anyone who can reach ZooKeeper and writable by
  the cluster's user alone, as Kafka's ``zookeeper.set.acl`` does; each allowed principal may
  create children in the few it must (``WRITE_POINTS``) and advance the ledger id counter.
- *Deleting* a znode needs the delete right on its parent in ZooKeeper, so a principal that may
  delete one ledger znode could delete them all. A principal store therefore never deletes a
  ledger or a log: it creates the child ``delete`` under the resource (which only a principal
  holding create on that resource may do: ZooKeeper checks it), leaves a hint under
  ``deletion-requests``, and waits until the *reaper* (walkit.plugins.metadata.zookeeper_reaper, run by every
  bookie under the cluster's user) wrote the deletion marker and deleted the znode. Deletion
  markers, which have bookies drop a ledger's data, are written by the reaper only.

Grants live in the metadata store (walkit.security); `walkit acl grant/revoke` rewrites the ACLs
of the log's znodes and ledgers at once (`reacl_log`), and `walkit clients revoke` removes the
principal from every ACL (`forget_principal`), so both take effect within the command, without
restarts.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import logging
import re
import secrets
import time

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.security import ACL, Id, Permissions

from walkit.deletions import NAME_BASES
from walkit.faults import failpoint
from walkit.plugins.metadata.principals import LEDGER_NAME, MODE_KEY, resource_of, value_of
from walkit.errors import BadVersion, MetadataError, MetadataNotAuthorized, NoSuchKey

log = logging.getLogger(__name__)

#: Where principal stores leave the hint of a deletion they ask for (one key per resource, its
#: key with '/' as '|'); the resource's own child `DELETE_CHILD` is the request itself.
REQUESTS_PREFIX = "deletion-requests"
DELETE_CHILD = "delete"
#: The versions the reaper writes into a request it refused: the log was not at the version asked for; the
#: principal that asked may not delete it (any more).
REFUSED = -2
DENIED = -3
#: Where principals that may write a log but do not own it (grants) ask the reaper to change the log's or its
#: ledgers' metadata: ``put-requests/<log name>/<principal>/<nonce>``, hinted as
#: ``put|<name>|<principal>|<nonce>``. Only the owners' ZooKeeper ACL entries write a ledger's or log's znode:
#: the owner is in the value, and a grantee that could rewrite it would keep the resource after its grant is
#: revoked. The cluster makes each grantee's directory (`walkit acl grant`), so a request's path says who made
#: it. (Not under the log's znode: a request a grantee pins with children would keep the log from being deleted.)
PUT_PREFIX = "put-requests"
PUT_HINT = "put|"
#: A put request's name (a store makes 16 hex digits).
_NONCE = re.compile(r"[0-9a-f]{16}")
#: How long before its hint a request may have been made: an older one was made by a principal that may
#: have lost the right since, and is dropped (a principal's store makes both at once).
REQUEST_WINDOW_S = 30.0
#: The reaper's answers "the log is not at that version" and "the asker may not" (walkit.plugins.metadata.zookeeper_reaper.Reaper).
_REFUSED = json.dumps({"version": REFUSED}).encode()
_DENIED = json.dumps({"version": DENIED}).encode()

_CRWD = Permissions.CREATE | Permissions.READ | Permissions.WRITE | Permissions.DELETE
_CRD = Permissions.CREATE | Permissions.READ | Permissions.DELETE
_READ = Permissions.READ
_RW = Permissions.READ | Permissions.WRITE
_WORLD_READ = ACL(_READ, Id("world", "anyone"))

#: Where the deletion markers live (walkit.core.metadata.DELETED_PREFIX): the cluster's user alone writes there.
DELETED_DIR = "deleted-ledgers"

#: Shared znodes in which every allowed principal may create children, with what it gets there.
#: (The counters' directory is the store's COUNTERS; LEDGER_ID_COUNTER is advanced by every client.)
WRITE_POINTS = {
    "ledgers": Permissions.CREATE,
    "logs": Permissions.CREATE,
    REQUESTS_PREFIX: Permissions.CREATE,
    ".counters/ledger-id": _RW,
}

#: A hint (under REQUESTS_PREFIX) that asks the reaper to make a replicated name's znodes: ``name|<N>|<nonce>``.
NAME_HINT = "name|"
#: The cluster makes ``log-owners/<principal>`` for each principal, which only that principal creates in. A log it
#: creates comes with its *witness* ``log-owners/<principal>/<name>`` in the same ZooKeeper transaction, so with
#: the same czxid; no other principal can make one, so it proves the log is its own (`Policy.check_own_log`).
OWNERS_DIR = "log-owners"


def witness_key(principal: str, name: str) -> str:
    """witness_key is where the witness of `principal`'s log `name` lives (OWNERS_DIR)."""
    return f"{OWNERS_DIR}/{principal}/{name}"


def digest_id(user: str, password: str) -> str:
    """digest_id is ZooKeeper's digest identity ``user:base64(sha1(user:password))``."""
    hashed = base64.b64encode(hashlib.sha1(f"{user}:{password}".encode()).digest()).decode()
    return f"{user}:{hashed}"


class Policy:
    """Policy computes the ACLs of the znodes a store creates in principal mode, and runs its deletions.

    `store` is a ZooKeeperMetadataStore; `own` is its user's digest identity, None for the
    cluster's user (which needs no entry of its own: it holds every right through `cluster`).
    """

    #: How long a store of the cluster's user trusts that principal mode is off (once on, it stays on).
    REFRESH_S = 1.0

    def __init__(self, store, own: str | None) -> None:
        self.store = store
        self.own = own
        self._cluster: list[ACL] | None = None
        self._mode: tuple[float, bool] = (0.0, False)
        self._trusted: dict[str, int] = {}          # log key -> czxid of its znode, checked (check_own_log)

    # -- what principal mode looks like -------------------------------------------------------
    def enabled(self) -> bool:
        """enabled tells whether the operator turned principal mode on (re-read at most every REFRESH_S)."""
        if self.own is not None:
            return True
        at, on = self._mode
        if not on and time.monotonic() - at >= self.REFRESH_S:
            on = self._exists(MODE_KEY)
            self._mode = (time.monotonic(), on)
        return on

    def cluster(self) -> list[ACL]:
        """cluster is the cluster's user, which holds every right on every znode: the store's own user, or for a
        principal's store the identity MODE_KEY records (ZooKeeper shows other users' digests only as 'x')."""
        if self._cluster is None:
            if self.own is None:
                self._cluster = list(self.store._acl or [])
            else:
                try:
                    ids = json.loads(self.store.get(MODE_KEY)[0] or b"{}").get("cluster", [])
                except (NoSuchKey, ValueError):
                    raise MetadataError(f"ZooKeeper's principal mode is not on under {self.store.root}: an operator "
                                        f"turns it on with `walkit clients allow PRINCIPAL --metadata-password-file "
                                        f"FILE`") from None
                self._cluster = [ACL(Permissions.ALL, Id("digest", i)) for i in ids]
        return self._cluster

    def shared_acl(self) -> list[ACL]:
        """shared_acl: the cluster everything, everyone else read."""
        return self.cluster() + [_WORLD_READ]

    def with_world_read(self, acl: list[ACL]) -> list[ACL]:
        """with_world_read adds read for everyone to `acl` in principal mode (the security znodes' ACL)."""
        return acl + [_WORLD_READ] if self.enabled() and _WORLD_READ not in acl else acl

    # -- ACLs ------------------------------------------------------------------------------------
    def acl_for(self, relpath: str, value: bytes) -> list[ACL] | None:
        """acl_for is the ACL a new znode gets (None: the store's default, outside principal mode)."""
        if not self.enabled():
            return None
        own = [ACL(_CRWD, Id("digest", self.own))] if self.own else []
        parts = relpath.split("/")
        if len(parts) == 4 and parts[0] == PUT_PREFIX:
            return self.cluster() + own           # a put request: its maker's and the reaper's, nobody else's
        resource = resource_of(relpath)
        if resource is None:
            return self.shared_acl() + own
        kind, log_name = resource
        owner = ""
        if kind == "ledger":
            log_name, owner = _ledger_log(self.store, value)
        elif kind == "log":
            owner = _log_owner(value)
        return self.resource_acl(kind, log_name, owner, creator=self.own.partition(":")[0] if self.own else "",
                                 rel=relpath)

    def resource_acl(self, kind: str, log_name: str | None, owner: str, creator: str = "",
                     log_owner: str | None = None, rel: str = "") -> list[ACL]:
        """resource_acl: the cluster everything; the owners and grants what the module doc says.

        `owner` is the resource's own owner (a ledger's); the log's owner counts too. A resource
        of a log not created yet (a replicated name's election) is its `creator`'s. The log's owner is read
        unless given (`log_owner`). A replicated name's znode `rel` gets what `_name_perms` says.
        """
        store = self.store
        entries: dict[str, int] = {}
        owners = [owner]
        if log_name is not None:
            owners.append(_log_owner(value_of(store, f"logs/{log_name}")) if log_owner is None else log_owner)
            for principal in store.children(f"security/acl/logs/{log_name}"):
                level = value_of(store, f"security/acl/logs/{log_name}/{principal}").decode()
                entries[principal] = _name_perms(rel, level) if kind == "name" else _perms(kind, level)
        owners = [o for o in owners if o] or ([creator] if creator else [])
        if not owners:
            return self.shared_acl()          # unowned (created without security): everyone reads it
        for principal in owners:           # a log's owner may read its ACL in full (check_own_log)
            entries[principal] = (Permissions.ALL if kind == "log" else _name_perms(rel, "write") if kind == "name"
                                  else _CRWD)
        acl = list(self.cluster())
        for principal, perms in sorted(entries.items()):
            found = self._id_of(principal)
            if found is not None and perms:
                acl.append(ACL(perms, Id("digest", found)))
        return acl

    def check_own_log(self, key: str, value: bytes, created: int) -> None:
        """check_own_log (a principal's store, reading log `key`) raises MetadataNotAuthorized when the log's value
        names this principal as its owner but its znode's ACL gives anyone more than the cluster's rules do
        (`resource_acl`). Any allowed principal may create under ``logs/``, with the value and the ACL it likes:
        such a log was planted, and its maker could rewrite it after the named owner wrote to it.

        ZooKeeper shows the digests in an ACL only to a reader with the admin right on the znode (to others,
        ``user:x``, which a digest of any password for that user name would look like), so a log's owner holds
        admin on it, and an ACL it sees masked is not its log's. Checked once per znode (`created`, its czxid)."""
        principal = self.own.partition(":")[0] if self.own else ""
        if not principal or self._trusted.get(key) == created or _log_owner(value) != principal:
            return
        store = self.store
        failpoint("zookeeper.own_log.read")
        try:
            acls, _ = store._call("read a log's ACL", lambda: store._client.get_acls_async(store._path(key)),
                                  idempotent=True)
        except NoNodeError:                      # deleted since it was read
            raise NoSuchKey(f"no metadata key {key!r}") from None
        expected: dict[str, int] = {}
        for entry in self.resource_acl("log", key.partition("/")[2], principal, log_owner=principal):
            expected[entry.id.id] = expected.get(entry.id.id, 0) | entry.perms
        cluster = {entry.id.id for entry in self.cluster()}
        for entry in acls:
            ident = entry.id.id if entry.id.scheme == "digest" else f"{entry.id.scheme}:{entry.id.id}"
            if ident == self.own or ident in cluster or entry.perms & ~expected.get(ident, 0) == 0:
                continue
            raise _planted(key, principal, f"its ZooKeeper ACL gives {ident} rights ({entry.perms}) that neither "
                           f"{principal} nor a grant gave" + (
                               " (or it was made before owners held admin on their logs: `walkit clients allow` "
                               "gives it its ACL again)" if ident.endswith(":x") else ""))
        failpoint("zookeeper.own_log.acl")
        witness = store._path(witness_key(principal, key.partition("/")[2]))
        try:
            data, stat = store._call("read a log's witness", lambda: store._client.get_async(witness),
                                     idempotent=True)
        except NoNodeError:
            if not self._still(key, created):    # deleted (and perhaps made again) since it was read
                raise NoSuchKey(f"no metadata key {key!r}") from None
            raise _planted(key, principal, f"no witness {witness_key(principal, key.partition('/')[2])} was made "
                           f"with it") from None
        if stat.czxid != created and data != str(created).encode():
            if not self._still(key, created):
                raise NoSuchKey(f"no metadata key {key!r}")
            raise _planted(key, principal, "its witness was made with another log of that name")
        self._trusted[key] = created

    def _still(self, key: str, created: int) -> bool:
        """_still tells whether znode `key` is the one made at zxid `created` (not deleted since it was read)."""
        store = self.store
        stat = store._call(f"check {key!r}", lambda: store._client.exists_async(store._path(key)), idempotent=True)
        return stat is not None and stat.czxid == created

    def _id_of(self, principal: str) -> str | None:
        """_id_of is a principal's digest identity, from its allow-list entry (None: it has none)."""
        if self.own is not None and self.own.partition(":")[0] == principal:
            return self.own
        try:
            return json.loads(value_of(self.store, f"security/clients/{principal}") or b"{}").get("zookeeper")
        except ValueError:
            return None

    # -- deletions -------------------------------------------------------------------------------
    def marked_deleted(self, key: str) -> bool:
        """marked_deleted tells, in principal mode, whether `key` is a ledger whose deletion marker exists.

        Principals may advance the ledger id counter, so one could wind it back; a ledger created
        again under a deleted id would have its data dropped by the bookies, which obey the marker.
        """
        resource = resource_of(key)
        if resource is None or resource[0] != "ledger" or not self.enabled():
            return False
        return self._exists(f"{DELETED_DIR}/{key.rpartition('/')[2]}")

    def check_log_write(self, key: str, value: bytes) -> None:
        """check_log_write (a principal's store, writing log `key` as `value`) raises MetadataNotAuthorized for a log
        without an owner: in principal mode a principal's client writes only logs with an owner. One made without a
        key is the cluster's to write (its ACL lets principals read it); one a principal made so, with an ACL of its
        choosing, could be its maker's to rewrite."""
        if self.own is not None and key.startswith("logs/") and key.count("/") == 1 and not _log_owner(value):
            raise MetadataNotAuthorized(f"{key} has no owner: in ZooKeeper's principal mode a principal writes no "
                                        f"log without an owner (a log made without a key is open to read only; one "
                                        f"planted so may be its maker's to rewrite)")

    def witness_for(self, key: str, value: bytes) -> tuple[str, list[ACL]] | None:
        """witness_for is the witness (key, ACL) to create with log `key` of value `value` in one transaction (see
        OWNERS_DIR): in principal mode, for a log whose owner is this store's principal (or, for the cluster's
        user, any principal's); None otherwise."""
        if not key.startswith("logs/") or key.count("/") != 1 or not self.enabled():
            return None
        owner = _log_owner(value)
        if not owner or (self.own is not None and owner != self.own.partition(":")[0]):
            return None
        found = self._id_of(owner)
        return witness_key(owner, key.partition("/")[2]), self.cluster() + (
            [ACL(_READ, Id("digest", found))] if found else [])

    def ensure_name(self, key: str) -> None:
        """ensure_name (a principal's store, before it creates a replicated name's znode `key`, draws from the name's
        election counter or registers its leader) has the reaper make the name's own znodes if they are missing:
        no principal may (`make_name`). It raises MetadataError when the name's log does not exist (walkit.replicate
        makes it first) or no bookie made them within the store's timeout."""
        resource = resource_of(key)
        if self.own is None or resource is None or resource[0] != "name":
            return
        name = resource[1][len("replicated-"):]
        last = f".counters/elections/replication/{name}"      # the last one make_name makes (and, with its log,
        if znode_exists(self.store, last):                    # the name's deletion deletes: deletions.forget_name)
            return
        if not znode_exists(self.store, f"logs/replicated-{name}"):
            raise MetadataError(f"replicated name {name!r} has no log (logs/replicated-{name}) yet: in ZooKeeper's "
                                f"principal mode the name's log is made before its other znodes")
        store = self.store
        hint = store._path(f"{REQUESTS_PREFIX}/{NAME_HINT}{name}|{secrets.token_hex(8)}")
        store._call(f"ask for replicated name {name!r}", lambda: store._client.create_async(
            hint, b"", acl=self.shared_acl() + [ACL(_CRWD, Id("digest", self.own))]), idempotent=False)
        deadline = time.monotonic() + store.timeout
        while time.monotonic() < deadline:
            if znode_exists(store, last):
                return
            time.sleep(0.02)
        raise MetadataError(f"replicated name {name!r}'s znodes were not made within {store.timeout:g} s: in "
                            f"ZooKeeper's principal mode a bookie makes them (every bookie runs the reaper)")

    def asks_for_deletion(self, key: str) -> bool:
        """asks_for_deletion tells whether deleting `key` goes through the reaper (a principal store's ledgers and logs)."""
        if self.own is None:
            return False
        resource = resource_of(key)
        return resource is not None and resource[0] in ("ledger", "log")

    def delete(self, key: str, expected_version: int | None) -> None:
        """delete asks the reaper to delete `key` (at `expected_version`) and waits until it did."""
        store = self.store
        try:
            store.get(key)
        except NoSuchKey:
            raise NoSuchKey(f"no metadata key {key!r}") from None
        request = json.dumps({"version": -1 if expected_version is None else expected_version}).encode()
        child = store._path(f"{key}/{DELETE_CHILD}")
        acl = self.cluster() + [ACL(_CRWD, Id("digest", self.own))]
        for attempt in range(2):
            try:
                store._call(f"ask to delete {key!r}", lambda: store._client.create_async(child, request, acl=acl),
                            idempotent=False)
                break
            except NodeExistsError:
                if attempt:
                    raise MetadataError(f"cannot ask to delete {key!r}: another request keeps being made") from None
                # An earlier request (refused, or left by a client that gave up): made anew, as the reaper
                # honours only a request made just before its hint.
                try:
                    store._call(f"ask to delete {key!r}", lambda: store._client.delete_async(child), idempotent=True)
                except NoNodeError:
                    pass                          # the reaper took it meanwhile: ask again
            except NoNodeError:
                raise NoSuchKey(f"no metadata key {key!r}") from None
        # A hint of its own (a random suffix): one another principal made first cannot hide this request.
        hint = store._path(f"{REQUESTS_PREFIX}/{key.replace('/', '|')}#{secrets.token_hex(8)}")
        store._call(f"ask to delete {key!r}", lambda: store._client.create_async(hint, b"", acl=self.shared_acl()
                                                                                 + [ACL(_CRWD, Id("digest", self.own))]),
                    idempotent=False)
        deadline = time.monotonic() + store.timeout
        while time.monotonic() < deadline:
            try:
                store.get(key)
            except NoSuchKey:
                return
            answer = value_of(store, f"{key}/{DELETE_CHILD}")
            if answer in (_REFUSED, _DENIED):
                store.delete(f"{key}/{DELETE_CHILD}")
                if answer == _DENIED:
                    raise MetadataNotAuthorized(f"{key!r} was not deleted: the reaper found that this principal may "
                                                f"not delete it")
                raise BadVersion(f"metadata key {key!r} is not at version {expected_version}")
            time.sleep(0.02)
        raise MetadataError(f"{key!r} was not deleted within {store.timeout:g} s: its deletion waits for a bookie "
                            f"(every bookie runs the reaper that carries out deletions in principal mode); "
                            f"it will be deleted when one runs")

    def put(self, key: str, value: bytes, expected_version: int) -> int:
        """put asks the reaper to change `key` (a ledger or log this principal may write but does not own) at
        `expected_version`, through the log's put requests; it returns the new version."""
        store = self.store
        if key.startswith("logs/"):
            log_name = key.partition("/")[2]
        else:
            log_name = _ledger_log(store, store.get(key)[0])[0]
            if log_name is None:
                raise MetadataNotAuthorized(f"put {key!r}: a ledger of no log is its owner's alone")
        nonce, principal = secrets.token_hex(8), self.own.partition(":")[0]
        request = f"{PUT_PREFIX}/{log_name}/{principal}/{nonce}"
        body = json.dumps({"key": key, "value": base64.b64encode(bytes(value)).decode(),
                           "version": expected_version}).encode()
        acl = self.cluster() + [ACL(_CRWD, Id("digest", self.own))]
        try:
            store._call(f"ask to change {key!r}", lambda: store._client.create_async(store._path(request), body,
                                                                                    acl=acl), idempotent=False)
        except NoNodeError:
            raise MetadataNotAuthorized(f"put {key!r}: log {log_name!r} takes no changes from this principal: "
                                        f"`walkit acl grant` makes its {PUT_PREFIX} znode for each grant") from None
        try:
            store._call(f"ask to change {key!r}", lambda: store._client.create_async(
                store._path(f"{REQUESTS_PREFIX}/{PUT_HINT}{log_name}|{principal}|{nonce}"), b"",
                acl=self.shared_acl() + [ACL(_CRWD, Id("digest", self.own))]), idempotent=False)
            deadline = time.monotonic() + store.timeout
            while time.monotonic() < deadline:
                try:
                    answer = json.loads(store.get(request)[0]).get("answer")
                except NoSuchKey:
                    raise MetadataNotAuthorized(f"put {key!r}: the request was dropped (the log's grants changed); "
                                                f"not changed") from None
                if answer is not None:
                    if "version" in answer:
                        return int(answer["version"])
                    kind = {"version": BadVersion, "missing": NoSuchKey}.get(answer.get("error"), MetadataNotAuthorized)
                    raise kind(f"put {key!r}: {answer.get('message') or answer.get('error')}")
                time.sleep(0.005)
        finally:
            try:
                store.delete(request)
            except MetadataError:
                pass                      # the reaper's answer stays; the log's next operator pass drops it
        raise MetadataError(f"put {key!r}: not changed within {store.timeout:g} s: a change by a principal that "
                            f"does not own it waits for a bookie's reaper; whether it was made is unknown")

    def _exists(self, key: str) -> bool:
        try:
            self.store.get(key)
            return True
        except NoSuchKey:
            return False


def _planted(key: str, principal: str, why: str) -> MetadataNotAuthorized:
    return MetadataNotAuthorized(
        f"{key} names principal {principal} as its owner, but it was not made by it: {why} (any allowed principal may "
        f"create under logs/). It is not used: the operator deletes it with the cluster's credentials "
        f"(docs/operations/security.md#planted-logs)")


def _name_perms(rel: str, level: str) -> int:
    """_name_perms is what `level` on a replicated name's log (its owner: `write`) gives on the name's znode `rel`.

    The cluster makes the name's own znodes (`make_name`): ``replication/N`` (read), its snapshot pointer
    ``replication/N/snapshot`` (read and write), its snapshot index ``replication/N/snapshots`` (create and delete
    entries), its election ``elections/replication/N`` (create and delete the leader's ephemeral key) and its
    election counter (read and write). What a writer creates under them (an index entry, the leader's key) is read
    and written, never created in or deleted: no principal can pin a znode of the name's with children of its own,
    or delete one to make it again with an ACL of its own."""
    if level == "read":
        return _READ
    if level not in ("write", "admin"):
        return 0
    parts = rel.split("/")
    depth = next((len(base.split("/")) for base in NAME_BASES if rel.startswith(base + "/")), 0)
    below = parts[depth + 1:] if depth else []
    if parts[0] == "replication":
        if below == []:
            return _READ
        if below == ["snapshots"]:
            return _CRD
        return _RW
    if parts[0] == "elections" and below == []:
        return _CRD
    return _RW


def _perms(kind: str, level: str) -> int:
    """_perms is what a grant of `level` gives on a znode of `kind`: `read` reads; `write` and `admin` create and
    delete children of a ledger (deletion requests, for truncation) and of the log's put requests, and write a
    replicated name's znodes (which hold no owner); a log's deletion request is `admin`'s. Changes of a
    ledger's or log's metadata go through put requests (PUT_PREFIX)."""
    if level == "read":
        return _READ
    if level not in ("write", "admin"):
        return 0
    if kind == "name":
        return _CRWD
    if kind == "log":
        return _CRD if level == "admin" else _READ
    return _CRD


def _ledger_log(store, value: bytes) -> tuple[str | None, str]:
    """_ledger_log is (the log whose grants govern a ledger, or None; its owner) from its metadata `value`."""
    from walkit.core.metadata import LedgerMetadata
    from walkit.permissions import bound_log
    try:
        metadata = LedgerMetadata.from_bytes(value)
    except Exception:  # noqa: BLE001 - not ledger metadata: treat as a ledger of no owner
        return None, ""
    return bound_log(store, metadata), metadata.owner


def _log_owner(value: bytes) -> str:
    from walkit.core.loglist import LogMetadata
    if not value:
        return ""
    try:
        return LogMetadata.from_bytes(value).owner
    except Exception:  # noqa: BLE001 - not log metadata
        return ""


# -- the operator's side ----------------------------------------------------------------------------
def enable(store) -> None:
    """enable turns principal mode on (a cluster-user store): the flag, the write points, and every existing
    znode's ACL (shared ones readable by all, resources per principal). Idempotent; one pass over the tree."""
    policy = store._policy
    try:
        witnessed = json.loads(value_of(store, MODE_KEY) or b"{}").get("witnessed", False)
    except ValueError:
        witnessed = False
    cluster = [acl.id.id for acl in policy.cluster()]
    mode = json.dumps({"cluster": cluster, "witnessed": witnessed}).encode()
    _ensure(store, MODE_KEY, store._acl_for(MODE_KEY), mode)    # an operator user's, if the security keys are
    if value_of(store, MODE_KEY) != mode:
        store.put(MODE_KEY, mode, store.get(MODE_KEY)[1])
    policy._mode = (time.monotonic(), True)
    # Every other store of the cluster's user sees the flag within REFRESH_S: what they create after that
    # has the right ACL, and what they created before, the pass below fixes.
    time.sleep(Policy.REFRESH_S + 0.2)
    for point in (*WRITE_POINTS, DELETED_DIR, PUT_PREFIX):   # made now, so that no principal's create makes them its own
        _ensure(store, point, policy.shared_acl(), b"0" if point == ".counters/ledger-id" else b"")
    for base in NAME_BASES:                                  # the cluster's alone: make_name makes each name's
        _ensure(store, base, policy.shared_acl(), b"")
    _ensure(store, OWNERS_DIR, policy.shared_acl(), b"")
    for principal, identity in _allowed_ids(store, None).items():
        _ensure(store, f"{OWNERS_DIR}/{principal}", policy.cluster() + [ACL(_CRD, Id("digest", identity))], b"")
    if not witnessed:
        # Once, the first time: the logs made before principal mode are their owners', as they are. From then
        # on, every log is made with its witness, and a log without one was planted.
        _witness_logs(store)
        store.put(MODE_KEY, json.dumps({"cluster": cluster, "witnessed": True}).encode(), store.get(MODE_KEY)[1])
    reacl_tree(store)


def _witness_logs(store) -> None:
    """_witness_logs gives each log with an owner a witness that names the log's czxid (see OWNERS_DIR)."""
    for name in store.children("logs"):
        try:
            data, stat = store._call("read a log", lambda: store._client.get_async(f"{store.root}/logs/{name}"),
                                     idempotent=True)
        except (NoNodeError, MetadataNotAuthorized):
            continue
        owner = _log_owner(data)
        if owner:
            ensure_owner_dir(store, owner)
            _ensure(store, witness_key(owner, name), store._policy.cluster(), str(stat.czxid).encode())


def ensure_owner_dir(store, owner: str) -> None:
    """ensure_owner_dir (the cluster's user) makes `owner`'s OWNERS_DIR directory if it is missing: the cluster's
    alone until the owner gets a ZooKeeper identity (reacl_tree then gives it its rights there)."""
    _ensure(store, f"{OWNERS_DIR}/{owner}", store._policy.cluster(), b"")


def reacl_tree(store, only_log: str | None = None, forget: str | None = None) -> int:
    """reacl_tree gives every znode (or only those of log `only_log`: its znode, its ledgers, a replicated
    name's znodes and snapshot ledgers) the ACL principal mode wants, leaving out principal `forget` (revoked).
    It returns how many ACLs it changed; one or two round trips per znode."""
    client = store._client
    allowed = _allowed_ids(store, forget)
    changed = 0
    unfixed: list[str] = []
    # The write points first: a revoked principal loses them even if the pass fails further on.
    paths = _log_paths(store, only_log) if only_log is not None else _all_paths(store)
    for rel in itertools.chain(WRITE_POINTS if only_log is None else (), paths):
        path = f"{store.root}/{rel}"
        try:
            parts = rel.split("/")
            if len(parts) == 4 and parts[0] == PUT_PREFIX:
                # A pending put request, made by whoever held the right until now: dropped, as deletion requests.
                store._call("drop a put request", lambda: client.delete_async(path), idempotent=True)
                continue
            if len(parts) == 3 and parts[0] == PUT_PREFIX and parts[2] not in _put_holders(store, parts[1], allowed):
                _delete_tree(store, rel)          # a principal that may no longer ask for changes of the log
                continue
            if len(parts) == 2 and parts[0] == "logs":
                _ensure(store, f"{PUT_PREFIX}/{parts[1]}", store._policy.shared_acl(), b"")
                for principal, identity in _put_holders(store, parts[1], allowed).items():
                    _ensure(store, f"{PUT_PREFIX}/{parts[1]}/{principal}",
                            store._policy.cluster() + [ACL(_CRD, Id("digest", identity))], b"")
            if rel.rpartition("/")[2] == DELETE_CHILD and resource_of(rel.rpartition("/")[0]) is not None:
                # A pending deletion request, made by whoever held the right until now: it no longer counts
                # (its client, if it still waits, is told the delete did not happen and may ask again).
                store._call("drop a deletion request", lambda: client.delete_async(path), idempotent=True)
                continue
            if only_log is not None and resource_of(rel) is not None:
                try:                          # its pending deletion request, as above (the walk skips children)
                    store._call("drop a deletion request", lambda: client.delete_async(f"{path}/{DELETE_CHILD}"),
                                idempotent=True)
                except (NoNodeError, NotEmptyError):
                    pass
            wanted = _wanted(store, rel, allowed)
            if wanted is None:
                continue
            done = _make_right(store, rel, wanted)
            if done is None:
                unfixed.append(rel)
            changed += bool(done)
        except (NoNodeError, BadVersionError, NotEmptyError):
            continue                      # gone or changed meanwhile: created again with the right ACL
        except MetadataNotAuthorized:
            unfixed.append(rel)           # shut to the cluster (its value unreadable)
        except ValueError:
            unfixed.append(rel)           # not what its place says it is (a snapshot index entry that is no id)
    if unfixed:
        log.warning("%d znodes keep their ACL: the cluster's user may not change them (a principal made them so; "
                    "ZooKeeper's super user can remove them): %s", len(unfixed), ", ".join(sorted(unfixed)[:20]))
    if only_log is None:
        root_acl, stat = store._call("read the root's ACL", lambda: client.get_acls_async(store.root),
                                     idempotent=True)
        if _WORLD_READ not in root_acl:
            store._call("set the root's ACL", lambda: client.set_acls_async(
                store.root, list(root_acl) + [_WORLD_READ], version=stat.aversion), idempotent=True)
    return changed


def _make_right(store, rel: str, wanted: list[ACL]) -> bool | None:
    """_make_right gives znode `rel` the ACL `wanted`: True if it changed it, False if it was right, None if the
    cluster may not change it. A principal may have made it with an ACL that leaves the cluster no admin right (one
    made before principal mode took write points away, or a ledger's or log's, whose maker chose its ACL): it is
    then made again with the same data and the right ACL, in one transaction, if the cluster may read and delete it
    and it has no children. NoNodeError and BadVersionError (gone or changed meanwhile) go to the caller."""
    path = f"{store.root}/{rel}"
    try:
        acls, stat = store._call("read an ACL", lambda: store._client.get_acls_async(path), idempotent=True)
        if sorted(map(_key, acls)) == sorted(map(_key, wanted)):
            return False
        store._call("set an ACL", lambda: store._client.set_acls_async(path, wanted, version=stat.aversion),
                    idempotent=True)
        return True
    except MetadataNotAuthorized:
        return True if resource_of(rel) is not None and _replace(store, rel, wanted) else None


def make_name(store, name: str) -> list[str]:
    """make_name (a store of the cluster's user: the reaper's) makes replicated name `name`'s own znodes (see
    `_name_perms`), each with the ACL principal mode gives it from the holders of its log ``replicated-<name>``,
    and puts right the ACL of those that exist. It returns the znodes the cluster may not change (made by a
    principal before principal mode stopped principals from creating there; ZooKeeper's super user removes them).
    Without the log it makes nothing: no one would hold the name."""
    if not znode_exists(store, f"logs/replicated-{name}"):
        return []
    allowed = _allowed_ids(store, None)
    unfixed = []
    for rel, value in ((f"replication/{name}", b""), (f"replication/{name}/snapshot", b""),
                       (f"replication/{name}/snapshots", b""), (f"elections/replication/{name}", b""),
                       (f".counters/elections/replication/{name}", b"0")):
        wanted = _wanted(store, rel, allowed)
        _ensure(store, rel, wanted, value)
        try:
            if _make_right(store, rel, wanted) is None:
                unfixed.append(rel)
        except (NoNodeError, BadVersionError):
            unfixed.append(rel)
    if unfixed:
        log.warning("replicated name %r: the cluster may not change %s (a principal made them so; ZooKeeper's super "
                    "user can remove them)", name, ", ".join(unfixed))
    return unfixed


def _key(acl: ACL) -> tuple:
    return (acl.perms, acl.id.scheme, acl.id.id)


def _all_paths(store):
    """_all_paths yields every znode below the root (paths relative to it), parents first."""
    pending = [""]
    while pending:
        rel = pending.pop()
        path = store.root + ("/" + rel if rel else "")
        try:
            children = store._call("list", lambda: store._client.get_children_async(path), idempotent=True)
        except (NoNodeError, MetadataNotAuthorized):
            continue                      # gone, or shut to the cluster by a principal (reacl_tree reports it)
        for child in children:
            pending.append(f"{rel}/{child}" if rel else child)
            yield f"{rel}/{child}" if rel else child


def _log_paths(store, log_name: str):
    """_log_paths yields the znodes of one log: its own, its ledgers', and a replicated name's."""
    from walkit.core.loglist import LogMetadata
    from walkit.core.metadata import ledger_key
    yield f"logs/{log_name}"
    yield f"{PUT_PREFIX}/{log_name}"
    for principal in store.children(f"{PUT_PREFIX}/{log_name}"):
        yield f"{PUT_PREFIX}/{log_name}/{principal}"
        try:
            nonces = store.children(f"{PUT_PREFIX}/{log_name}/{principal}")
        except MetadataNotAuthorized:
            nonces = []                   # gone, or unreadable: the reaper checks the requester when it acts
        for nonce in nonces:
            yield f"{PUT_PREFIX}/{log_name}/{principal}/{nonce}"
    value = value_of(store, f"logs/{log_name}")
    if value:
        for ledger_id in LogMetadata.from_bytes(value).ledger_ids:
            yield ledger_key(ledger_id)
    if log_name.startswith("replicated-"):
        name = log_name[len("replicated-"):]
        for base in ("replication", "elections/replication", ".counters/elections/replication"):
            top = f"{base}/{name}"
            if znode_exists(store, top):
                yield top
                for rel in _subtree(store, top):
                    yield rel
        for child in store.children(f"replication/{name}/snapshots"):
            if LEDGER_NAME.fullmatch(child):
                yield ledger_key(int(child))


def _subtree(store, top: str):
    pending = [top]
    while pending:
        rel = pending.pop()
        try:
            children = store._call("list", lambda: store._client.get_children_async(f"{store.root}/{rel}"),
                                   idempotent=True)
        except (NoNodeError, MetadataNotAuthorized):
            continue
        for child in children:
            pending.append(f"{rel}/{child}")
            yield f"{rel}/{child}"


def znode_exists(store, rel: str) -> bool:
    """znode_exists tells whether znode `rel` exists (ZooKeeper checks no right for that)."""
    return store._call("look", lambda: store._client.exists_async(f"{store.root}/{rel}"), idempotent=True) is not None


def _wanted(store, rel: str, allowed: dict[str, str]) -> list[ACL] | None:
    """_wanted is the ACL znode `rel` should have (None: leave it as it is)."""
    policy = store._policy
    if rel == "zookeeper" or rel.startswith("zookeeper/"):
        return None                       # ZooKeeper's own
    if rel == "security" or rel.startswith("security/"):
        acls, _ = store._call("read an ACL", lambda: store._client.get_acls_async(f"{store.root}/{rel}"),
                              idempotent=True)
        return policy.with_world_read(list(acls))     # its writers (an operator user) stay as they are
    parts = rel.split("/")
    if len(parts) == 2 and parts[0] == PUT_PREFIX:
        return policy.shared_acl()        # the cluster makes each grantee's directory in it
    if len(parts) == 3 and parts[0] == PUT_PREFIX:
        identity = _put_holders(store, parts[1], allowed).get(parts[2])
        return policy.cluster() + [ACL(_CRD, Id("digest", identity))] if identity else None
    if parts[0] == OWNERS_DIR and len(parts) in (2, 3):
        identity = allowed.get(parts[1])       # its own directory: it creates and deletes its witnesses there
        return policy.cluster() + ([ACL(_CRD if len(parts) == 2 else _READ, Id("digest", identity))]
                                   if identity else [])
    point = WRITE_POINTS.get(rel)
    if point is not None:
        return policy.shared_acl() + [ACL(point, Id("digest", i)) for _, i in sorted(allowed.items())]
    resource = resource_of(rel)
    if resource is None:
        parent, _, name = rel.rpartition("/")
        if name == DELETE_CHILD and resource_of(parent) is not None:
            return None                   # a deletion request: its creator's, until the reaper takes it
        return policy.shared_acl()
    kind, log_name = resource
    owner = ""
    if kind == "ledger":
        log_name, owner = _ledger_log(store, value_of(store, rel))
    elif kind == "log":
        owner = _log_owner(value_of(store, rel))
    cluster = policy.cluster()
    return [a for a in policy.resource_acl(kind, log_name, owner, rel=rel)
            if a.id.scheme != "digest" or a in cluster or a.id.id in allowed.values()]


def _allowed_ids(store, forget: str | None) -> dict[str, str]:
    """_allowed_ids maps every allowed principal with a ZooKeeper identity (but `forget`) to it."""
    out = {}
    for principal in store.children("security/clients"):
        if principal == forget:
            continue
        try:
            found = json.loads(value_of(store, f"security/clients/{principal}") or b"{}").get("zookeeper")
        except ValueError:
            found = None
        if found:
            out[principal] = found
    return out


def _ensure(store, rel: str, acl: list[ACL], value: bytes) -> None:
    path = f"{store.root}/{rel}"
    try:
        store._call(f"create {rel!r}", lambda: store._client.create_async(path, value, acl=acl, makepath=True),
                    idempotent=True)
    except NodeExistsError:
        pass


def commit_put(store, target: str, value: bytes, version: int, request: str, request_version: int) -> dict | None:
    """commit_put (the reaper's) changes `target` at `version` and answers put request `request` in one ZooKeeper
    transaction, so that two bookies' reapers never both carry one request out; it returns the answer written,
    or None when the request changed (another reaper answered it)."""
    from kazoo.exceptions import RolledBackError
    answer = {"version": version + 1}
    txn = store._client.transaction()
    txn.set_data(store._path(target), bytes(value), version)
    txn.set_data(store._path(request), json.dumps({"answer": answer}).encode(), request_version)
    results = store._call(f"change {target!r}", lambda: txn.commit_async(), idempotent=False)
    if not any(isinstance(r, Exception) for r in results):
        return answer
    if not isinstance(results[1], (RolledBackError, type(None))) and isinstance(results[1], Exception):
        return None                                 # the request changed: another reaper answered it
    answer = ({"error": "missing", "message": f"no metadata key {target!r}"} if isinstance(results[0], NoNodeError)
              else {"error": "version", "message": f"metadata key {target!r} is not at version {version}"})
    try:
        store.put(request, json.dumps({"answer": answer}).encode(), request_version)
    except (BadVersion, NoSuchKey):
        return None
    return answer


def requester_of(store, key: str) -> str | None:
    """requester_of (the reaper's) is the principal that made request znode `key`: the one principal digest its
    ACL names beside the cluster's, as a principal's store makes it. None (the request does not count) when
    the ACL names none or several, hides them from the cluster (no admin for it: ZooKeeper then shows digests
    as 'x'), or the request has children (pinned against the drop of pending requests on a revocation)."""
    acls, stat = store._call("read a request's ACL", lambda: store._client.get_acls_async(store._path(key)),
                             idempotent=True)
    if stat.numChildren:
        return None
    cluster = {acl.id.id for acl in store._policy.cluster()}
    others = [acl for acl in acls if not (acl.id.scheme == "digest" and acl.id.id in cluster)]
    if len(others) != 1 or others[0].id.scheme != "digest":
        return None
    for principal, identity in _allowed_ids(store, None).items():
        if identity == others[0].id.id:
            return principal
    return None


def _put_holders(store, log_name: str, allowed: dict[str, str]) -> dict[str, str]:
    """_put_holders maps each principal that may ask for changes of log `log_name` (its `write` and `admin`
    grants: owners write themselves) and has a ZooKeeper identity to that identity."""
    from walkit.security import LEVELS, permits
    found = {}
    for principal in store.children(f"security/acl/logs/{log_name}"):
        level = value_of(store, f"security/acl/logs/{log_name}/{principal}").decode(errors="replace")
        if principal in allowed and level in LEVELS and permits(level, "write"):
            found[principal] = allowed[principal]
    return found


def _delete_tree(store, rel: str) -> None:
    """_delete_tree deletes znode `rel` and what is under it, as far as the cluster may."""
    for child in reversed(list(_subtree(store, rel))):
        try:
            store._call("delete", lambda: store._client.delete_async(f"{store.root}/{child}"), idempotent=True)
        except (NoNodeError, NotEmptyError, MetadataNotAuthorized):
            pass
    try:
        store._call("delete", lambda: store._client.delete_async(f"{store.root}/{rel}"), idempotent=True)
    except (NoNodeError, NotEmptyError, MetadataNotAuthorized):
        pass


def put_requester(store, log_name: str, principal: str) -> bool:
    """put_requester (the reaper's) tells whether `put-requests/<log_name>/<principal>` is the cluster's making, so
    that a request in it is that principal's: no one but the cluster may create in `put-requests/<log_name>`."""
    acls, _ = store._call("read an ACL", lambda: store._client.get_acls_async(store._path(f"{PUT_PREFIX}/{log_name}")),
                          idempotent=True)
    cluster = {acl.id.id for acl in store._policy.cluster()}
    return all((acl.id.scheme == "digest" and acl.id.id in cluster) or not acl.perms & Permissions.CREATE
               for acl in acls)


def _replace(store, rel: str, acl: list[ACL]) -> bool:
    """_replace makes znode `rel` again with its data and ACL `acl`, in one transaction; False if the cluster may
    not read or delete it, or it has children."""
    path = f"{store.root}/{rel}"
    try:
        data, stat = store._call("read", lambda: store._client.get_async(path), idempotent=True)
        if stat.numChildren:
            return False
        txn = store._client.transaction()
        txn.delete(path, stat.version)
        txn.create(path, data, acl=acl)
        results = store._call(f"make {rel!r} again", lambda: txn.commit_async(), idempotent=False)
    except (NoNodeError, MetadataNotAuthorized):
        return False
    if any(isinstance(r, Exception) for r in results):
        return False
    log.warning("made %s again with the ACL principal mode wants: a principal had made it shut to the cluster", rel)
    return True

