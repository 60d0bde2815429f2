"""walkit.testing.fuzz makes hostile frames for a bookie, from a seed.

`HostileFrames(seed)` yields messages (a list of frames, usually one) of the kinds a broken or
malicious peer sends: random bytes, truncated and bit-flipped valid frames, valid Cap'n Proto
carrying out-of-range values (negative and huge ids, long digests and master keys, strange LACs,
long-poll timeouts of weeks, many requests), frames that make a decoder walk far more than they
weigh, forged segment tables and multi-part messages. Every message says what it is (`kind`), so
a failure names the input that caused it. The same seed yields the same messages.
"""

from __future__ import annotations

import random
import struct
from typing import Iterator, NamedTuple

from walkit.core.messages import AddRequest, Entry, ForceRequest, ReadLacRequest, ReadRequest, WriteLacRequest
from walkit.wire.codec import DEFAULT_MAX_REQUESTS, encode_requests

#: Ledger ids the frames use: out of range, extreme, and a few far above any real cluster's.
LEDGER_IDS = (-1, -(2**63), 2**63 - 1, 2**62, 2**39, 10**12, 10**12 + 1, 10**12 + 2, 10**12 + 3)
_IDS = (-1, -2, -(2**63), 0, 1, 7, 1000, 2**31, 2**39 - 1, 2**39, 2**40, 2**62, 2**63 - 1)
_LACS = (-(2**63), -3, -2, -1, 0, 5, 2**39, 2**63 - 1)
_TIMEOUTS = (0, 1, 1000, 60_000, 2**31, 2**32 - 1)


class Message(NamedTuple):
    """Message is one hostile message: its frames and what kind of abuse it is."""

    kind: str
    frames: list[bytes]


