"""Helpers that make a real server end a store's session, as a network partition would."""

from __future__ import annotations

from kazoo.client import KazooClient

from walkit.plugins.metadata.etcd import EtcdMetadataStore
from walkit.plugins.metadata.zookeeper import ZooKeeperMetadataStore


def expire_session(store) -> int:
    """expire_session makes the server end `store`'s session (ZooKeeper) or lease (etcd) and returns its id.

    For ZooKeeper it joins the session from a second client and closes it there (the way
    kazoo's own test harness expires sessions); for etcd it revokes the lease.
    """
    if isinstance(store, ZooKeeperMetadataStore):
        session_id, password = store._client.client_id
        intruder = KazooClient(hosts=store.hosts, client_id=(session_id, password), timeout=store.session_timeout)
        intruder.start(timeout=10)
        intruder.stop()
        intruder.close()
        return session_id
    if isinstance(store, EtcdMetadataStore):
        lease = store._lease
        store._client.post(store._client.get_url("/kv/lease/revoke"), json={"ID": lease})
        return lease
    raise TypeError(f"no way to expire the session of {type(store).__name__}")


def owner_of(store, key: str) -> int:
    """owner_of returns the session (ZooKeeper) or lease (etcd) that holds the ephemeral `key`, 0 if none."""
    if isinstance(store, ZooKeeperMetadataStore):
        _, stat = store._client.get(store._path(key))
        return stat.ephemeralOwner
    result = store._client.post(store._client.get_url("/kv/range"), json={"key": store._key(key)})
    kvs = result.get("kvs") or [{}]
    return int(kvs[0].get("lease", 0))
