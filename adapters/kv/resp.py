"""walkit.adapters.kv.resp speaks RESP, the Redis protocol: a command parser and a reply encoder.

    parser = RespParser()
    parser.feed(b"*2\\r\\n$3\\r\\nGET\\r\\n$1\\r\\nk\\r\\n")
    parser.next()                        # [b"GET", b"k"]; None until a whole command arrived
    encode([b"a", None, 3, OK])          # b"*4\\r\\n$1\\r\\na\\r\\n$-1\\r\\n:3\\r\\n+OK\\r\\n"

Commands arrive as arrays of bulk strings (what clients send) or as inline lines (what a person
types into telnet). Replies are Python values: bytes (bulk string), None (null), int, Simple
(status line), ReplyError (error line), lists and dicts. With `resp3` nulls and maps use the
RESP3 types (clients switch with HELLO 3); everything else is the same in both versions.
"""

from __future__ import annotations

import re

#: The largest bulk string accepted in a command (a value must fit in one log entry).
MAX_BULK = 32 * 1024 * 1024
#: The most arguments accepted in one command.
MAX_ARGS = 1024 * 1024
#: The most bytes of arguments one command may carry: its record must fit in one log entry,
#: and bookies take frames up to 64 MiB (walkit.wire.codec.DEFAULT_MAX_FRAME).
MAX_COMMAND = 48 * 1024 * 1024
#: The longest inline command line accepted (redis-server's PROTO_INLINE_MAX_SIZE).
MAX_INLINE = 64 * 1024
#: The limits of a connection that has not authenticated on a server that requires it
#: (redis-server's since 6.2.6, CVE-2021-32675): a few arguments, none above 16 KiB.
UNAUTHENTICATED_ARGS, UNAUTHENTICATED_BULK = 10, 16 * 1024


class ProtocolError(Exception):
    """ProtocolError is raised for bytes that are not RESP; the connection is then closed, as Redis does."""


class Simple(str):
    """Simple is a status reply (``+OK``)."""


