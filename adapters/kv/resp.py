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

#: The largest bulk string accepted in a command (a value must fit in one log entry).
MAX_BULK = 32 * 1024 * 1024
#: The most arguments accepted in one command.
MAX_ARGS = 1024 * 1024
#: The longest inline command line accepted.
MAX_INLINE = 64 * 1024


class ProtocolError(Exception):
    """ProtocolError is raised for bytes that are not RESP; the connection is then closed, as Redis does."""


class Simple(str):
    """Simple is a status reply (``+OK``)."""


class ReplyError(Exception):
    """ReplyError is an error reply; its message starts with the error code (``ERR syntax error``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message.replace("\r", " ").replace("\n", " ")


OK = Simple("OK")
PONG = Simple("PONG")


def _int(text: bytes, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ProtocolError(f"invalid {what}") from None


class RespParser:
    """RespParser splits a byte stream into commands, each a list of bytes arguments.

    `feed` adds bytes; `next` returns the next complete command or None. A command that waits
    for a large bulk string is not parsed again until enough bytes arrived, so a big value
    streamed in small chunks costs linear time.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0
        self._chunks: list[bytes] = []
        self._have = 0          # bytes not parsed yet: _buf[_pos:] and _chunks
        self._need = 1          # bytes needed before parsing can make progress

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
            buf, pos = self._buf, self._pos
            if buf[pos] == 42:                          # '*': an array of bulk strings
                command, used = self._multibulk(buf, pos)
            else:
                command, used = self._inline(buf, pos)
            if command is None:
                self._need = used                       # wait until this many bytes are here
                return None
            self._pos = pos + used
            self._have -= used
            self._need = 1
            if command:                                 # empty inline lines are skipped
                return command
        return None

    def _multibulk(self, buf: bytes, pos: int) -> tuple[list[bytes] | None, int]:
        end = buf.find(b"\r\n", pos)
        if end < 0:
            if len(buf) - pos > 32:
                raise ProtocolError("invalid multibulk length")
            return None, len(buf) - pos + 1
        count = _int(buf[pos + 1:end], "multibulk length")
        if count > MAX_ARGS:
            raise ProtocolError("invalid multibulk length")
        at = end + 2
        size = len(buf)
        args = []
        for _ in range(count):
            if at >= size:
                return None, at - pos + 1
            if buf[at] != 36:                           # '$'
                raise ProtocolError(f"expected '$', got '{chr(buf[at])}'")
            end = buf.find(b"\r\n", at)
            if end < 0:
                if size - at > 32:
                    raise ProtocolError("invalid bulk length")
                return None, size - pos + 1
            length = _int(buf[at + 1:end], "bulk length")
            if length < 0 or length > MAX_BULK:
                raise ProtocolError("invalid bulk length")
            start = end + 2
            stop = start + length
            if stop + 2 > size:
                return None, stop + 2 - pos
            if buf[stop:stop + 2] != b"\r\n":
                raise ProtocolError("bulk string not terminated by CRLF")
            args.append(buf[start:stop])
            at = stop + 2
        return args, at - pos

    def _inline(self, buf: bytes, pos: int) -> tuple[list[bytes] | None, int]:
        end = buf.find(b"\n", pos)
        if end < 0:
            if len(buf) - pos > MAX_INLINE:
                raise ProtocolError("too big inline request")
            return None, len(buf) - pos + 1
        return buf[pos:end].split(), end + 1 - pos


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
    if kind is bool:
        return b":%d\r\n" % int(value)
    if kind is bytearray or kind is memoryview:
        return _bulk(bytes(value))
    raise TypeError(f"cannot encode {kind.__name__} as RESP")
