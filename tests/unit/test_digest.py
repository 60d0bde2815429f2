"""Entry digests and master keys (docs/internals/protocol.md#entries-and-digests; walkit.core.digest)."""

from __future__ import annotations

import pytest

from walkit.core.digest import DIGEST_TYPES, Digest, master_key, password_check
from walkit.errors import ConfigError

from .helpers import make_entry

SIGNED_TYPES = ("crc32c", "hmac-sha256")


def entry_for(digest: Digest):
    """entry_for returns entry 3 of ledger 7 (LAC 2) signed by `digest`."""
    return make_entry(3, b"payload", lac=2, digest=digest)


@pytest.mark.parametrize("kind, size", [("crc32c", 4), ("hmac-sha256", 32)])
def test_sign_returns_digest_of_the_type_size(kind, size):
    assert len(entry_for(Digest(kind, b"pw")).digest) == size


@pytest.mark.parametrize("kind", DIGEST_TYPES)
def test_verify_accepts_an_entry_it_signed(kind):
    digest = Digest(kind, b"pw")
    assert digest.verify(entry_for(digest))


@pytest.mark.parametrize("kind", SIGNED_TYPES)
@pytest.mark.parametrize("field, value", [
    ("payload", b"payloaD"), ("entry_id", 4), ("ledger_id", 8), ("lac", 1), ("payload", b""),
])
def test_verify_rejects_a_changed_field(kind, field, value):
    digest = Digest(kind, b"pw")
    assert not digest.verify(entry_for(digest)._replace(**{field: value}))


@pytest.mark.parametrize("kind", SIGNED_TYPES)
def test_verify_rejects_a_changed_digest(kind):
    digest = Digest(kind, b"pw")
    entry = entry_for(digest)
    flipped = bytes([entry.digest[0] ^ 1]) + entry.digest[1:]
    assert not digest.verify(entry._replace(digest=flipped))


def test_crc32c_does_not_depend_on_the_password():
    assert entry_for(Digest("crc32c", b"a")).digest == entry_for(Digest("crc32c", b"b")).digest


def test_hmac_depends_on_the_password():
    signed = entry_for(Digest("hmac-sha256", b"right"))
    assert not Digest("hmac-sha256", b"wrong").verify(signed)
    assert Digest("hmac-sha256", b"right").verify(signed)


def test_none_digest_is_empty_and_ignores_the_content():
    digest = Digest("none")
    entry = entry_for(digest)
    assert entry.digest == b""
    assert digest.verify(entry._replace(payload=b"anything", entry_id=99))


def test_none_digest_rejects_an_entry_carrying_a_digest():
    digest = Digest("none")
    assert not digest.verify(entry_for(digest)._replace(digest=b"\x00\x00\x00\x00"))


@pytest.mark.parametrize("kind", ["md5", "CRC32C", ""])
def test_unknown_digest_type_is_a_config_error(kind):
    with pytest.raises(ConfigError, match="unknown digest type"):
        Digest(kind)


def test_master_key_is_a_32_byte_hash_that_depends_on_the_password():
    assert len(master_key(b"pw")) == 32
    assert master_key(b"pw") == master_key(b"pw")
    assert master_key(b"pw") != master_key(b"pW")
    assert b"pw" not in master_key(b"pw")


def test_password_check_differs_per_password_and_hides_the_master_key():
    assert password_check(b"pw") == password_check(b"pw")
    assert password_check(b"pw") != password_check(b"other")
    assert master_key(b"pw").hex() not in password_check(b"pw")


@pytest.mark.parametrize("kind", DIGEST_TYPES)
def test_verify_many_agrees_with_verify_on_good_and_damaged_entries(kind):
    digest = Digest(kind, b"pw")
    good = entry_for(digest)
    entries = [good, good._replace(payload=b"payloaD"), good._replace(entry_id=4), good._replace(lac=1),
               good._replace(digest=good.digest[:-1]), good._replace(digest=b""), good._replace(digest=good.digest + b"x")]
    assert digest.verify_many(entries) == [digest.verify(e) for e in entries]
    assert digest.verify_many(entries)[0]
