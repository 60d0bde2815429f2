"""walkit.plugins.metadata.principals: what ZooKeeper's and etcd's principal modes share.

Principal mode gives each client principal a metadata-store identity of its own, so that the store
itself enforces walkit's permissions (walkit.plugins.metadata.zookeeper_principals and
walkit.plugins.metadata.etcd_principals). Both name principals alike, keep the same flag, and sort
keys into the same resources.
"""

from __future__ import annotations

import re

from walkit.errors import NoSuchKey

#: A principal: its public key in hex (walkit.security.principal).
PRINCIPAL = re.compile(r"[0-9a-f]{64}")
#: A ledger key's last part, as walkit.core.metadata.ledger_key writes it (and nothing else: not "5", "05", "５").
LEDGER_NAME = re.compile(r"[0-9]{20}", re.ASCII)
#: The flag an operator's first `walkit clients allow --metadata-password-file` sets: principal mode is on.
MODE_KEY = "security/principal-identities"


def is_principal(user: str | None) -> bool:
    """is_principal tells whether a metadata store's user name is a walkit principal (a store in principal mode)."""
    return bool(user) and PRINCIPAL.fullmatch(user) is not None


def resource_of(relpath: str) -> tuple[str, str | None] | None:
    """resource_of says which resource a key (path below the root) is: ("ledger", None: its metadata names the
    log), ("log", name) or ("name", log of the replicated name); None for a shared key."""
    parts = relpath.split("/")
    if len(parts) == 2 and parts[0] == "ledgers" and LEDGER_NAME.fullmatch(parts[1]):
        return ("ledger", None)
    if len(parts) == 2 and parts[0] == "logs":
        return ("log", parts[1])
    for prefix in (("replication",), ("elections", "replication"), (".counters", "elections", "replication")):
        n = len(prefix)
        if len(parts) > n and tuple(parts[:n]) == prefix:
            return ("name", f"replicated-{parts[n]}")
    return None


def value_of(store, key: str) -> bytes:
    """value_of is `key`'s value, or b"" when it does not exist."""
    try:
        return store.get(key)[0]
    except NoSuchKey:
        return b""
