"""One append in flight against the floor of its shape: bare round trips plus fdatasync.

    python benchmarks/latency_floor.py --appends 2000 --rounds 3 [--json out.json]

walkit's one-append-in-flight latency (E3/Qw2/Qa2, 1 KiB, files storage) is a round trip to
two bookies that each write and fdatasync the entry. This script measures, in the same run and
on the same disk, what that shape costs with none of walkit in it, so the software's share is a
difference of two medians rather than a guess:

- ``floor``: three server processes, each a ZeroMQ ROUTER socket in Python that writes each
  request to a preallocated file and fdatasyncs it before replying (a bookie's minimum). A
  client thread sends entry i to servers i % 3 and (i + 1) % 3 over DEALER sockets and waits
  for both replies; the caller hands it each entry and waits on an Event, as walkit's caller
  hands appends to its client's I/O thread.
- ``floor, no hand-off``: the same, with the caller doing the round trip itself.
- ``floor, no fdatasync``: the round trips alone (what deferred sync leaves).
- ``floor over TCP``: ``floor`` with plain TCP sockets (a 4-byte length before each request)
  instead of ZeroMQ, whose I/O threads add a thread wake-up on each side of each message; the
  difference is what a transport without them could save.
- ``walkit``: `WriteHandle.append_async` with one in flight on a LocalCluster of three bookies,
  and the same on a deferred-sync ledger (acknowledged before the fdatasync).

Every round runs each configuration once, interleaved, against processes already warmed up;
the table gives the median over rounds of each round's p50 and p99, and walkit's p50 minus the
floor's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import select
import socket
import statistics
import struct
import tempfile
import threading
import time

import zmq

import walkit
from walkit.allocator import tune_malloc
from walkit.bench import latency_summary, pipelined
from walkit.collector import tune_gc

PREALLOCATE = 64 << 20


def _serve(address_out, folder: str, sync: bool, preallocate: int) -> None:
    """_serve is one floor server: write each request, fdatasync if `sync`, reply; b"stop" ends it."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    store = _Store(folder, port, sync, preallocate)
    address_out.send(port)
    try:
        while True:
            peer, request = router.recv_multipart()
            if request == b"stop":
                return
            store.write(request)
            router.send_multipart((peer, b"ok"))
    finally:
        store.close()
        router.close(linger=0)
        context.term()


LENGTH = struct.Struct("<I")
#: The exit code of a TCP floor server whose client went away without sending b"stop".
CLIENT_GONE = 3


def _serve_tcp(address_out, folder: str, sync: bool, preallocate: int) -> None:
    """_serve_tcp is `_serve` on a plain TCP socket: each request is a 4-byte length and its bytes.

    It exits with CLIENT_GONE if the connection ends without a b"stop".
    """
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    store = _Store(folder, port, sync, preallocate)
    address_out.send(port)
    connection = None
    try:
        connection, _ = listener.accept()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            header = connection.recv(LENGTH.size, socket.MSG_WAITALL)
            if len(header) < LENGTH.size:
                raise SystemExit(CLIENT_GONE)
            length = LENGTH.unpack(header)[0]
            request = connection.recv(length, socket.MSG_WAITALL)
            if len(request) < length:
                raise SystemExit(CLIENT_GONE)
            if request == b"stop":
                return
            store.write(request)
            connection.sendall(b"ok")
    finally:
        store.close()
        if connection is not None:
            connection.close()
        listener.close()


