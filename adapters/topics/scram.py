"""walkit.adapters.topics.scram is SASL SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), server side, without I/O.

    credential = Credential.derive("SCRAM-SHA-256", b"password")     # what the users file keeps
    exchange = ScramExchange(lookup, "SCRAM-SHA-256", decoy_key)
    exchange.receive(client_first)      # -> Step(challenge=server-first)
    exchange.receive(client_final)      # -> Step(challenge=server-final, user="alice") or a refusal

A Credential is what the broker keeps of a password: salt, iterations, StoredKey and ServerKey,
never the password or the SaltedPassword, as Kafka's ScramCredential. `Credential.line` and
`parse_line` write and read it as one line of a users file::

    SCRAM-SHA-256 alice 4096 <salt> <StoredKey> <ServerKey>        (base64, no ':' anywhere)

The exchange follows Kafka's ScramSaslServer: the client-first message takes the GS2 header
``n,,`` or ``y,,`` (no channel binding: ``p=`` is refused) with an optional ``a=`` authzid that
must name the user, and no extensions (Kafka's ``tokenauth`` delegation tokens are refused); the
client-final message must repeat the header's base64 (``c=biws`` for ``n,,``) and end with the
full nonce (Kafka checks `endsWith`, not equality: librdkafka 2.0.2, which Debian's kcat uses,
sends its own nonce again in front of it);
the proof is checked against StoredKey with hmac.compare_digest. An unknown user gets a
server-first message with a salt derived from its name under `decoy_key` (the same on every
attempt) and fails at the proof, so the answers do not tell which users exist.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Callable

#: SCRAM's hash per mechanism name (Kafka's ScramMechanism).
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Kafka's minimum (and walkit's default) PBKDF2 iterations for both mechanisms.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
#: Kafka's ScramSaslServer message for a wrong password or an unknown user (the same, on purpose).
INVALID_CREDENTIALS = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"


class BadCredential(ValueError):
    """BadCredential is a SCRAM line of a users file that cannot be read (its message never quotes a key)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class Credential:
    """Credential is a user's SCRAM credential for one mechanism (see the module doc)."""

    mechanism: str
    salt: bytes = field(repr=False)
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    @classmethod
    def derive(cls, mechanism: str, password: bytes, *, salt: bytes | None = None,
               iterations: int = MIN_ITERATIONS) -> "Credential":
        """derive computes the credential of `password` (UTF-8 bytes) with a new random salt unless given."""
        name = HASHES[mechanism]
        salt = salt if salt is not None else secrets.token_bytes(32)
        salted = hashlib.pbkdf2_hmac(name, password, salt, iterations)
        client_key = hmac.new(salted, b"Client Key", name).digest()
        server_key = hmac.new(salted, b"Server Key", name).digest()
        return cls(mechanism, salt, iterations, hashlib.new(name, client_key).digest(), server_key)

    def matches(self, password: bytes) -> bool:
        """matches tells whether `password` is the one this credential was derived from (a PLAIN login)."""
        again = Credential.derive(self.mechanism, password, salt=self.salt, iterations=self.iterations)
        return hmac.compare_digest(again.stored_key, self.stored_key)

    def line(self, user: str) -> str:
        """line is this credential as a users file line (the module doc's format)."""
        return (f"{self.mechanism} {user} {self.iterations} {_b64(self.salt)} {_b64(self.stored_key)} "
                f"{_b64(self.server_key)}")


def is_credential_line(line: str) -> bool:
    """is_credential_line tells a SCRAM line of a users file (no ':') from a USER:PASSWORD one."""
    return line.startswith("SCRAM-SHA-") and ":" not in line


def parse_line(line: str, where: str) -> tuple[str, Credential]:
    """parse_line reads a users file's SCRAM line: (user, credential); BadCredential names `where`."""
    words = line.split()
    if len(words) != 6 or words[0] not in HASHES:
        raise BadCredential(f"{where}: expected MECHANISM USER ITERATIONS SALT STORED_KEY SERVER_KEY, "
                            f"MECHANISM one of {', '.join(HASHES)}")
    mechanism, user, iterations = words[0], words[1], words[2]
    if not iterations.isdigit() or not MIN_ITERATIONS <= int(iterations) <= MAX_ITERATIONS:
        raise BadCredential(f"{where}: iterations must be {MIN_ITERATIONS}-{MAX_ITERATIONS}")
    try:
        salt, stored, server = (base64.b64decode(word, validate=True) for word in words[3:])
    except (binascii.Error, ValueError):
        raise BadCredential(f"{where}: the salt and keys must be base64") from None
    size = hashlib.new(HASHES[mechanism]).digest_size
    if not salt or len(stored) != size or len(server) != size:
        raise BadCredential(f"{where}: the keys of {mechanism} are {size} bytes and the salt is not empty")
    return user, Credential(mechanism, salt, int(iterations), stored, server)


@dataclass(frozen=True)
class Step:
    """Step is the answer to one client message: the challenge to send, and whether the exchange ended.

    `user` is set once the client proved its password; `failure` (the reason to log) once it
    failed, with `message` for the client.
    """

    challenge: bytes = b""
    user: str | None = None
    failure: str | None = None
    message: str = ""


