"""The same commands sent to a real redis-server and to walkit's KV server, their replies compared byte for byte.

    pair = RedisPair(redis_port, walkit_port)
    pair.same([b"SET", b"k", b"v"], [b"GET", b"k"], [b"HSET", b"k", b"f", b"v"])   # errors included

`same` sends each command to both servers (raw RESP over a socket each), reads one reply from
each, and fails with both replies side by side at the first difference. `reset` empties both
(FLUSHALL, SCRIPT FLUSH) and switches both connections back to RESP2. The servers are started by
the `redis_pair` fixture (tests/adapters/conftest.py): redis-server from the redis-server
package (scripts/test.sh installs it) on a free port of 127.0.0.1, without persistence, and a
`walkit kv serve` on a MemoryCluster inside the test process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile

from walkit.local import free_port, stop_process
from walkit.testing.processes import wait_until


def _encode(args) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        arg = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


class ReplyReader:
    """ReplyReader reads whole RESP2/RESP3 replies from a socket and returns their raw bytes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def _line_end(self, at: int) -> int:
        while True:
            end = self.buf.find(b"\r\n", at)
            if end >= 0:
                return end
            self._fill()

    def _skip(self, at: int) -> int:
        """_skip returns the offset after the reply starting at `at` (reading more as needed)."""
        end = self._line_end(at)
        kind, head = self.buf[at:at + 1], self.buf[at + 1:end]
        after = end + 2
        if kind in (b"$", b"=", b"!") and head != b"-1":
            after += int(head) + 2
            while len(self.buf) < after:
                self._fill()
            return after
        if kind in (b"*", b"~", b">") and head != b"-1":
            for _ in range(int(head)):
                after = self._skip(after)
            return after
        if kind in (b"%", b"|"):
            for _ in range(2 * int(head)):
                after = self._skip(after)
            return after
        return after                            # + - : _ , # ( and the nulls

    def read(self) -> bytes:
        """read returns the next reply's bytes."""
        while not self.buf:
            self._fill()
        end = self._skip(0)
        reply, self.buf = self.buf[:end], self.buf[end:]
        return reply


class RedisPair:
    """RedisPair holds one connection to each server and compares their replies."""

    def __init__(self, redis_port: int, walkit_port: int) -> None:
        self.ports = {"redis": redis_port, "walkit": walkit_port}
        self.readers: dict[str, ReplyReader] = {}
        self.connect()

    def connect(self) -> None:
        """connect opens (again) one connection to each server."""
        self.close()
        for name, port in self.ports.items():
            sock = socket.create_connection(("127.0.0.1", port), timeout=20)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.readers[name] = ReplyReader(sock)

    def close(self) -> None:
        for reader in self.readers.values():
            reader.sock.close()
        self.readers = {}

    def send(self, *args) -> dict[str, bytes]:
        """send sends one command to both servers and returns {"redis": reply, "walkit": reply}."""
        data = _encode(args)
        for reader in self.readers.values():
            reader.sock.sendall(data)
        return {name: reader.read() for name, reader in self.readers.items()}

    def same(self, *commands) -> list[bytes]:
        """same sends each command to both and asserts the replies are equal byte for byte; it returns them."""
        replies = []
        for args in commands:
            got = self.send(*args)
            assert got["walkit"] == got["redis"], (
                f"\n  command: {[a if isinstance(a, bytes) else str(a).encode() for a in args]!r}"
                f"\n  redis:   {got['redis']!r}\n  walkit:  {got['walkit']!r}")
            replies.append(got["redis"])
        return replies

    def same_unordered(self, *commands, pairs: bool = False) -> list[list]:
        """same_unordered is `same` for replies whose order Redis leaves to its hash tables (SMEMBERS,
        HGETALL, HKEYS...): the array's elements (with `pairs`, its consecutive pairs) are compared
        as sorted lists, everything else byte for byte. It returns the sorted elements."""
        results = []
        for args in commands:
            got = self.send(*args)
            parsed = {}
            for name, raw in got.items():
                value = _parse(raw)
                if isinstance(value, list):
                    items = [tuple(value[i:i + 2]) for i in range(0, len(value), 2)] if pairs else value
                    value = sorted(items, key=repr)
                parsed[name] = value
            assert parsed["walkit"] == parsed["redis"], (
                f"\n  command: {args!r}\n  redis:   {got['redis']!r}\n  walkit:  {got['walkit']!r}")
            results.append(parsed["redis"])
        return results

    def reset(self) -> None:
        """reset empties both servers and starts new connections (RESP2, no transaction, no watch)."""
        self.connect()
        self.send(b"FLUSHALL")
        self.send(b"SCRIPT", b"FLUSH")


class RedisServer:
    """RedisServer is a real redis-server on a free port of 127.0.0.1, without persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-server-")
        self.log_path = os.path.join(self.dir, "redis.log")
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--logfile", self.log_path],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self._answers, 20, message=lambda: f"redis-server did not answer PING: {self._log()}")

    def _log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"redis-server exited: {self._log()}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        stop_process(self.process, 10)
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def _parse(raw: bytes):
    """_parse decodes one RESP2 reply (bytes, int, None, list; an error as ("error", message))."""
    value, _ = _parse_at(raw, 0)
    return value


def _parse_at(raw: bytes, at: int):
    end = raw.index(b"\r\n", at)
    kind, head = raw[at:at + 1], raw[at + 1:end]
    after = end + 2
    if kind == b"+":
        return head, after
    if kind == b"-":
        return ("error", head), after
    if kind == b":":
        return int(head), after
    if kind == b"$":
        if head == b"-1":
            return None, after
        return raw[after:after + int(head)], after + int(head) + 2
    if kind == b"*":
        if head == b"-1":
            return None, after
        items = []
        for _ in range(int(head)):
            item, after = _parse_at(raw, after)
            items.append(item)
        return items, after
    raise ValueError(f"not a RESP2 reply: {raw[at:at + 20]!r}")
