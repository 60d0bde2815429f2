"""walkit.plugins.metadata.zookeeper_security keeps the allow-list and the grants an operator user's own in ZooKeeper.

    zk://USER@host:port/root?password_file=P&security_user=NAME&security_password_file=Q

The security keys (``security/...``: the allow-list and the grants, walkit.security) may belong
to an operator user of their own. A store given `security_user` and `security_password_file`
(both, a URI user, and a different name, or it refuses to open) adds NAME's digest credential
to its connection and keeps every znode of ``security`` at the ACL ``NAME:cdrwa, USER:r``. A
store of the cluster's user alone (every bookie and client) then reads the allow-list and the
grants and cannot change them: ZooKeeper answers NoAuth. When such a store opens it creates
``security``, its lists and ``security/acl/logs``, and sets that ACL on every znode below
``security`` that lacks it (one round trip or two per znode), so one operator command
(`walkit clients list --metadata URI`) protects an existing cluster.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.security import make_digest_acl

from walkit.errors import ConfigError
from walkit.plugins.metadata.credentials import Credentials, read_password_file

log = logging.getLogger(__name__)

#: The keys an operator user of their own may hold (walkit.security's allow-list and grants).
SECURITY = "security"
#: The znodes a store with a security user creates when it opens, so that none is the cluster user's.
BASES = ("security", "security/clients", "security/acl", "security/acl/logs")


def split_options(uri: str, options: dict) -> tuple[str, Credentials | None]:
    """split_options takes the security user's options out of `uri` and `options` (which it changes).

    It returns the URI without them and the security user's credentials (None without one).
    """
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    user = options.pop("security_user", query.pop("security_user", None))
    password_file = options.pop("security_password_file", query.pop("security_password_file", None))
    if (user is None) != (password_file is None):
        raise ConfigError("zk metadata: give security_user and security_password_file together")
    rest = urlunsplit(parts._replace(query=urlencode(query)))
    return rest, (Credentials(user, read_password_file(password_file)) if user else None)


def security_acl(credentials: Credentials | None, security: Credentials) -> list:
    """security_acl is the ACL of the security znodes: the security user all, the cluster's user read."""
    if credentials is None or security.user == credentials.user:
        raise ConfigError("zk metadata: security_user needs a URI user of its own, the cluster's "
                          "(zk://USER@host:port/root?password_file=...&security_user=...)")
    return [make_digest_acl(security.user, security.password, all=True),
            make_digest_acl(credentials.user, credentials.password, read=True)]


def is_security_key(key: str) -> bool:
    """is_security_key tells whether `key` is a security key (or their parent)."""
    return key == SECURITY or key.startswith(SECURITY + "/")


def protect(store) -> None:
    """protect makes the security znodes of a ZooKeeperMetadataStore with a security user, and gives
    every znode below them the security ACL."""
    # In ZooKeeper's principal mode every principal reads the allow-list and the grants (zookeeper_principals).
    acl, client, what = store._policy.with_world_read(store._security_acl), store._client, "protect the security keys"
    store._call("create the root", lambda: client.ensure_path_async(store.root, store._acl), idempotent=True)
    for key in BASES:
        path = store._path(key)
        try:
            store._call(what, lambda: client.create_async(path, b"", acl=acl, makepath=True), idempotent=True)
        except NodeExistsError:
            pass
    pending = [store._path(SECURITY)]
    while pending:
        path = pending.pop()
        try:
            acls, stat = store._call(what, lambda: client.get_acls_async(path), idempotent=True)
            if list(acls) != acl:
                store._call(what, lambda: client.set_acls_async(path, acl, version=stat.aversion), idempotent=True)
                log.info("gave %s the security ACL (user %r)", path, store.security_user)
            children = store._call(what, lambda: client.get_children_async(path), idempotent=True)
        except (NoNodeError, BadVersionError):
            continue                # deleted or changed meanwhile: a new one is created with the ACL
        pending.extend(f"{path}/{child}" for child in children)