class _Store:
    """_Store is a floor server's file: each request is written to it and, if `sync`, fdatasynced."""

    def __init__(self, folder: str, port: int, sync: bool, preallocate: int) -> None:
        self.sync = sync
        self.size = preallocate
        self.fd = os.open(os.path.join(folder, f"floor-{port}.log"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.posix_fallocate(self.fd, 0, preallocate)
        os.fsync(self.fd)
        self.offset = 0

    def write(self, request: bytes) -> None:
        """write writes `request` inside the preallocated file (wrapping around) and syncs it if asked."""
        self.offset += os.pwrite(self.fd, request, self.offset % (self.size - len(request)))
        if self.sync:
            os.fdatasync(self.fd)

    def close(self) -> None:
        """close closes the file."""
        os.close(self.fd)


#: How long a floor server may take to start, and a round trip to finish, before the run fails.
TIMEOUT_S = 10


class _ZmqLinks:
    """_ZmqLinks are the client's DEALER sockets to the floor servers."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.poller = zmq.Poller()
        self.sockets: list = []

    def connect(self, port: int) -> None:
        """connect adds a DEALER socket connected to the server on `port`."""
        dealer = self.context.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        self.sockets.append(dealer)
        self.poller.register(dealer, zmq.POLLIN)

    def send(self, index: int, payload: bytes) -> None:
        """send queues `payload` for server `index` (ZeroMQ's I/O thread sends it)."""
        self.sockets[index].send(payload)

    def wait(self, replies: int) -> None:
        """wait returns once `replies` answers came in, or raises TimeoutError."""
        while replies:
            ready = self.poller.poll(TIMEOUT_S * 1000)
            if not ready:
                raise TimeoutError(f"a floor server did not answer within {TIMEOUT_S} s")
            for dealer, _ in ready:
                dealer.recv()
                replies -= 1

    def stop(self) -> None:
        """stop asks every server to end (one it cannot reach is killed by `Floor.close`)."""
        for dealer in self.sockets:
            try:
                dealer.send(b"stop", zmq.NOBLOCK)
            except zmq.Again:                             # not connected
                pass

    def close(self) -> None:
        """close closes the sockets and the context."""
        for dealer in self.sockets:
            dealer.close(linger=0)
        self.context.term()


class _TcpLinks:
    """_TcpLinks are the client's plain TCP connections to the floor servers (`_serve_tcp`).

    The sockets block, as a server loop's would (a timeout socket polls before every call);
    the kernel's SO_SNDTIMEO and SO_RCVTIMEO bound each send and read instead, so a stopped
    server fails the round trip rather than hanging it.
    """

    def __init__(self) -> None:
        self.poller = select.poll()
        self.sockets: list[socket.socket] = []
        self._by_fd: dict[int, socket.socket] = {}

    def connect(self, port: int) -> None:
        """connect opens a connection to the server on `port`."""
        connection = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        connection.settimeout(None)
        bound = struct.pack("ll", TIMEOUT_S, 0)           # struct timeval
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, bound)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, bound)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sockets.append(connection)
        self._by_fd[connection.fileno()] = connection
        self.poller.register(connection, select.POLLIN)

    def send(self, index: int, payload: bytes) -> None:
        """send sends `payload` to server `index`; TimeoutError or ConnectionError if it cannot."""
        try:
            self.sockets[index].sendall(LENGTH.pack(len(payload)) + payload)
        except BlockingIOError:
            raise TimeoutError(f"a floor server did not take a request within {TIMEOUT_S} s") from None
        except OSError as exc:
            raise ConnectionError(f"a floor server's connection failed: {exc}") from None

    def wait(self, replies: int) -> None:
        """wait returns once `replies` answers came in; TimeoutError or ConnectionError if one does not."""
        while replies:
            ready = self.poller.poll(TIMEOUT_S * 1000)
            if not ready:
                raise TimeoutError(f"a floor server did not answer within {TIMEOUT_S} s")
            for fd, _ in ready:
                try:
                    answer = self._by_fd[fd].recv(2, socket.MSG_WAITALL)
                except BlockingIOError:
                    raise TimeoutError(f"a floor server's answer stopped short for {TIMEOUT_S} s") from None
                except OSError as exc:
                    raise ConnectionError(f"a floor server's connection failed: {exc}") from None
                if answer != b"ok":
                    raise ConnectionError("a floor server's connection failed: it was closed")
                replies -= 1

    def stop(self) -> None:
        """stop asks every server to end (one it cannot reach is killed by `Floor.close`)."""
        for connection in self.sockets:
            try:
                connection.sendall(LENGTH.pack(4) + b"stop")
            except OSError:                               # its server is gone, or stopped
                pass

    def close(self) -> None:
        """close closes the connections."""
        for connection in self.sockets:
            connection.close()


class Floor:
    """Floor runs three bare servers and the client side of the round trip; `close()` ends them all.

    `transport` is "zmq" (ROUTER servers, DEALER client sockets) or "tcp" (plain sockets).
    """

    def __init__(self, folder: str, sync: bool, servers: int = 3, write_quorum: int = 2,
                 transport: str = "zmq", preallocate: int = PREALLOCATE) -> None:
        if transport not in ("zmq", "tcp"):
            raise ValueError(f"transport is 'zmq' or 'tcp', not {transport!r}")
        self.preallocate = preallocate
        self.write_quorum = write_quorum
        self.processes: list = []
        self.links = _ZmqLinks() if transport == "zmq" else _TcpLinks()
        self.entry = 0
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        try:
            for port in self._start_servers(folder, sync, servers, _serve if transport == "zmq" else _serve_tcp):
                self.links.connect(port)
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._io, daemon=True)
        self._thread.start()

    def _start_servers(self, folder: str, sync: bool, servers: int, serve) -> list[int]:
        spawn = multiprocessing.get_context("spawn")      # not fork: this process runs threads and ZeroMQ
        ports = []
        for _ in range(servers):
            receive, send = spawn.Pipe(duplex=False)
            process = spawn.Process(target=serve, args=(send, folder, sync, self.preallocate), daemon=True)
            process.start()
            self.processes.append(process)
            send.close()                                  # ours: so a server that dies reads as EOF here
            try:
                if not receive.poll(TIMEOUT_S):
                    raise RuntimeError(f"a floor server did not start within {TIMEOUT_S} s")
                ports.append(receive.recv())
            except EOFError:
                process.join(TIMEOUT_S)
                raise RuntimeError(f"a floor server exited before serving (exit code {process.exitcode})") from None
            finally:
                receive.close()
        return ports

    def round_trip(self, payload: bytes) -> None:
        """round_trip sends one entry to its write quorum and returns once every copy is acknowledged."""
        if len(payload) >= self.preallocate:
            raise ValueError(f"a payload of {len(payload)} bytes does not fit the servers' "
                             f"{self.preallocate}-byte files")
        count = len(self.links.sockets)
        for k in range(self.write_quorum):
            self.links.send((self.entry + k) % count, payload)
        self.entry += 1
        self.links.wait(self.write_quorum)

    def _io(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            payload, done, errors = item
            try:
                self.round_trip(payload)
            except Exception as exc:  # noqa: BLE001 - handed to the caller, which raises it
                errors.append(exc)
            done.set()

    def handed_off(self, payload: bytes) -> None:
        """handed_off is `round_trip` run by the client thread while the caller waits on an Event."""
        done, errors = threading.Event(), []
        self._requests.put((payload, done, errors))
        done.wait()
        if errors:
            raise errors[0]

    def close(self) -> None:
        """close stops the client thread and the servers (killing any that do not stop) and closes the sockets."""
        if self._thread is not None:
            self._requests.put(None)
            self._thread.join(TIMEOUT_S)
        self.links.stop()
        connected = len(self.links.sockets)
        for index, process in enumerate(self.processes):
            process.join(timeout=5 if index < connected else 0)     # not connected: no "stop" was sent
            if process.is_alive():
                process.kill()
                process.join()
        self.links.close()


def timed(call, payload: bytes, count: int) -> dict:
    """timed runs `call(payload)` `count` times, one at a time, and summarizes the latencies."""
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        call(payload)
        latencies.append(time.perf_counter() - started)
    return latency_summary(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=2000, help="appends per configuration and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians over rounds are reported")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--data-dir", default=None, help="where the files go (default: the temp dir)")
    parser.add_argument("--json", help="write the results as JSON")
    args = parser.parse_args()
    if args.appends < 1 or args.rounds < 1 or args.size < 1:
        parser.error("--appends, --rounds and --size must be at least 1")
    if args.size > 1 << 20:
        parser.error("--size is at most 1 MiB: a floor server's file is 64 MiB")
    tune_malloc()
    tune_gc()
    payload = os.urandom(args.size)
    names = ("floor", "floor, no hand-off", "floor, no fdatasync", "floor over TCP", "walkit",
             "walkit, deferred sync")
    results: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="walkit-floor-", dir=args.data_dir) as folder, \
            walkit.LocalCluster(bookies=3, data_dir=os.path.join(folder, "cluster")) as cluster, \
            walkit.Client(cluster.metadata_url) as client, contextlib.ExitStack() as floors:
        synced = Floor(folder, sync=True)
        floors.callback(synced.close)
        unsynced = Floor(folder, sync=False)
        floors.callback(unsynced.close)
        tcp = Floor(folder, sync=True, transport="tcp")
        floors.callback(tcp.close)
        writer = client.create_ledger(3, 2, 2)
        deferred = client.create_ledger(3, 2, 2, deferred_sync=True)
        runs = {
            "floor": lambda n: timed(synced.handed_off, payload, n),
            "floor, no hand-off": lambda n: timed(synced.round_trip, payload, n),
            "floor, no fdatasync": lambda n: timed(unsynced.handed_off, payload, n),
            "floor over TCP": lambda n: timed(tcp.handed_off, payload, n),
            "walkit": lambda n: pipelined(lambda i: writer.append_async(payload), n, 1),
            "walkit, deferred sync": lambda n: pipelined(lambda i: deferred.append_async(payload), n, 1),
        }
        for run in runs.values():               # warm up: connections, first-time code, page cache
            run(200)
        for _ in range(args.rounds):
            for name, run in runs.items():
                result = run(args.appends)
                results[name].append({"p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"]})
        writer.close()
        deferred.close()
    medians = {name: {key: statistics.median(r[key] for r in runs) for key in ("p50_ms", "p99_ms")}
               for name, runs in results.items()}
    print(f"one append in flight, {args.size} B, 3 servers, 2 copies each, medians of {args.rounds} rounds "
          f"of {args.appends}:")
    for name in names:
        print(f"  {name:24} p50 {medians[name]['p50_ms']:.3f} ms   p99 {medians[name]['p99_ms']:.3f} ms")
    print(f"  walkit's software share at p50: {medians['walkit']['p50_ms'] - medians['floor']['p50_ms']:.3f} ms "
          f"(synced), {medians['walkit, deferred sync']['p50_ms'] - medians['floor, no fdatasync']['p50_ms']:.3f} ms "
          f"(deferred sync against no fdatasync)")
    shares = sorted(zmq_round["p50_ms"] - tcp_round["p50_ms"]
                    for zmq_round, tcp_round in zip(results["floor"], results["floor over TCP"]))
    share = medians["floor"]["p50_ms"] - medians["floor over TCP"]["p50_ms"]
    print(f"  ZeroMQ's share of the floor at p50: {share:.3f} ms (round by round from {shares[0]:.3f} "
          f"to {shares[-1]:.3f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": medians, "rounds": results, "appends": args.appends, "size": args.size}, f,
                      indent=2)


if __name__ == "__main__":
    main()
