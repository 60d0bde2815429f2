"""walkit.testing.proxy cuts one network link without cutting the others: a TCP proxy that can blackhole.

    proxy = TcpProxy("127.0.0.1", zk.port)          # listens on 127.0.0.1:<proxy.port>
    url = zk_url.replace(zk.address, proxy.address)   # give one process this address
    proxy.cut()                                       # packets go nowhere, both ways
    proxy.heal()                                      # new connections get through again
    proxy.close()

A process that reaches a server only through the proxy loses that server when the proxy is
cut, while every other process (and its other links) goes on as before: a partition of one
link, as a switch port or a firewall rule would make it. A cut proxy keeps accepting
connections and reading what is sent, and forwards nothing, so the client sees silence, not a
refused connection: it times out as it would behind a dead link. heal() closes the connections
cut meanwhile (their bytes are lost), so clients reconnect through a working link.
"""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """TcpProxy forwards connections to 127.0.0.1:`address` on to (host, port) until it is cut (see the module doc)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._links: list[tuple[socket.socket, socket.socket | None]] = []
        self._thread = threading.Thread(target=self._accept, name="walkit-proxy", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def cut(self) -> None:
        """cut makes the link silent both ways: nothing is forwarded, nothing is refused."""
        self._cut.set()

    def heal(self) -> None:
        """heal closes the connections made or cut while silent and forwards new ones again."""
        self._cut.clear()
        with self._lock:
            links, self._links = self._links, []
        for client, server in links:
            for s in (client, server):
                if s is not None:
                    _close(s)

    def close(self) -> None:
        """close stops accepting and closes every connection."""
        self._closed.set()
        _close(self._listener)
        self.heal()
        self._thread.join(5)

    def __enter__(self) -> "TcpProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = None
            if not self._cut.is_set():
                try:
                    server = socket.create_connection(self.target, timeout=5)
                    server.settimeout(None)
                except OSError:
                    _close(client)
                    continue
            with self._lock:
                self._links.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            if server is not None:
                threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket | None) -> None:
        """_pump copies source to sink while the proxy is not cut; while it is, it reads and drops."""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if sink is not None and not self._cut.is_set():
                    sink.sendall(data)
        except OSError:
            pass
        if not self._cut.is_set():            # a connection that ended by itself: end the other side too
            for s in (source, sink):
                if s is not None:
                    _close(s)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
