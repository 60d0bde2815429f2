"""walkit.core.digest computes entry digests and ledger master keys.

An entry's digest covers its ledger id, entry id, LAC and payload
(docs/internals/protocol.md#entries-and-digests), so a replica that returns the right payload under the
wrong id is caught too. Three digest types exist:

- ``crc32c`` (default): 4 bytes, from the C-backed `crc32c` package (SSE4.2 where available);
- ``hmac-sha256``: 32 bytes, keyed from the ledger password, so only password holders can
  produce entries that verify;
- ``none``: no digest.

The master key a bookie stores per ledger is a hash of the password, never the password.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import crc32c as _crc32c

from walkit.errors import ConfigError

DIGEST_TYPES = ("crc32c", "hmac-sha256", "none")

_HEADER = struct.Struct(">qqq")
_crc = _crc32c.crc32c


def master_key(password: bytes) -> bytes:
    """master_key returns the 32-byte key a bookie stores for a ledger with this password."""
    return hashlib.sha256(b"walkit-ledger\x00" + password).digest()


def password_check(password: bytes) -> str:
    """password_check returns the hex verifier kept in ledger metadata to refuse wrong passwords.

    It is a hash of the master key, so neither the password nor the master key can be read off
    the metadata.
    """
    return hashlib.sha256(b"walkit-check\x00" + master_key(password)).hexdigest()


class Digest:
    """Digest signs and verifies the entries of one ledger.

    `sign(ledger_id, entry_id, lac, payload)` returns the digest bytes; `verify(entry)` checks an
    `Entry` read back from a bookie.
    """

    __slots__ = ("kind", "_mac_key", "sign")

    def __init__(self, kind: str, password: bytes = b"") -> None:
        if kind not in DIGEST_TYPES:
            raise ConfigError(f"unknown digest type {kind!r}; expected one of {', '.join(DIGEST_TYPES)}")
        self.kind = kind
        self._mac_key = hashlib.sha256(b"walkit-mac\x00" + password).digest()
        self.sign = {"crc32c": self._sign_crc32c, "hmac-sha256": self._sign_hmac, "none": self._sign_none}[kind]

    @staticmethod
    def _sign_crc32c(ledger_id: int, entry_id: int, lac: int, payload: bytes) -> bytes:
        return _crc(payload, _crc(_HEADER.pack(ledger_id, entry_id, lac))).to_bytes(4, "big")

    def _sign_hmac(self, ledger_id: int, entry_id: int, lac: int, payload: bytes) -> bytes:
        mac = hmac.new(self._mac_key, _HEADER.pack(ledger_id, entry_id, lac), hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    @staticmethod
    def _sign_none(ledger_id: int, entry_id: int, lac: int, payload: bytes) -> bytes:
        return b""

    def verify(self, entry) -> bool:
        """verify returns True when `entry.digest` matches the entry's other fields."""
        expected = self.sign(entry.ledger_id, entry.entry_id, entry.lac, entry.payload)
        return hmac.compare_digest(expected, entry.digest)

    def verify_many(self, entries) -> list[bool]:
        """verify_many is `verify` for a batch of entries, in one pass for crc32c (a checksum, not a secret)."""
        if self.kind != "crc32c":
            return [self.verify(entry) for entry in entries]
        pack, from_bytes = _HEADER.pack, int.from_bytes
        return [len(e.digest) == 4 and _crc(e.payload, _crc(pack(e.ledger_id, e.entry_id, e.lac))) == from_bytes(e.digest)
                for e in entries]