class ScramExchange:
    """ScramExchange is one connection's SCRAM exchange (see the module doc).

    `lookup(user, mechanism)` returns the user's Credential or None; `decoy_key` keys the
    salts made up for unknown users; `server_nonce` makes the server's part of the nonce
    (printable, no ','; a test passes RFC 7677's).
    """

    def __init__(self, lookup: Callable[[str, str], Credential | None], mechanism: str, decoy_key: bytes, *,
                 server_nonce: Callable[[], bytes] = lambda: _b64(secrets.token_bytes(24)).encode("ascii")) -> None:
        self.mechanism = mechanism
        self._server_nonce = server_nonce
        self._hash = HASHES[mechanism]
        self._lookup = lookup
        self._decoy_key = decoy_key
        self._state = "first"           # first -> final -> done
        self._user = ""
        self._credential: Credential | None = None
        self._header = b""
        self._nonce = b""
        self._first_bare = b""
        self._server_first = b""

    def receive(self, message: bytes) -> Step:
        """receive takes the client's next message (client-first, then client-final)."""
        if self._state == "first":
            return self._first(message)
        if self._state == "final":
            return self._final(message)
        return self._refuse("a SCRAM message after the exchange ended")

    def _refuse(self, reason: str) -> Step:
        self._state = "done"
        return Step(failure=reason, message=INVALID_CREDENTIALS.format(self.mechanism))

    def _invalid(self, reason: str) -> Step:
        self._state = "done"
        return Step(failure=reason, message=f"Invalid SCRAM message: {reason}")

    def _first(self, message: bytes) -> Step:
        parts = message.split(b",", 2)
        if len(parts) != 3 or parts[0] not in (b"n", b"y"):
            if parts[0].startswith(b"p="):
                return self._invalid("channel binding is not supported")
            return self._invalid("the client-first message has no GS2 header n,, or y,,")
        authzid, bare = parts[1], parts[2]
        attributes = _attributes(bare)
        if attributes is None or list(attributes)[:2] != [b"n", b"r"] or not attributes[b"r"]:
            return self._invalid("the client-first message is not n=USER,r=NONCE")
        if len(attributes) > 2:
            return self._invalid("SCRAM extensions (delegation tokens) are not supported")
        user = _sasl_name(attributes[b"n"])
        if user is None or not attributes[b"r"].isascii() or b"," in attributes[b"r"]:
            return self._invalid("the user name or nonce is malformed")
        if authzid and (not authzid.startswith(b"a=") or _sasl_name(authzid[2:]) != user):
            return self._invalid("the authorization id is not the user name")
        self._user, self._header, self._first_bare = user, parts[0] + b"," + authzid + b",", bare
        self._credential = self._lookup(user, self.mechanism)
        salt, iterations = self._salt()
        self._nonce = attributes[b"r"] + self._server_nonce()
        self._server_first = b"r=" + self._nonce + b",s=" + _b64(salt).encode("ascii") + b",i=%d" % iterations
        self._state = "final"
        return Step(challenge=self._server_first)

    def _salt(self) -> tuple[bytes, int]:
        if self._credential is not None:
            return self._credential.salt, self._credential.iterations
        decoy = hmac.new(self._decoy_key, f"{self.mechanism} {self._user}".encode("utf-8"), "sha256").digest()
        return decoy, MIN_ITERATIONS

    def _final(self, message: bytes) -> Step:
        without_proof, sep, proof = message.rpartition(b",p=")
        attributes = _attributes(without_proof) if sep else None
        if attributes is None or list(attributes) != [b"c", b"r"]:
            return self._invalid("the client-final message is not c=BINDING,r=NONCE,p=PROOF")
        if not hmac.compare_digest(attributes[b"c"], base64.b64encode(self._header)):
            return self._invalid("the channel binding does not repeat the GS2 header")
        given = attributes[b"r"]
        if not hmac.compare_digest(given[len(given) - len(self._nonce):], self._nonce):
            return self._invalid("the nonce is not the one of this exchange")
        try:
            client_proof = base64.b64decode(proof, validate=True)
        except (binascii.Error, ValueError):
            return self._invalid("the proof is not base64")
        auth_message = self._first_bare + b"," + self._server_first + b"," + without_proof
        credential = self._credential
        stored_key = credential.stored_key if credential is not None else bytes(hashlib.new(self._hash).digest_size)
        signature = hmac.new(stored_key, auth_message, self._hash).digest()
        client_key = bytes(a ^ b for a, b in zip(client_proof, signature)) if len(client_proof) == len(signature) \
            else b""
        proved = hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), stored_key)
        if credential is None:
            return self._refuse("an unknown user")
        if not proved:
            return self._refuse(f"wrong password for user {self._user!r}")
        self._state = "done"
        server_signature = hmac.new(credential.server_key, auth_message, self._hash).digest()
        return Step(challenge=b"v=" + _b64(server_signature).encode("ascii"), user=self._user)


def _attributes(text: bytes) -> dict[bytes, bytes] | None:
    """_attributes splits `a=x,b=y` into an ordered dict (None if malformed or a name repeats)."""
    found: dict[bytes, bytes] = {}
    for part in text.split(b","):
        name, sep, value = part.partition(b"=")
        if not sep or len(name) != 1 or name in found:
            return None
        found[name] = value
    return found


def _sasl_name(raw: bytes) -> str | None:
    """_sasl_name decodes RFC 5802's saslname (=2C is ',', =3D is '='); None if malformed or empty."""
    if raw.replace(b"=2C", b"").replace(b"=3D", b"").count(b"=") or not raw:
        return None
    try:
        return raw.replace(b"=2C", b",").replace(b"=3D", b"=").decode("utf-8")
    except UnicodeDecodeError:
        return None
