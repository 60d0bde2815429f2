"""walkit.adapters.kv.patterns matches keys against Redis glob patterns (KEYS, SCAN MATCH, CONFIG GET).

    compile_pattern(b"user:*:name").match(b"user:42:name")    # True
    literal_prefix(b"user:*")                                 # b"user:"

The syntax is redis-server's `stringmatchlen`: ``*`` any run of bytes, ``?`` any one byte,
``[abc]``, ``[a-z]`` (a reversed range ``[z-a]`` is the same range), ``[^...]`` (not those),
``\\x`` the byte x, also inside brackets; a bracket that is never closed extends to the end of
the pattern, and a trailing ``\\`` is itself.

Matching costs at most (key length x pattern length), whatever the pattern: the pattern is cut
at its stars into pieces of fixed length; the first piece must match the key's start, the last
its end, and each piece between them is searched for, left to right, after the one before it
(taking the leftmost place is never worse, since a star before the next piece absorbs
anything). A translation into one regular expression instead backtracks: ``*a*a*a*a*a*a*b``
against fifty bytes of ``a`` took a third of a second, and a hundred took minutes. Patterns
longer than MAX_PATTERN are refused: compiling one costs about 2 us per byte.
"""

from __future__ import annotations

import functools
import re

from walkit.adapters.kv.resp import ReplyError

#: The longest pattern accepted, in bytes.
MAX_PATTERN = 16 * 1024
#: Patterns up to this length are compiled once and kept (the 256 most recent).
CACHED_PATTERN = 256

_ANY = frozenset(range(256))


def _tokens(pattern: bytes) -> list:
    """_tokens splits a glob into None (a star) and sets of the bytes each position may hold."""
    out: list = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == 42:                                             # '*'
            if not out or out[-1] is not None:
                out.append(None)
        elif c == 63:                                           # '?'
            out.append(_ANY)
        elif c == 92 and i + 1 < n:                             # '\\'
            i += 1
            out.append(frozenset((pattern[i],)))
        elif c == 91:                                           # '['
            members, i = _bracket(pattern, i + 1)
            out.append(members)
        else:
            out.append(frozenset((c,)))
        i += 1
    return out


def _bracket(pattern: bytes, i: int) -> tuple[frozenset, int]:
    """_bracket reads a [...] set starting after '['; it returns the set and the index of its ']'."""
    n = len(pattern)
    negate = i < n and pattern[i] == 94                         # '^'
    if negate:
        i += 1
    members: set[int] = set()
    while i < n:
        c = pattern[i]
        if c == 92 and i + 1 < n:
            i += 1
            members.add(pattern[i])
        elif c == 93:                                           # ']'
            break
        elif i + 2 < n and pattern[i + 1] == 45:                # 'a-z'
            low, high = sorted((c, pattern[i + 2]))
            members.update(range(low, high + 1))
            i += 2
        else:
            members.add(c)
        i += 1
    return (_ANY - members if negate else frozenset(members)), i


def _piece(tokens: list) -> re.Pattern:
    parts = []
    for members in tokens:
        if members is _ANY or len(members) == 256:
            parts.append(b".")
        elif not members:
            parts.append(b"(?!)")
        else:
            parts.append(b"[" + b"".join(b"\\x%02x" % m for m in sorted(members)) + b"]")
    return re.compile(b"".join(parts), re.DOTALL)


class Glob:
    """Glob is a compiled pattern; `match(key)` tells whether the whole key matches."""

    __slots__ = ("_first", "_middle", "_last", "_starred", "_width")

    def __init__(self, pattern: bytes) -> None:
        pieces: list[list] = [[]]
        for token in _tokens(pattern):
            if token is None:
                pieces.append([])
            else:
                pieces[-1].append(token)
        self._starred = len(pieces) > 1
        self._first = (len(pieces[0]), _piece(pieces[0]))
        self._last = (len(pieces[-1]), _piece(pieces[-1]))
        self._middle = [(len(p), _piece(p)) for p in pieces[1:-1] if p]
        self._width = sum(len(p) for p in pieces)

    def match(self, key: bytes) -> bool:
        """match tells whether `key` matches the whole pattern."""
        size = len(key)
        if not self._starred:
            return size == self._first[0] and self._first[1].match(key) is not None
        if size < self._width:
            return False
        first_width, first = self._first
        last_width, last = self._last
        if first.match(key) is None or last.match(key, size - last_width) is None:
            return False
        at, end = first_width, size - last_width
        for _, piece in self._middle:
            found = piece.search(key, at, end)
            if found is None:
                return False
            at = found.end()
        return True


@functools.lru_cache(maxsize=256)
def _cached(pattern: bytes) -> Glob:
    return Glob(pattern)


def compile_pattern(pattern: bytes) -> Glob:
    """compile_pattern compiles a Redis glob; ReplyError for one longer than MAX_PATTERN."""
    if len(pattern) <= CACHED_PATTERN:
        return _cached(pattern)
    if len(pattern) > MAX_PATTERN:
        raise ReplyError(f"ERR pattern of {len(pattern)} bytes is too long (walkit kv takes up to {MAX_PATTERN})")
    return Glob(pattern)


def literal_prefix(pattern: bytes) -> bytes:
    """literal_prefix is the part of a glob before its first special character."""
    match = re.match(rb"[^*?\[\\]*", pattern)
    return match.group(0)
