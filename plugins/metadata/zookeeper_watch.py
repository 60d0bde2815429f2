"""walkit.plugins.metadata.zookeeper_watch follows a ZooKeeper subtree with kazoo's one-shot watches.

The ZooKeeper store (walkit.plugins.metadata.zookeeper) opens one TreeWatch per `watch()` call.
kazoo has no recursive watches (ZooKeeper 3.6's addWatch), so a TreeWatch holds one data and
one child watch per znode of its subtree, and reports what changed to the store's callback thread.
"""

from __future__ import annotations

import logging

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import EventType

from walkit.errors import MetadataError
from walkit.plugins.metadata.session import UserWatch

log = logging.getLogger(__name__)


class TreeWatch:
    """TreeWatch follows every znode at or under one path with kazoo's one-shot watches.

    It keeps the data version of each znode it saw. An event re-reads what it names (the node,
    or its children) and re-arms the watch; the differences are reported to the user callback.
    After a reconnection (kazoo drops watches with the connection), or when reading failed, it
    re-reads the whole subtree. All of it runs on the store's callback thread.
    """

    def __init__(self, store, path: str) -> None:
        """TreeWatch follows `path` (a full znode path) for `store`, a ZooKeeperMetadataStore."""
        self.store = store
        self.path = path
        self.user: UserWatch | None = None
        self.known: dict[str, int] = {}          # znode path -> data version
        self.stale = False                       # an event may have been missed: scan again

    def _key(self, path: str) -> str:
        return path[len(self.store.root) + 1:]

    def _fire(self, paths) -> None:
        for path in sorted(paths):
            self.user.fire(self._key(path))

    def _on_event(self, event) -> None:
        """_on_event runs on kazoo's thread: hand the event to the callback thread."""
        if event.type != EventType.NONE and not self.user.cancelled:
            self.store._dispatcher.submit(lambda: self._handle(event))

    def _handle(self, event) -> None:
        if self.user.cancelled:
            return
        try:
            if event.type == EventType.CHILD:
                self._refresh_children(event.path)
            else:
                self._refresh_node(event.path)
        except (MetadataError, KazooException) as exc:
            self.stale = True
            log.warning("watch on %s may have missed a change (%s); it will catch up", self.path, exc)

    def catch_up(self) -> None:
        """catch_up re-reads the subtree and reports what changed; if that fails, the watch stays stale."""
        if self.user.cancelled:
            return
        try:
            self.scan(notify=True)
            self.stale = False
        except (MetadataError, KazooException) as exc:
            self.stale = True
            log.warning("watch on %s could not catch up yet (%s); it will try again", self.path, exc)

    def _exists(self, path: str):
        return self.store._call(f"watch {self._key(path)!r}", lambda: self.store._client.exists_async(path, self._on_event),
                                idempotent=True)

    def _children(self, path: str) -> list[str]:
        """_children lists a znode's children and watches them; none of a znode this store may not read
        (ZooKeeper's principal mode: another principal's log), whose changes it is not told of either."""
        from walkit.plugins.metadata.zookeeper import NoAuth
        try:
            return self.store._call(f"watch {self._key(path)!r}",
                                    lambda: self.store._client.get_children_async(path, self._on_event), idempotent=True)
        except (NoNodeError, NoAuth):
            return []

    def _walk(self, path: str, found: dict[str, int]) -> None:
        """_walk reads and watches the subtree at `path`, without recursion (a subtree may be arbitrarily deep:
        in ZooKeeper's principal mode, principals make znodes where watched subtrees are)."""
        pending = [path]
        while pending:
            path = pending.pop()
            stat = self._exists(path)
            if stat is None:
                continue
            found[path] = stat.version
            pending.extend(f"{path}/{name}" for name in self._children(path))

    def _subtree(self, path: str) -> set[str]:
        return {p for p in self.known if p == path or p.startswith(path + "/")}

    def scan(self, notify: bool) -> None:
        """scan re-reads the whole subtree, re-arming every watch, and reports what differs."""
        found: dict[str, int] = {}
        self._walk(self.path, found)
        changed = {p for p in found.keys() | self.known.keys() if found.get(p) != self.known.get(p)}
        self.known = found
        if notify:
            self._fire(changed)

    def _refresh_node(self, path: str) -> None:
        stat = self._exists(path)
        if stat is None:
            gone = self._subtree(path)
            for p in gone:
                del self.known[p]
            self._fire(gone)
        elif path not in self.known:
            self._refresh_subtree(path)
        elif self.known[path] != stat.version:
            self.known[path] = stat.version
            self._fire([path])

    def _refresh_children(self, path: str) -> None:
        names = set(self._children(path))
        before = {p.rsplit("/", 1)[1] for p in self.known if p.rsplit("/", 1)[0] == path}
        for name in sorted(before - names):
            gone = self._subtree(f"{path}/{name}")
            for p in gone:
                del self.known[p]
            self._fire(gone)
        for name in sorted(names - before):
            self._refresh_subtree(f"{path}/{name}")

    def _refresh_subtree(self, path: str) -> None:
        found: dict[str, int] = {}
        self._walk(path, found)
        old = self._subtree(path)
        changed = {p for p in found.keys() | old if found.get(p) != self.known.get(p)}
        for p in old - found.keys():
            del self.known[p]
        self.known.update(found)
        self._fire(changed)