class ReplyError(Exception):
    """ReplyError is an error reply; its message starts with the error code (``ERR syntax error``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message.replace("\r", " ").replace("\n", " ")


class Double(float):
    """Double is a floating point reply: a bulk string in RESP2, RESP3's double type (``,``) in RESP3.

    It is written as redis-server 7.0 writes it (printf's %.17g; inf and -inf)."""


class SetReply(list):
    """SetReply is a reply that is a set (SMEMBERS...): an array in RESP2, RESP3's set type (``~``)."""


class Pairs(list):
    """Pairs is a flat list of pairs (HRANDFIELD WITHVALUES, ZRANGE WITHSCORES): a flat array in
    RESP2, an array of two-element arrays in RESP3, as redis-server 7.0 answers them."""


class NullArray:
    """NullArray is the nil array (``*-1``; RESP3's null): EXEC of an aborted transaction."""


OK = Simple("OK")
PONG = Simple("PONG")
QUEUED = Simple("QUEUED")
NIL_ARRAY = NullArray()


def format_double(value: float) -> bytes:
    """format_double writes a double as redis-server 7.0 does."""
    if value != value:
        return b"nan"
    if value in (float("inf"), float("-inf")):
        return b"inf" if value > 0 else b"-inf"
    return b"%.17g" % value

_LENGTH = re.compile(rb"-?[0-9]{1,18}")


def _length(text: bytes, what: str) -> int:
    if len(text) <= 18 and text.isdigit():     # the common case, without the regex
        return int(text)
    if _LENGTH.fullmatch(text) is None:
        raise ProtocolError(f"invalid {what}")
    return int(text)


class RespParser:
    """RespParser splits a byte stream into commands, each a list of bytes arguments.

    `feed` adds bytes; `next` returns the next complete command or None. Parsing is
    incremental: the arguments of a command that is still arriving are kept as they complete,
    and a large bulk string is not looked at again until all of it arrived, so a command costs
    linear time however it is cut into reads. While `unauthenticated` is set (it may change
    between commands) the lower limits UNAUTHENTICATED_ARGS and UNAUTHENTICATED_BULK apply.
    """

    def __init__(self) -> None:
        self.unauthenticated = False
        self._buf = b""
        self._pos = 0
        self._chunks: list[bytes] = []
        self._have = 0          # bytes not parsed yet: _buf[_pos:] and _chunks
        self._need = 1          # bytes needed before parsing can make progress
        self._args: list[bytes] | None = None   # the arguments of a multibulk command so far
        self._missing = 0       # its arguments still to come
        self._size = 0          # its bytes of arguments so far

    @property
    def buffered(self) -> int:
        """buffered counts the bytes received and not yet returned as (part of) a command."""
        return self._have

    @property
    def idle(self) -> bool:
        """idle tells whether the parser holds nothing: no bytes, no command under way."""
        return self._have == 0 and self._args is None

    def feed(self, data: bytes) -> None:
        """feed adds bytes received from the connection."""
        self._chunks.append(data)
        self._have += len(data)

    def next(self) -> list[bytes] | None:
        """next returns the next complete command, or None; ProtocolError for malformed input."""
        while self._have >= self._need:
            if self._chunks:
                self._buf = self._buf[self._pos:] + b"".join(self._chunks) if self._pos < len(self._buf) \
                    else b"".join(self._chunks)
                self._pos = 0
                self._chunks.clear()
            if self._args is not None:
                command = self._bulk()
            elif self._buf[self._pos] == 42:            # '*': an array of bulk strings
                command = self._multibulk()
            else:
                command = self._inline()
            if command:                                 # empty commands (*0, blank lines) are skipped
                return command
        return None

    def _take(self, used: int) -> None:
        self._pos += used
        self._have -= used
        self._need = 1

    def _line(self, limit: int, what: str) -> bytes | None:
        """_line is the line at the parse position without its CRLF (None until it is complete)."""
        buf, pos = self._buf, self._pos
        end = buf.find(b"\r\n", pos, pos + limit + 2)
        if end < 0:
            if len(buf) - pos > limit + 1:
                raise ProtocolError(f"invalid {what}")
            self._need = len(buf) - pos + 1
            return None
        self._take(end + 2 - pos)
        return buf[pos:end]

    def _multibulk(self) -> list[bytes] | None:
        line = self._line(32, "multibulk length")
        if line is None:
            return None
        count = _length(line[1:], "multibulk length")
        if count > MAX_ARGS:
            raise ProtocolError("invalid multibulk length")
        if count > UNAUTHENTICATED_ARGS and self.unauthenticated:
            raise ProtocolError("unauthenticated multibulk length")
        if count <= 0:
            return []
        self._args, self._missing, self._size = [], count, 0
        return self._bulk()

    def _bulk(self) -> list[bytes] | None:
        """_bulk reads the bulk strings of the command under way; the command once all arrived."""
        args = self._args
        while self._missing:
            buf, pos = self._buf, self._pos
            if pos >= len(buf):
                self._need = 1
                return None
            if buf[pos] != 36:                          # '$'
                raise ProtocolError(f"expected '$', got '{chr(buf[pos])}'")
            end = buf.find(b"\r\n", pos, pos + 34)
            if end < 0:
                if len(buf) - pos > 33:
                    raise ProtocolError("invalid bulk length")
                self._need = len(buf) - pos + 1
                return None
            length = _length(buf[pos + 1:end], "bulk length")
            if length < 0 or length > MAX_BULK:
                raise ProtocolError("invalid bulk length")
            if length > UNAUTHENTICATED_BULK and self.unauthenticated:
                raise ProtocolError("unauthenticated bulk length")
            if self._size + length > MAX_COMMAND:
                raise ProtocolError(f"a command may carry at most {MAX_COMMAND} bytes")
            start = end + 2
            stop = start + length
            if stop + 2 > len(buf):
                self._need = stop + 2 - pos
                return None
            if buf[stop:stop + 2] != b"\r\n":
                raise ProtocolError("bulk string not terminated by CRLF")
            args.append(buf[start:stop])
            self._size += length
            self._missing -= 1
            self._take(stop + 2 - pos)
        self._args = None
        return args

    def _inline(self) -> list[bytes] | None:
        buf, pos = self._buf, self._pos
        end = buf.find(b"\n", pos, pos + MAX_INLINE + 1)
        if end < 0:
            if len(buf) - pos > MAX_INLINE:
                raise ProtocolError("too big inline request")
            self._need = len(buf) - pos + 1
            return None
        self._take(end + 1 - pos)
        if end > pos and buf[end - 1] == 13:           # a CR before the LF is not part of the line
            end -= 1
        return split_inline(buf[pos:end])


#: One argument of an inline command: bare bytes, then at most one quoted part that ends it.
_INLINE_ARG = re.compile(rb"""([^\s"']*)(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\'|\\(?!'))*)')?(?=\s|\Z)""",
                         re.DOTALL)
_SPACE = re.compile(rb"\s*")
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)", re.DOTALL)
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"a": b"\a"}


