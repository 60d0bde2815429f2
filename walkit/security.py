"""walkit.security holds walkit's identities and permissions: CurveZMQ keys, the allow-list and ACLs.

Keys. Every bookie has a CurveZMQ key pair; so does every client that talks to secured bookies.
`new_keys(directory, name)` writes ``NAME.key`` (the public key) and ``NAME.key_secret`` (both),
as `walkit keys new NAME` does; `load_keys(path)` reads either file. A client's *principal* is
its public key in hex (64 characters; Z85 text may hold '/', which metadata keys cannot).

Allow-list. Bookies accept a client only if its public key is listed under
``security/clients/<principal>`` in the metadata store (`allow`, `disallow`, `allowed`), so
adding or revoking a client needs no bookie restart: bookies watch the prefix, check every
connection as it is made and every request as it arrives.

Permissions. Every ledger records its owner (the principal that created it), every log too.
``security/acl/logs/<log>/<principal>`` grants a principal `read`, `write` or `admin` on a log
and its ledgers (`grant`, `revoke`, `grants`); each level includes the lower ones, and an
owner has `admin`. Reading needs `read`; adding, fencing and recovering need `write`.
"""

from __future__ import annotations

import json
import os
import threading

from walkit.errors import ConfigError, NoSuchKey, NodeExists

CLIENTS_PREFIX = "security/clients"
ACL_PREFIX = "security/acl/logs"
LEVELS = ("read", "write", "admin")


# -- keys ----------------------------------------------------------------------------------------
def new_keys(directory: str, name: str) -> tuple[str, str]:
    """new_keys writes a key pair NAME.key and NAME.key_secret (mode 0600) and returns both paths."""
    import zmq.auth
    os.makedirs(directory, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return public, secret


def load_keys(path: str) -> tuple[bytes, bytes | None]:
    """load_keys reads (public key, secret key or None) in Z85 from a .key or .key_secret file."""
    import zmq.auth
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the key file {path!r}: {exc}") from None
    return public, secret


def principal_of(path: str) -> str:
    """principal_of is the principal (the public key in hex) of a key file."""
    return principal(load_keys(path)[0])


def principal(public_key: bytes | str) -> str:
    """principal is the principal of a Z85 public key: the 32 raw bytes in hex."""
    import zmq.utils.z85
    if isinstance(public_key, str):
        public_key = public_key.encode()
    return zmq.utils.z85.decode(public_key).hex()


# -- the allow-list -------------------------------------------------------------------------------
def allow(store, principal: str, name: str = "", metadata_identity: str | None = None) -> None:
    """allow lets the client with public key `principal` talk to the bookies (`name` is a label).

    `metadata_identity` records the principal's own metadata-store identity (ZooKeeper's digest
    ``PRINCIPAL:HASH``, walkit.plugins.metadata.zookeeper_principals) in its entry.
    """
    _check_principal(principal)
    entry = {"name": name}
    if metadata_identity:
        entry["zookeeper"] = metadata_identity
    key = f"{CLIENTS_PREFIX}/{principal}"
    try:
        store.create(key, json.dumps(entry).encode())
    except NodeExists:
        if metadata_identity:
            value, version = store.get(key)
            old = json.loads(value or b"{}")
            store.put(key, json.dumps({**old, **entry, "name": name or old.get("name", "")}).encode(), version)


def disallow(store, principal: str) -> None:
    """disallow revokes a client: bookies refuse its connections and requests from now on."""
    _check_principal(principal)
    try:
        store.delete(f"{CLIENTS_PREFIX}/{principal}")
    except NoSuchKey:
        pass


def allowed(store) -> dict[str, str]:
    """allowed maps every allowed principal to its label."""
    out = {}
    for principal in store.children(CLIENTS_PREFIX):
        try:
            out[principal] = json.loads(store.get(f"{CLIENTS_PREFIX}/{principal}")[0]).get("name", "")
        except NoSuchKey:
            continue
    return out


class AllowList:
    """AllowList is a bookie's live view of the allow-list (kept current by a watch).

    It doubles as pyzmq's ZAP credentials provider: `callback(domain, key)`.
    """

    def __init__(self, store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._keys: frozenset[str] = frozenset()
        self._watch = store.watch(CLIENTS_PREFIX, lambda key: self.reload())
        self.reload()

    def reload(self) -> None:
        """reload reads the allow-list again."""
        keys = frozenset(self.store.children(CLIENTS_PREFIX))
        with self._lock:
            self._keys = keys

    def __contains__(self, principal) -> bool:
        if isinstance(principal, bytes):
            principal = principal.decode()
        return principal in self._keys

    def callback(self, domain: str, key: bytes) -> bool:
        """callback answers ZAP: may the client with Z85 public key `key` connect?"""
        return principal(key) in self

    def close(self) -> None:
        self._watch.cancel()


# -- ACLs -------------------------------------------------------------------------------------------
def grant(store, principal: str, level: str, log: str) -> None:
    """grant gives `principal` `level` (read, write or admin) on log `log` and its ledgers."""
    _check_principal(principal)
    if level not in LEVELS:
        raise ConfigError(f"unknown permission {level!r}; expected one of {', '.join(LEVELS)}")
    key, value = f"{ACL_PREFIX}/{log}/{principal}", level.encode()
    try:
        store.create(key, value)
    except NodeExists:
        _, version = store.get(key)
        store.put(key, value, version)


def revoke(store, principal: str, log: str) -> None:
    """revoke takes away whatever `principal` was granted on `log` (an owner keeps its rights)."""
    try:
        store.delete(f"{ACL_PREFIX}/{log}/{principal}")
    except NoSuchKey:
        pass


def forget_log(store, log: str) -> int:
    """forget_log deletes every grant on `log` (its log was deleted: a grant is not one on the next log of that
    name); it returns how many. The store's user must be allowed to change the grants."""
    gone = 0
    for principal in store.children(f"{ACL_PREFIX}/{log}"):
        try:
            store.delete(f"{ACL_PREFIX}/{log}/{principal}")
            gone += 1
        except NoSuchKey:
            pass
    return gone


def grants(store, log: str) -> dict[str, str]:
    """grants maps each principal granted something on `log` to its level."""
    out = {}
    for principal in store.children(f"{ACL_PREFIX}/{log}"):
        try:
            out[principal] = store.get(f"{ACL_PREFIX}/{log}/{principal}")[0].decode()
        except NoSuchKey:
            continue
    return out


def permits(level: str | None, needed: str) -> bool:
    """permits tells whether holding `level` is enough for an action that needs `needed`."""
    return level is not None and LEVELS.index(level) >= LEVELS.index(needed)


def _check_principal(value: str) -> None:
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ConfigError(f"a principal is a CurveZMQ public key in hex (64 characters), got {value!r} "
                          "(`walkit keys show FILE` prints it)")
