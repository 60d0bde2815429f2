"""walkit.watchhub shares one metadata watch among many subscribers of the keys under it.

    subscription = watch_shared(store, "elections", "elections/replication/kv-default", callback)
    subscription.cancel()

A process that runs a thousand walkit.replicate machines (a topics broker with a thousand
partitions) would otherwise hold a thousand watches of election keys and a thousand of log
keys, and each costs the store something: a ZooKeeper watch walks and re-arms its subtree on
one callback thread, a SQLite watch is compared every round, an etcd watch is a stream. A hub
holds one watch of `root` per store and calls the subscribers whose prefix the changed key is
at, under or above (a store may name a parent of what changed: spi.MetadataStore.watch).
The store's watch is made with the first subscription and kept while the store is open; like
every watch, a callback may come more than once for one change, and from the store's thread.
"""

from __future__ import annotations

import bisect
import threading
from typing import Callable

_hubs_lock = threading.Lock()


class Subscription:
    """Subscription is one subscriber of a hub; cancel() stops its calls."""

    def __init__(self, hub: "WatchHub", prefix: str, callback: Callable[[str], None]) -> None:
        self._hub = hub
        self.prefix = prefix
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._hub._remove(self)


class WatchHub:
    """WatchHub is the one watch of `root` on `store`, fanned out to subscriptions (see the module doc)."""

    def __init__(self, store, root: str) -> None:
        self.store = store
        self.root = root
        self._lock = threading.Lock()
        self._subscriptions: dict[str, set[Subscription]] = {}
        self._sorted: list[str] | None = None      # the prefixes, sorted (rebuilt after a change)
        self._watch = None

    def subscribe(self, prefix: str, callback: Callable[[str], None]) -> Subscription:
        """subscribe calls `callback(key)` after keys at or under `prefix` (under the hub's root) change."""
        if prefix != self.root and not prefix.startswith(self.root + "/"):
            raise ValueError(f"{prefix!r} is not under the hub's root {self.root!r}")
        subscription = Subscription(self, prefix, callback)
        with self._lock:
            if self._watch is None:
                self._watch = self.store.watch(self.root, self._fire)    # MetadataError: nothing subscribed
            self._subscriptions.setdefault(prefix, set()).add(subscription)
            self._sorted = None
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        with self._lock:
            subscribers = self._subscriptions.get(subscription.prefix)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscriptions[subscription.prefix]
                    self._sorted = None

    def _fire(self, key: str) -> None:
        with self._lock:
            subscriptions = self._subscriptions
            parts = key.split("/")
            matched = [s for i in range(1, len(parts) + 1) for s in subscriptions.get("/".join(parts[:i]), ())]
            if self._sorted is None:
                self._sorted = sorted(subscriptions)
            low = bisect.bisect_left(self._sorted, key + "/")          # prefixes under the key (a parent changed)
            high = bisect.bisect_left(self._sorted, key + "0")
            matched += [s for prefix in self._sorted[low:high] for s in subscriptions.get(prefix, ())]
        for subscription in matched:
            if not subscription.cancelled:
                subscription.callback(key)


def watch_shared(store, root: str, prefix: str, callback: Callable[[str], None]) -> Subscription:
    """watch_shared subscribes `callback` to changes at or under `prefix` through `store`'s hub of `root`."""
    with _hubs_lock:
        hubs = store.__dict__.setdefault("_walkit_watch_hubs", {})
        hub = hubs.get(root)
        if hub is None:
            hub = hubs[root] = WatchHub(store, root)
    return hub.subscribe(prefix, callback)
