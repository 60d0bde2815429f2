"""tests.support.resp_fuzz makes hostile requests for a RESP (Redis protocol) server, from a seed.

`HostileRequests(seed)` yields messages of the kinds a broken or malicious client sends:
random bytes, truncated and bit-flipped commands, wrong type prefixes, negative, malformed and
huge lengths (bulk strings and keys claiming 512 MiB, arrays claiming 2**31 elements), nested
arrays, inline commands with unbalanced quotes, unknown commands, wrong arity, integers that
are not (INCRBY, EXPIRE, SET EX, SCAN), hostile glob patterns, and pipelines mixing all of
these with valid commands. The same seed yields the same messages; every message says what it
is (`kind`), so a failure names the input that caused it.

A message is `framed` when a server reading it must answer every command in it or close the
connection, without waiting for more bytes: a client may then send a marker command after it
and read until the marker's answer (or the close). Other messages (truncated, bit-flipped,
random bytes, claims of more bytes than follow) may leave the server waiting for the rest of a
command, so a client sends them last on a connection and then closes its side.

`Replies` parses what the server answers (RESP2 and RESP3) and raises ValueError for bytes
that are not a reply: a fuzz test checks that everything a server says is well-formed.
`RawConnection` is a client that sends any bytes and reads parsed replies.
"""

from __future__ import annotations

import random
import socket
from typing import Iterator, NamedTuple

#: The keys the valid commands use (few, so the store stays small), and the values' largest size.
KEYS = tuple(b"fz:%d" % i for i in range(64)) + (b"fz:counter", b"fz:text")
#: Fields and members of the fuzz's hashes, sets and sorted sets: few, so they stay small.
FIELDS = (b"a", b"b", b"c", b"d")
MAX_VALUE = 512
#: Commands the server knows, with arities that are right, to be made wrong.
KNOWN = {b"GET": 2, b"SET": 3, b"MGET": 2, b"EXISTS": 2, b"TTL": 2, b"PTTL": 2, b"TYPE": 2, b"KEYS": 2,
         b"DBSIZE": 1, b"SCAN": 2, b"MSET": 3, b"DEL": 2, b"UNLINK": 2, b"INCR": 2, b"DECR": 2, b"INCRBY": 3,
         b"DECRBY": 3, b"PING": 1, b"ECHO": 2, b"TIME": 1, b"SELECT": 2, b"INFO": 1, b"ROLE": 1, b"HELLO": 1,
         b"AUTH": 2, b"CLIENT": 2, b"CONFIG": 2, b"COMMAND": 1}
#: Texts that are not int64 integers, or are at their edges.
NOT_INTEGERS = (b"", b"abc", b"1.5", b"1e3", b"0x10", b" 1", b"1 ", b"+1", b"--1", b"-", b"9223372036854775808",
                b"-9223372036854775809", b"99999999999999999999999", b"\x00", b"\xff\xfe", b"007", b"-0",
                b"9223372036854775807", b"-9223372036854775808", b"0", b"-1")
#: Length fields that are malformed, negative or far beyond any limit (2**29 is 512 MiB).
BAD_LENGTHS = (b"-5", b"-1", b"-2147483648", b"abc", b"", b"+3", b" 3", b"3 ", b"0x10", b"1.5",
               b"99999999999", b"536870912", b"2147483647", b"4294967296", b"9223372036854775807",
               b"99999999999999999999999999", b"\xff")
HUGE_COUNTS = (b"2147483647", b"2147483648", b"99999999999", b"1048577", b"-2147483648", b"9" * 40)
PATTERNS = (b"*a*a*a*a*a*a*a*a*a*b", b"[z-a]*", b"[a-\\]", b"[^]", b"[]", b"[", b"\\", b"*[", b"[a-",
            b"fz:[0-9]*", b"?*?*?*?*?*?*?*?*?*?*x", b"**********", b"[\\]-a]", b"*" * 300)
WRONG_PREFIXES = b"+-:$,#%~>!=(|_.\x00\xff\r\n "