class HostileFrames:
    """HostileFrames yields hostile messages for a bookie, deterministically from `seed`."""

    def __init__(self, seed: int, master_key: bytes = b"f" * 32) -> None:
        self.rng = random.Random(seed)
        self.master_key = master_key
        self._makers = [
            ("random-bytes", 3, self._random_bytes),
            ("truncated", 2, self._truncated),
            ("bit-flips", 4, self._bit_flips),
            ("byte-overwrites", 2, self._overwrites),
            ("out-of-range", 5, self._out_of_range),
            ("amplifier", 1, self._amplifier),
            ("segment-table", 1, self._segment_table),
            ("multi-part", 1, self._multi_part),
        ]
        self._weights = [weight for _, weight, _ in self._makers]
        self._crowded: bytes | None = None

    def __iter__(self) -> Iterator[Message]:
        while True:
            kind, _, make = self.rng.choices(self._makers, self._weights)[0]
            yield Message(kind, make())

    # -- valid frames, the raw material -------------------------------------------------------
    def _ledger(self) -> int:
        return self.rng.choice(LEDGER_IDS[4:]) if self.rng.random() < 0.8 else self.rng.choice(LEDGER_IDS)

    def _request(self, txn: int, wild: bool):
        """_request is a random request; `wild` draws its values from the out-of-range sets too."""
        rng = self.rng
        ledger = self._ledger()

        def pick(values, tame):
            return rng.choice(values) if wild and rng.random() < 0.5 else tame
        kind = rng.randrange(5)
        key = pick((b"", b"k" * 65, b"x" * rng.randrange(1, 4000)), self.master_key)
        if kind == 0:
            entries = []
            for i in range(rng.choice([0, 1, 1, 3, 20])):
                entry_id = pick(_IDS, rng.randrange(0, 100))
                lac = pick(_LACS, max(entry_id - 1, -(2**63)))
                digest = pick((b"d" * 256, b"d" * 1000, b""), b"\x01\x02\x03\x04")
                entries.append(Entry(ledger, entry_id, lac, digest, rng.randbytes(rng.choice([0, 1, 10, 300]))))
            return AddRequest(txn=txn, ledger_id=ledger, master_key=key, entries=entries,
                              recovery=rng.random() < 0.2, deferred_sync=rng.random() < 0.3)
        if kind == 1:
            ids = [pick(_IDS, rng.randrange(0, 100)) for _ in range(rng.choice([0, 1, 5, 50]))]
            return ReadRequest(txn=txn, ledger_id=ledger, entry_ids=ids, fence=rng.random() < 0.2, master_key=key,
                               previous_lac=pick(_LACS, -2), timeout_ms=pick(_TIMEOUTS, 0))
        if kind == 2:
            return ReadLacRequest(txn=txn, ledger_id=ledger, fence=rng.random() < 0.2, master_key=key,
                                  previous_lac=pick(_LACS, -2), timeout_ms=pick(_TIMEOUTS, 0))
        if kind == 3:
            return WriteLacRequest(txn=txn, ledger_id=ledger, master_key=key, lac=pick(_LACS, 3))
        return ForceRequest(txn=txn, ledger_id=ledger, master_key=key)

    def _valid(self) -> bytes:
        count = self.rng.choice([1, 1, 2, 5])
        return encode_requests([self._request(self.rng.randrange(2**64), wild=False) for _ in range(count)])

    # -- abuse ------------------------------------------------------------------------------
    def _random_bytes(self) -> list[bytes]:
        rng = self.rng
        size = rng.choice([0, 1, 7, 8, 16, 24, 40, 64, 200, 1024, 4096, rng.randrange(8, 20000)])
        return [rng.randbytes(size)]

    def _truncated(self) -> list[bytes]:
        frame = self._valid()
        return [frame[:self.rng.randrange(len(frame))]]

    def _bit_flips(self) -> list[bytes]:
        frame = bytearray(self._valid())
        for _ in range(self.rng.choice([1, 1, 2, 4, 8, 32])):
            frame[self.rng.randrange(len(frame))] ^= 1 << self.rng.randrange(8)
        return [bytes(frame)]

    def _overwrites(self) -> list[bytes]:
        frame = bytearray(self._valid())
        for _ in range(self.rng.choice([1, 2, 4])):
            at = self.rng.randrange(len(frame))
            width = min(len(frame) - at, self.rng.choice([1, 4, 8]))
            frame[at:at + width] = bytes([self.rng.choice([0x00, 0x7F, 0x80, 0xFF])]) * width
        return [bytes(frame)]

    def _out_of_range(self) -> list[bytes]:
        rng = self.rng
        if rng.random() < 0.005:        # one request too many for a frame (built once: it is large)
            if self._crowded is None:
                self._crowded = encode_requests([ReadLacRequest(txn=i, ledger_id=self._ledger())
                                                 for i in range(DEFAULT_MAX_REQUESTS + 1)])
            return [self._crowded]
        count = rng.choice([1, 1, 1, 3, 10])
        return [encode_requests([self._request(rng.randrange(2**64), wild=True) for _ in range(count)])]

    def _amplifier(self) -> list[bytes]:
        """_amplifier is an Envelope whose request list claims many zero-size elements in 40 bytes."""
        count = self.rng.choice([1000, 65536, 1 << 20, (1 << 29) - 1])
        return [struct.pack("<IIQQQQ", 0, 4, 1 << 32 | 1 << 48, 0, 1 | 7 << 32, count << 2)]

    def _segment_table(self) -> list[bytes]:
        """_segment_table forges a segment table: many segments, or sizes larger than the frame."""
        rng = self.rng
        segments = rng.choice([1, 2, 512, 2**31])
        sizes = [rng.choice([0, 1, 2**20, 2**32 - 1]) for _ in range(min(segments, 4))]
        header = struct.pack("<I", segments - 1) + b"".join(struct.pack("<I", s) for s in sizes)
        body = rng.randbytes(rng.choice([0, 8, 64]))
        frame = header + body
        return [frame + bytes(-len(frame) % 8)]

    def _multi_part(self) -> list[bytes]:
        return [self._valid() for _ in range(self.rng.choice([2, 3]))]
