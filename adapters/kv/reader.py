"""walkit.adapters.kv.reader splits a connection's bytes into commands, in C where it can (hiredis).

    reader = CommandReader()              # same interface as resp.RespParser
    reader.feed(data)
    reader.next()                         # [b"SET", b"k", b"v"]; None until a whole command arrived

An authenticated connection's multibulk commands (what clients send) are parsed by
`hiredis.Reader`, in C, a whole read at a time; everything else by resp.RespParser, the
hand-written parser: inline commands, connections not yet authenticated (the lower limits of
resp.py must apply while a frame arrives, not after hiredis buffered it), the frame a read cuts
in two (RespParser checks it as it arrives, as before), and any read hiredis would read
differently.

hiredis pays only for a read of several commands (a pipeline): the checks below cost about a
microsecond per read, more than hiredis saves on one command, so a read goes to hiredis only
if it holds a second frame (``\r\n*``). A read that is one whole command, as clients that wait
for each reply send, is split at its CRLFs and taken if it is exactly the frame a client writes
for those arguments (`one_command`): then RespParser would read the same arguments from it.

The rule that keeps every reply the same: hiredis reads RESP replies, a superset of commands,
and skips checks RespParser makes. So a read goes to hiredis only if it starts with ``*``, is
at most FAST_LIMIT bytes, and holds nothing SUSPICIOUS (a simple or verbatim string where an
argument must be a bulk string, both of which hiredis takes silently, or an aggregate header of
100,000 elements or more, which it allocates before they arrive; a value may match too, and
that read then simply goes to RespParser). Its result is used only if every command is a list
of bulk strings, their frames as clients write them add up to where the read is cut, and the read
holds exactly the CRLFs those frames must (hiredis skips the two bytes after a bulk string
without looking at them). Otherwise the whole read goes to RespParser, which answers as it
always did, error messages included: nothing of a read is returned before it was checked.

Without the hiredis package every command goes through RespParser, with the same results.
"""

from __future__ import annotations

import collections
import itertools
import re

from walkit.adapters.kv.resp import RespParser

try:
    import hiredis
except ImportError:  # pragma: no cover - the kv extra installs it
    hiredis = None

#: The longest read hiredis is given; a longer one goes to RespParser.
FAST_LIMIT = 256 * 1024
#: Bytes hiredis would read where RespParser refuses them, or allocates for before they arrive:
#: an argument that is a simple or verbatim string, an aggregate header of 6 digits or more.
SUSPICIOUS = re.compile(rb"\n[+=]|[*%~>|][0-9]{6}")


class CommandReader:
    """CommandReader splits a byte stream into commands: hiredis where it reads as RespParser would,
    RespParser otherwise (see the module doc). `unauthenticated` may change between commands."""

    def __init__(self) -> None:
        self._slow = RespParser()
        self._ready: collections.deque[list[bytes]] = collections.deque()   # read by hiredis, not yet returned
        self._ready_bytes = 0
        self._fast = None                     # a hiredis.Reader that holds nothing, if there is one

    @property
    def unauthenticated(self) -> bool:
        """unauthenticated is True while resp.py's lower limits apply (RespParser reads everything then)."""
        return self._slow.unauthenticated

    @unauthenticated.setter
    def unauthenticated(self, value: bool) -> None:
        self._slow.unauthenticated = value

    @property
    def buffered(self) -> int:
        """buffered counts bytes received and not yet returned as (part of) a command (an upper bound:
        the whole read while any of its commands waits)."""
        return self._ready_bytes + self._slow.buffered

    def feed(self, data: bytes) -> None:
        """feed adds bytes received from the connection."""
        slow = self._slow
        if data[:1] == b"*" and len(data) <= FAST_LIMIT and slow.idle and not slow.unauthenticated:
            command = one_command(data)
            if command is not None:
                self._ready.append(command)
                self._ready_bytes += len(data)
                return
        if (b"\r\n*" not in data or hiredis is None or slow.unauthenticated or data[:1] != b"*" or not slow.idle
                or len(data) > FAST_LIMIT or SUSPICIOUS.search(data) is not None):
            slow.feed(data)
            return
        fast, self._fast = self._fast or hiredis.Reader(), None
        read = _read_all(fast, data)
        if read is None:
            slow.feed(data)
            return
        commands, used = read
        self._ready.extend(filter(None, commands))     # *0 is skipped, as RespParser skips it
        self._ready_bytes += used
        if used < len(data):
            slow.feed(data[used:])              # a frame cut by the read: RespParser reads it as it arrives
        else:
            self._fast = fast                   # it read everything: it holds nothing

    def only(self) -> list[bytes] | None:
        """only is the next command, not taken yet, if it is complete and all this reader holds; else None."""
        ready = self._ready
        if len(ready) == 1 and self._slow.buffered == 0:
            return ready[0]
        return None

    def next(self) -> list[bytes] | None:
        """next returns the next complete command, or None; ProtocolError for malformed input."""
        if self._ready:
            command = self._ready.popleft()
            if not self._ready:
                self._ready_bytes = 0
            return command
        return self._slow.next()


def one_command(data: bytes) -> list[bytes] | None:
    """one_command is the arguments of `data` if it is exactly one command as clients write it
    (``*2\r\n$3\r\nGET\r\n$1\r\nk\r\n``: canonical lengths, no CRLF inside an argument), else None.

    Split at its CRLFs, such a read is the header, then a length and an argument per argument,
    then nothing; the lengths are checked against the arguments as written, so the bytes are
    exactly those arguments' frame, which RespParser reads alike.
    """
    parts = data.split(b"\r\n")
    count = (len(parts) >> 1) - 1
    if count < 1 or len(parts) & 1 or parts[-1] or parts[0] != b"*%d" % count:
        return None
    args = parts[2::2]
    for length, arg in zip(parts[1::2], args):
        if length != b"$%d" % len(arg):
            return None
    return args


def _digits(lengths: list[int]) -> int:
    """_digits counts the decimal digits of `lengths`, in C: their repr is 2 characters per item plus them."""
    return len(repr(lengths)) - 2 * len(lengths) if lengths else 0


def _read_all(fast, data: bytes) -> tuple[list[list[bytes]], int] | None:
    """_read_all is the commands the hiredis reader `fast` reads from `data` and the bytes their frames
    take, or None if it reads anything RespParser would not read alike (see the module doc). The
    rest after those bytes is the start of a frame cut by the read. The checks run once per read,
    over all its commands, in C as far as they can."""
    fast.feed(data)
    commands = []
    try:
        while (command := fast.gets()) is not False:
            if type(command) is not list:
                return None
            commands.append(command)
    except Exception:  # noqa: BLE001 - hiredis' ProtocolError, or a map it cannot build (a list as a key)
        return None
    args = list(itertools.chain.from_iterable(commands))
    try:
        joined = b"\0".join(args)              # TypeError unless every argument is a bulk string
    except TypeError:
        return None
    if b"\r\0" in joined or joined[-1:] == b"\r":
        return None                             # an argument ending in CR could hide a bad terminator
    counts, lengths = list(map(len, commands)), list(map(len, args))
    # Each frame is *<count>CRLF, then $<length>CRLF<bytes>CRLF per argument, as clients write it.
    used = 3 * len(counts) + _digits(counts) + 5 * len(lengths) + _digits(lengths) + sum(lengths)
    # hiredis skips the two bytes after a bulk string unread: each must have been CRLF.
    lines = len(counts) + 2 * len(lengths) + joined.count(b"\r\n")
    if used > len(data) or data[used:used + 1] not in (b"", b"*") or data.count(b"\r\n", 0, used) != lines:
        return None
    return commands, used