def command(*args: bytes) -> bytes:
    """command is a command in RESP's multibulk form, as clients send it."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class Message(NamedTuple):
    """Message is one hostile message: its bytes, what kind of abuse it is, and whether it is framed."""

    kind: str
    data: bytes
    framed: bool


class HostileRequests:
    """HostileRequests yields hostile messages for a RESP server, deterministically from `seed`.

    `rare_wrongpass` is the share of AUTH attempts with a user name (WRONGPASS, which a server
    may answer late on purpose).
    """

    def __init__(self, seed: int, rare_wrongpass: float = 0.02) -> None:
        self.rng = random.Random(seed)
        self.rare_wrongpass = rare_wrongpass
        self._makers = [
            ("random-bytes", 3, False, self._random_bytes),
            ("truncated", 3, False, self._truncated),
            ("bit-flips", 4, False, self._bit_flips),
            ("wrong-prefix", 2, True, self._wrong_prefix),
            ("bad-length", 4, True, self._bad_length),
            ("huge-count", 2, True, self._huge_count),
            ("claims-more", 2, False, self._claims_more),
            ("nested-array", 2, True, self._nested_array),
            ("inline", 4, True, self._inline),
            ("unknown-command", 3, True, self._unknown),
            ("wrong-arity", 3, True, self._wrong_arity),
            ("bad-integer", 4, True, self._bad_integer),
            ("pattern", 2, True, self._pattern),
            ("connection", 2, True, self._connection),
            ("pipelined-mix", 6, True, self._pipelined_mix),
            ("transaction", 2, True, self._transaction),
        ]
        self._weights = [weight for _, weight, _, _ in self._makers]

    def __iter__(self) -> Iterator[Message]:
        while True:
            kind, _, framed, make = self.rng.choices(self._makers, self._weights)[0]
            yield Message(kind, make(), framed)

    # -- valid commands, the raw material -----------------------------------------------------
    def _key(self) -> bytes:
        return self.rng.choice(KEYS)

    def _value(self) -> bytes:
        rng = self.rng
        size = rng.choice([0, 1, 5, 20, 100, rng.randrange(MAX_VALUE)])
        return rng.choice([rng.randbytes(size), b"%d" % rng.randrange(-1000, 1000), b"x" * size])

    def _valid(self) -> list[bytes]:
        """_valid is the arguments of a well-formed command (some of them fail at run time: INCR of text)."""
        rng = self.rng
        key = self._key()
        choices = [
            lambda: [b"SET", key, self._value()],
            lambda: [b"SET", key, self._value(), b"EX", b"%d" % rng.randrange(1, 100)],
            lambda: [b"SET", key, self._value(), rng.choice([b"NX", b"XX", b"GET", b"KEEPTTL"])],
            lambda: [b"GET", key],
            lambda: [b"MGET", *(self._key() for _ in range(rng.randrange(1, 8)))],
            lambda: [b"MSET", *(x for _ in range(rng.randrange(1, 4)) for x in (self._key(), self._value()))],
            lambda: [b"DEL", *(self._key() for _ in range(rng.randrange(1, 4)))],
            lambda: [b"INCR", rng.choice([b"fz:counter", key])],
            lambda: [b"INCRBY", b"fz:counter", b"%d" % rng.randrange(-10**6, 10**6)],
            lambda: [b"EXISTS", key, self._key()],
            lambda: [b"TTL", key], lambda: [b"PTTL", key], lambda: [b"TYPE", key],
            lambda: [b"KEYS", b"fz:1*"], lambda: [b"DBSIZE"],
            lambda: [b"SCAN", b"0", b"MATCH", b"fz:*", b"COUNT", b"%d" % rng.randrange(1, 50)],
            lambda: [b"PING"], lambda: [b"ECHO", self._value()], lambda: [b"TIME"],
            lambda: [b"INFO", rng.choice([b"server", b"replication", b"keyspace", b"everything"])],
            lambda: [b"ROLE"], lambda: [b"CLIENT", b"ID"], lambda: [b"CLIENT", b"GETNAME"],
            lambda: [b"CONFIG", b"GET", rng.choice([b"*", b"port", b"save", b"maxmemory"])],
            lambda: [b"COMMAND", b"COUNT"], lambda: [b"SELECT", b"0"],
            lambda: [b"HSET", key, rng.choice(FIELDS), self._value()], lambda: [b"HGETALL", key],
            lambda: [b"SADD", key, rng.choice(FIELDS)], lambda: [b"SMEMBERS", key],
            lambda: [b"ZADD", key, b"%d" % rng.randrange(-5, 5), rng.choice(FIELDS)],
            lambda: [b"ZRANGE", key, b"0", b"-1", b"WITHSCORES"], lambda: [b"LRANGE", key, b"0", b"-1"],
            lambda: [b"EXPIRE", key, b"%d" % rng.randrange(1, 100)], lambda: [b"APPEND", b"fz:short", b"x"],
            lambda: [b"DEL", b"fz:short"], lambda: [b"GETRANGE", key, b"0", b"10"],
        ]
        return rng.choice(choices)()

    def _valid_bytes(self) -> bytes:
        count = self.rng.choice([1, 1, 2, 5])
        return b"".join(command(*self._valid()) for _ in range(count))

    # -- unframed: the server may wait for more ---------------------------------------------------
    def _random_bytes(self) -> bytes:
        rng = self.rng
        size = rng.choice([1, 2, 7, 32, 200, 1024, 4096, rng.randrange(1, 20000)])
        data = rng.randbytes(size)
        return rng.choice([b"", b"*", b"$", b"*3\r\n$"]) + data

    def _truncated(self) -> bytes:
        data = self._valid_bytes()
        return data[:self.rng.randrange(1, len(data))]

    def _bit_flips(self) -> bytes:
        data = bytearray(self._valid_bytes())
        for _ in range(self.rng.choice([1, 1, 2, 4, 8, 32])):
            data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
        return bytes(data)

    def _claims_more(self) -> bytes:
        """_claims_more is a command that announces more arguments or bytes than follow (within limits)."""
        rng = self.rng
        if rng.random() < 0.5:
            return b"*%d\r\n" % rng.choice([3, 100, 1048576]) + b"$3\r\nSET\r\n"
        size = rng.choice([10, 65536, 1 << 20, 32 * 1024 * 1024])
        return b"*3\r\n$3\r\nSET\r\n$2\r\nfz\r\n$%d\r\n" % size + rng.randbytes(rng.randrange(0, 100))

    # -- framed: every command is answered, or the connection closed ------------------------------
    def _wrong_prefix(self) -> bytes:
        """_wrong_prefix is a command whose '*' is another type's prefix: the server reads inline lines.

        The arguments keep only printable bytes other than quotes and '*', so every line is a
        whole inline command (none starts an array or leaves a quote open).
        """
        args = [bytes(c for c in a if 33 <= c < 127 and c not in b"*'\"") for a in self._valid()]
        data = bytearray(command(*args))
        data[0] = self.rng.choice(WRONG_PREFIXES)
        return bytes(data)

    def _bad_length(self) -> bytes:
        """_bad_length is a bulk string header whose length is malformed, negative or above the limit.

        Lengths within the limit that are merely larger than what follows are `claims-more`;
        here the server must refuse the header itself, without waiting for its bytes.
        """
        rng = self.rng
        length = rng.choice(BAD_LENGTHS + (b"536870912",) * 3)
        position = rng.randrange(3)
        args = [b"SET", b"fz:big", b"v"]
        head = b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args[:position])
        return head + b"$" + length + b"\r\n" + rng.randbytes(rng.randrange(0, 64))

    def _huge_count(self) -> bytes:
        """_huge_count is an array header that is refused, or skipped as empty (then whole inline lines follow)."""
        rng = self.rng
        count = rng.choice(HUGE_COUNTS + (b"-5", b"abc", b"", b" 1"))
        tails = [b"", b"$3\r\nGET\r\n"] + ([] if count.startswith(b"-") else [rng.randbytes(20)])
        return b"*" + count + b"\r\n" + rng.choice(tails)

    def _nested_array(self) -> bytes:
        rng = self.rng
        inner = command(*self._valid())
        depth = rng.choice([1, 2, 5, 50])
        return b"*2\r\n" * depth + inner + command(b"x")

    def _inline(self) -> bytes:
        rng = self.rng
        lines = [
            b'SET "fz:1 unbalanced', b"GET 'fz:1", b'SET "fz:1"x y', b"SET 'a'b c", b'ECHO "\\x4', b'ECHO "a\\"',
            b'SET fz:text "quoted \\x41\\n value"', b"ECHO 'it\\'s'", b'ECHO ""', b"PING", b"   ", b"",
            b"GET fz:1", b"INCRBY fz:counter 12", b"SET fz:2 plain", b'"', b"'", b'ECHO "a"\'b\'',
            b"x" * rng.choice([10, 1000, 70000]), b"SET " + b"k" * 70000,
        ]
        count = rng.choice([1, 2, 4])
        return b"".join(rng.choice(lines) + rng.choice([b"\r\n", b"\n"]) for _ in range(count))

    def _unknown(self) -> bytes:
        rng = self.rng
        name = rng.choice([rng.randbytes(rng.randrange(1, 40)), b"FLUSHEVERYTHING", b"BLPOP", b"XADD", b"SUBSCRIBE",
                           b"MODULE", b"SHUTDOWN", b"DEBUG", b"X" * 1000, b"\x00", b"GET\x00"])
        return command(name, *(self._value() for _ in range(rng.randrange(0, 5))))

    def _wrong_arity(self) -> bytes:
        rng = self.rng
        name, arity = rng.choice(list(KNOWN.items()))
        count = rng.choice([0, max(0, arity - 2), arity + 1, arity + 5, 200])
        return command(name, *(self._key() for _ in range(count)))

    def _bad_integer(self) -> bytes:
        rng = self.rng
        bad = rng.choice(NOT_INTEGERS)
        key = self._key()
        return command(*rng.choice([
            [b"INCRBY", key, bad], [b"DECRBY", b"fz:counter", bad], [b"EXPIRE", key, bad],
            [b"SET", key, b"v", rng.choice([b"EX", b"PX", b"EXAT", b"PXAT"]), bad], [b"SCAN", bad],
            [b"SCAN", b"0", b"COUNT", bad], [b"SELECT", bad], [b"HELLO", bad], [b"INCR", b"fz:text"],
            [b"INCRBY", b"fz:counter", b"9223372036854775807"], [b"DECRBY", key, b"-9223372036854775808"],
        ]))

    def _pattern(self) -> bytes:
        rng = self.rng
        pattern = rng.choice(PATTERNS + (rng.randbytes(rng.randrange(1, 64)), b"*a" * rng.choice([10, 9000])))
        return command(*rng.choice([[b"KEYS", pattern], [b"SCAN", b"0", b"MATCH", pattern, b"COUNT", b"1000"],
                                    [b"CONFIG", b"GET", pattern]]))

    def _connection(self) -> bytes:
        """_connection is a connection or server command with odd arguments (CLIENT, HELLO, AUTH, CONFIG...)."""
        rng = self.rng
        choices = [[b"CLIENT", b"SETNAME", rng.choice([b"ok-name", b"has space", b"new\nline", b"\x00", b""])],
                   [b"CLIENT", rng.randbytes(8)], [b"CLIENT", b"LIST"], [b"CLIENT", b"INFO"],
                   [b"HELLO", rng.choice([b"2", b"3", b"4", b"-1"])], [b"HELLO", b"3", b"SETNAME"],
                   [b"HELLO", b"2", b"BOGUS", b"x"], [b"AUTH", self._value()], [b"AUTH", b"default", self._value()],
                   [b"AUTH", b"a", b"b", b"c"], [b"CONFIG", b"SET", b"requirepass", b"x"],
                   [b"CONFIG", rng.randbytes(5)], [b"COMMAND", b"INFO", b"GET", rng.randbytes(3)],
                   [b"COMMAND", b"DOCS"], [b"INFO", rng.randbytes(5)], [b"SELECT", b"1"], [b"QUIT"]]
        if rng.random() < self.rare_wrongpass:
            choices.append([b"AUTH", b"nobody", self._value()])
        return command(*rng.choice(choices))

    def _pipelined_mix(self) -> bytes:
        rng = self.rng
        parts = []
        for _ in range(rng.choice([2, 5, 10, 30])):
            pick = rng.random()
            if pick < 0.6:
                parts.append(command(*self._valid()))
            elif pick < 0.75:
                parts.append(self._bad_integer())
            elif pick < 0.85:
                parts.append(self._unknown())
            elif pick < 0.95:
                parts.append(self._wrong_arity())
            else:
                parts.append(b"PING\r\n")
        return b"".join(parts)


    def _transaction(self) -> bytes:
        """_transaction is MULTI, a few commands (some refused, so EXEC aborts), then EXEC or DISCARD;
        sometimes after a WATCH, and a list pushed and trimmed in one go (it stays small)."""
        rng = self.rng
        parts = [command(b"WATCH", self._key())] if rng.random() < 0.3 else []
        parts.append(command(b"MULTI"))
        for _ in range(rng.randrange(0, 6)):
            pick = rng.random()
            if pick < 0.7:
                parts.append(command(*self._valid()))
            elif pick < 0.8:
                parts.append(self._wrong_arity())
            else:
                key = self._key()
                parts += [command(b"LPUSH", key, self._value()), command(b"LTRIM", key, b"0", b"9")]
        parts.append(command(rng.choice([b"EXEC", b"EXEC", b"DISCARD"])))
        return b"".join(parts)


class Error(str):
    """Error is an error reply (its text, without the '-')."""


class Replies:
    """Replies parses RESP2/RESP3 replies from a byte stream; ValueError for bytes that are not replies."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> None:
        """feed adds bytes read from the server."""
        self._buf += data

    @property
    def pending(self) -> int:
        """pending counts the bytes of a reply not complete yet."""
        return len(self._buf)

    def take(self) -> list:
        """take returns every complete reply received so far."""
        out, pos, buf = [], 0, self._buf
        while pos < len(buf):
            try:
                value, pos_after = _reply(buf, pos)
            except _Incomplete:
                break
            out.append(value)
            pos = pos_after
        self._buf = buf[pos:]
        return out


