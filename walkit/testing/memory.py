"""walkit.testing.memory runs bookies inside the test process, over the in-memory transport.

    with MemoryCluster("sqlite:///tmp/meta.db", bookies=3) as cluster:
        client = cluster.client()

Clients made by `client()` talk to the bookies through `walkit.transport.memory`, with real
Cap'n Proto frames, so client behaviour is tested without processes or sockets. `kill(i)` takes
a bookie down (its storage is kept) and `revive(i)` brings it back; `revive(i, empty=True)`
brings it back on a new, empty disk (a new disk id, as a memory bookie restarting for real).
"""

from __future__ import annotations

from walkit.bookie.identity import new_disk_id
from walkit.plugins import open_metadata
from walkit.plugins.storage.memory import MemoryStorage
from walkit.registry import BookieInfo, BookieRegistry
from walkit.transport.memory import MemoryNetwork


class MemoryCluster:
    """MemoryCluster is N in-process bookies registered in a real metadata store."""

    def __init__(self, metadata_url: str, bookies: int = 3, **client_options) -> None:
        self.metadata_url = metadata_url
        self.network = MemoryNetwork()
        self.store = open_metadata(metadata_url)
        self.registry = BookieRegistry(self.store)
        self.storages: list[MemoryStorage] = []
        self.disks: list[int] = []
        self.addresses: list[str] = []
        self._sessions: dict[str, object] = {}
        self._clients: list = []
        self._client_options = client_options
        for _ in range(bookies):
            self.add_bookie()

    def add_bookie(self) -> int:
        """add_bookie starts and registers one more bookie; it returns its index."""
        index = len(self.addresses)
        address = f"mem-bookie-{index}"
        self.storages.append(MemoryStorage())
        self.disks.append(new_disk_id())
        self.addresses.append(address)
        self.network.add_bookie(address, self.storages[index], disk=self.disks[index])
        self._register(index)
        return index

    def _register(self, i: int) -> None:
        address = self.addresses[i]
        self._sessions[address] = self.registry.register(BookieInfo(address, storage="memory://", disk=self.disks[i]))

    def service(self, i: int):
        """service returns bookie `i`'s BookieService."""
        return self.network.bookies[self.addresses[i]]

    def kill(self, i: int) -> None:
        """kill takes bookie `i` off the network and out of the registry."""
        address = self.addresses[i]
        self.network.kill(address)
        session = self._sessions.pop(address, None)
        if session is not None:
            session.close()

    def revive(self, i: int, empty: bool = False) -> None:
        """revive brings bookie `i` back with the storage it had, or on a new `empty` disk."""
        address = self.addresses[i]
        if empty:
            self.storages[i] = MemoryStorage()
            self.disks[i] = new_disk_id()
            self.network.add_bookie(address, self.storages[i], disk=self.disks[i])
        self.network.revive(address)
        if address not in self._sessions:
            self._register(i)

    def client(self, own_store: bool = False, **options):
        """client returns a new Client on this cluster (closed with the cluster).

        Clients share the cluster's metadata store unless `own_store`: then the client opens its
        own (a candidate in an election, such as a walkit.replicate node, needs one).
        """
        from walkit.client.api import Client
        merged = {**self._client_options, **options}
        store = open_metadata(self.metadata_url) if own_store else self.store
        client = Client(store, transport=self.network.transport(), **merged)
        if own_store:
            client._owns_store = True
        self._clients.append(client)
        return client

    def close(self) -> None:
        """close closes the clients and the metadata store."""
        for client in self._clients:
            client.close()
        for session in self._sessions.values():
            session.close()
        self.store.close()

    def __enter__(self) -> "MemoryCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