def _unescape(match: re.Match) -> bytes:
    code = match.group(1)
    if len(code) == 3:
        return bytes((int(code[1:], 16),))
    return _ESCAPES.get(code, code)


def split_inline(line: bytes) -> list[bytes]:
    """split_inline splits an inline command line as redis-server's sdssplitargs does.

    Arguments are separated by whitespace; "double quotes" take the escapes \\n \\r \\t \\b \\a
    \\xHH and \\<any>, 'single quotes' only \\'. A closing quote must end its argument, and a
    quote must be closed: otherwise ProtocolError("unbalanced quotes in request").
    """
    if b'"' not in line and b"'" not in line:
        return line.split()
    args, pos, size = [], 0, len(line)
    while True:
        pos = _SPACE.match(line, pos).end()
        if pos >= size:
            return args
        found = _INLINE_ARG.match(line, pos)
        if found is None:
            raise ProtocolError("unbalanced quotes in request")
        bare, double, single = found.groups()
        if double is not None:
            bare += _ESCAPE.sub(_unescape, double)
        elif single is not None:
            bare += single.replace(b"\\'", b"'")
        args.append(bare)
        pos = found.end()


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def encode(value, resp3: bool = False) -> bytes:
    """encode returns the RESP bytes of a reply value (see the module doc)."""
    kind = type(value)
    if kind is bytes:
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if value is None:
        return b"_\r\n" if resp3 else b"$-1\r\n"
    if kind is int:
        return b":%d\r\n" % value
    if kind is Simple:
        return b"+%s\r\n" % value.encode()
    if isinstance(value, ReplyError):
        return b"-%s\r\n" % value.message.encode("utf-8", "replace")
    if kind is str:
        return _bulk(value.encode())
    if kind in (list, tuple):
        return b"*%d\r\n" % len(value) + b"".join(encode(v, resp3) for v in value)
    if kind is dict:
        items = [encode(part, resp3) for pair in value.items() for part in pair]
        return (b"%%%d\r\n" % len(value) if resp3 else b"*%d\r\n" % len(items)) + b"".join(items)
    if kind is Double:
        text = format_double(value)
        return b",%s\r\n" % text if resp3 else _bulk(text)
    if kind is SetReply:
        return (b"~%d\r\n" if resp3 else b"*%d\r\n") % len(value) + b"".join(encode(v, resp3) for v in value)
    if kind is Pairs:
        if not resp3:
            return b"*%d\r\n" % len(value) + b"".join(encode(v) for v in value)
        return b"*%d\r\n" % (len(value) // 2) + b"".join(
            b"*2\r\n" + encode(value[i], True) + encode(value[i + 1], True) for i in range(0, len(value), 2))
    if kind is NullArray:
        return b"_\r\n" if resp3 else b"*-1\r\n"
    if kind is bool:
        return (b"#t\r\n" if value else b"#f\r\n") if resp3 else b":%d\r\n" % int(value)
    if kind is bytearray or kind is memoryview:
        return _bulk(bytes(value))
    raise TypeError(f"cannot encode {kind.__name__} as RESP")