class _Incomplete(Exception):
    pass


def _line(buf: bytes, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        if len(buf) - pos > 1 << 20:
            raise ValueError("a reply line longer than 1 MiB")
        raise _Incomplete
    return buf[pos:end], end + 2


def _number(text: bytes) -> int:
    if not text.lstrip(b"-").isdigit():
        raise ValueError(f"not a number: {text[:40]!r}")
    return int(text)


def _reply(buf: bytes, pos: int):
    if pos >= len(buf):
        raise _Incomplete
    kind = buf[pos:pos + 1]
    line, pos = _line(buf, pos + 1)
    if kind == b"+":
        return line, pos
    if kind == b"-":
        return Error(line.decode("utf-8", "replace")), pos
    if kind in (b":", b"("):
        return _number(line), pos
    if kind == b"_":
        return None, pos
    if kind in (b",", b"#"):
        return line, pos
    if kind in (b"$", b"!", b"="):
        size = _number(line)
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            raise _Incomplete
        if buf[pos + size:pos + size + 2] != b"\r\n":
            raise ValueError("a bulk reply not followed by CRLF")
        return buf[pos:pos + size], pos + size + 2
    if kind in (b"*", b"~", b">", b"%", b"|"):
        count = _number(line)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count * (2 if kind in (b"%", b"|") else 1)):
            item, pos = _reply(buf, pos)
            items.append(item)
        return items, pos
    raise ValueError(f"not a RESP reply type: {kind!r}")


class RawConnection:
    """RawConnection is a client socket that sends any bytes to a RESP server and reads its parsed replies."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self._replies = Replies()
        self._ready: list = []

    def send(self, data: bytes) -> None:
        """send sends raw bytes."""
        self.sock.sendall(data)

    def call(self, *args: bytes):
        """call sends one command and returns its reply."""
        self.send(command(*args))
        return self.read()

    def read(self, count: int = 1):
        """read returns the next reply (a list of `count` replies if count > 1); EOFError if the server closes first."""
        while len(self._ready) < count:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError(f"the server closed the connection after {len(self._ready)} of {count} replies")
            self._replies.feed(chunk)
            self._ready += self._replies.take()
        taken, self._ready = self._ready[:count], self._ready[count:]
        return taken[0] if count == 1 else taken

    def closed_by_server(self) -> bool:
        """closed_by_server reads until the server closes the connection (True), or raises socket.timeout."""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return True
            if not chunk:
                return True
            self._replies.feed(chunk)
            self._ready += self._replies.take()

    def close(self) -> None:
        """close closes the socket."""
        self.sock.close()

    def __enter__(self) -> "RawConnection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
