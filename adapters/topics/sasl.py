"""walkit.adapters.topics.sasl authenticates Kafka connections with SASL/PLAIN, as Kafka's broker does.

`Users` holds the accepted user names and passwords (keyed digests only, compared in
constant time); `Users.parse` reads `user:password` lines or the `user_NAME="PASSWORD"`
entries of a Kafka JAAS file. `SaslGate` is one connection's authentication, without I/O:
the server feeds it every frame until it says the connection is authenticated, and sends
what it answers. It follows Kafka's SaslServerAuthenticator (KIP-43, KIP-152):

- before the handshake only ApiVersions (any number of times) and SaslHandshake are
  served; SaslHandshake names the mechanism (PLAIN only; another is answered
  UNSUPPORTED_SASL_MECHANISM with the list, then the connection closes);
- after SaslHandshake v1 the client sends SaslAuthenticate (v0-v2) carrying the PLAIN token
  (RFC 4616: authzid NUL user NUL password). Success is answered with empty auth bytes and
  session lifetime 0 (no re-authentication needed); failure with SASL_AUTHENTICATION_FAILED
  and Kafka's message ("Authentication failed: Invalid username or password"), after
  FAILED_AUTHENTICATION_DELAY, then the connection closes;
- after SaslHandshake v0 the next frame is the bare token (a size prefix and the bytes, no
  Kafka header); success is answered with an empty size-prefixed frame, failure closes;
- any other frame before authentication (another request type, a malformed one, a frame
  above MAX_UNAUTHENTICATED_FRAME) closes the connection without an answer, as Kafka does.

Passwords never leave this module: log lines name the user only when it exists.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass

from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
)

from walkit.adapters.topics import errors
from walkit.adapters.topics.wire import BadRequest, Request, api_versions_error, parse_request

PLAIN = "PLAIN"
MECHANISMS = [PLAIN]
#: Kafka's sasl.server.max.receive.size: the largest frame a connection may send before it authenticates.
MAX_UNAUTHENTICATED_FRAME = 524288
#: Kafka's connections.failed.authentication.delay.ms: a failed authentication is answered this late.
FAILED_AUTHENTICATION_DELAY = 0.1
#: Kafka's PlainSaslServer message for an unknown user or a wrong password (the same, on purpose).
INVALID_CREDENTIALS = "Authentication failed: Invalid username or password"
#: An empty size-prefixed frame: the answer to an accepted bare (SaslHandshake v0) token.
EMPTY_TOKEN = b"\x00\x00\x00\x00"

_JAAS_USER = re.compile(r'\buser_([^\s="]+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class BadUsers(ValueError):
    """BadUsers is a users file or option that cannot be read (its message says which line, never a password)."""


class Users:
    """Users are the user names and passwords a SASL/PLAIN broker accepts.

    Only an HMAC of each password, under a key made at start, is kept; `check` compares
    such digests with hmac.compare_digest, and an unknown user is compared against a decoy
    digest, so the time taken says nothing about the password or whether the user exists.
    """

    def __init__(self, passwords: dict[str, str]) -> None:
        self._key = secrets.token_bytes(32)
        self._digests = {}
        for name, password in passwords.items():
            if not name or not password:
                raise BadUsers("user names and passwords must not be empty")
            self._digests[name] = self._digest(password.encode("utf-8"))
        self._decoy = self._digest(secrets.token_bytes(16))

    def _digest(self, password: bytes) -> bytes:
        return hmac.new(self._key, password, hashlib.sha256).digest()

    @property
    def names(self) -> list[str]:
        """names are the user names, sorted."""
        return sorted(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def __contains__(self, name: object) -> bool:
        return name in self._digests

    def __repr__(self) -> str:
        return f"Users({', '.join(self.names)})"

    def check(self, name: str, password: bytes) -> bool:
        """check tells whether `password` (UTF-8 bytes) is `name`'s, in time independent of both."""
        expected = self._digests.get(name, self._decoy)
        matches = hmac.compare_digest(self._digest(password), expected)
        return matches and name in self._digests

    @staticmethod
    def parse(text: str, source: str = "users") -> dict[str, str]:
        """parse reads `user:password` lines (# comments, blank lines) or a JAAS file's `user_NAME="PASSWORD"`.

        A JAAS file is recognised by `PlainLoginModule` or a `user_NAME=` entry; only its
        user_ entries are read (`username`/`password` are a Kafka broker's own credentials
        for other brokers, which walkit brokers do not need). In a line the user name ends
        at the first ':', so a password may contain ':'.
        """
        if "PlainLoginModule" in text or _JAAS_USER.search(text):
            found = {name: re.sub(r"\\(.)", r"\1", quoted) for name, quoted in _JAAS_USER.findall(text)}
            if not found:
                raise BadUsers(f"{source}: a JAAS file without user_NAME=\"PASSWORD\" entries")
            return found
        found = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, password = line.partition(":")
            if not sep or not name.strip() or not password:
                raise BadUsers(f"{source} line {number}: expected USER:PASSWORD")
            found[name.strip()] = password
        return found

    @classmethod
    def load(cls, path: str | None = None, pairs: tuple[str, ...] = ()) -> "Users":
        """load reads a users file (Users.parse) and adds NAME:PASSWORD `pairs` (a pair wins over the file)."""
        passwords = {}
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    passwords.update(cls.parse(f.read(), source=path))
            except OSError as exc:
                raise BadUsers(f"cannot read the users file {path}: {exc.strerror}") from None
        for number, pair in enumerate(pairs, 1):
            name, sep, password = pair.partition(":")
            if not sep or not name or not password:
                raise BadUsers(f"user {number} of --sasl-user: expected NAME:PASSWORD")
            passwords[name] = password
        if not passwords:
            raise BadUsers("SASL is on but no user was given")
        return cls(passwords)


def file_is_private(path: str) -> bool:
    """file_is_private tells whether only the owner may read `path` (mode 0600 or stricter)."""
    return os.stat(path).st_mode & 0o077 == 0


def check_plain(users: Users, token: bytes) -> tuple[str | None, str, str]:
    """check_plain checks a PLAIN token: (the user or None, the message for the client, the reason to log).

    The messages are those of Kafka's PlainSaslServer, so clients print what they would
    print for Kafka; the reason adds what an operator needs and never the password.
    """
    parts = token.split(b"\x00")
    if len(parts) != 3:
        message = f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}"
        return None, message, message
    try:
        authzid, name, password = parts[0].decode("utf-8"), parts[1].decode("utf-8"), parts[2]
    except UnicodeDecodeError:
        return None, "Invalid SASL/PLAIN response: not UTF-8", "a PLAIN token that is not UTF-8"
    if not name:
        return None, "Authentication failed: username not specified", "no user name"
    if not password:
        return None, "Authentication failed: password not specified", "no password"
    if not users.check(name, password):
        reason = f"wrong password for user {name!r}" if name in users else "an unknown user"
        return None, INVALID_CREDENTIALS, reason
    if authzid and authzid != name:
        message = "Authentication failed: Client requested an authorization id that is different from username"
        return None, message, f"user {name!r} asked for another authorization id"
    return name, "", ""


@dataclass(frozen=True)
class Reply:
    """Reply is the gate's answer to a frame: bytes to send (or none), then maybe close.

    `close` is the reason to close the connection once `answer` is sent (None: stay open);
    `delay` is how long to wait before sending it (failed authentications).
    """

    answer: bytes | None = None
    close: str | None = None
    delay: float = 0.0


class SaslGate:
    """SaslGate is one connection's SASL/PLAIN authentication (see the module doc).

    `receive(frame)` takes each frame body (without its size prefix) in arrival order and
    returns either a Request the server serves as usual (ApiVersions) or a Reply. Once
    `user` is set, the connection is authenticated and the gate is done with.
    """

    def __init__(self, users: Users) -> None:
        self.users = users
        self.state = "handshake"          # handshake -> authenticate (v1) | token (v0) -> done | failed
        self.user: str | None = None

    def receive(self, frame: bytes) -> Request | Reply:
        """receive handles one frame before authentication."""
        assert self.state not in ("done", "failed"), f"a frame after authentication {self.state}"
        if self.state == "token":
            return self._token(frame, None)
        try:
            request = parse_request(frame)
        except BadRequest as exc:
            answer = api_versions_error(frame)
            if answer is not None:
                return Reply(answer)
            return self._fail(f"before authentication: {exc}")
        api_key = request.api_key
        if self.state == "handshake" and api_key == ApiVersionsRequest.API_KEY:
            return request
        if self.state == "handshake" and api_key == SaslHandshakeRequest.API_KEY:
            return self._handshake(request)
        if self.state == "authenticate" and api_key == SaslAuthenticateRequest.API_KEY:
            return self._token(request.body.auth_bytes or b"", request)
        name = type(request.body).__name__
        return self._fail(f"{name} before authentication (SASL state {self.state})")

    def _fail(self, reason: str, answer: bytes | None = None, delay: float = 0.0) -> Reply:
        self.state = "failed"
        return Reply(answer, close=reason, delay=delay)

    def _handshake(self, request: Request) -> Reply:
        mechanism = request.body.mechanism
        if mechanism != PLAIN:
            answer = request.response(SaslHandshakeResponse, error_code=errors.UNSUPPORTED_SASL_MECHANISM,
                                      mechanisms=MECHANISMS)
            return self._fail(f"unsupported SASL mechanism {str(mechanism)[:40]!r}", answer)
        self.state = "authenticate" if request.version >= 1 else "token"
        return Reply(request.response(SaslHandshakeResponse, error_code=errors.NONE, mechanisms=MECHANISMS))

    def _token(self, token: bytes, request: Request | None) -> Reply:
        """_token checks a PLAIN token, framed in SaslAuthenticate (`request`) or bare (None)."""
        user, message, reason = check_plain(self.users, token)
        if user is None:
            answer = None
            if request is not None:
                answer = request.response(SaslAuthenticateResponse, error_code=errors.SASL_AUTHENTICATION_FAILED,
                                          error_message=message, auth_bytes=b"", session_lifetime_ms=0)
            return self._fail(f"authentication failed: {reason}", answer, FAILED_AUTHENTICATION_DELAY)
        self.state, self.user = "done", user
        if request is None:
            return Reply(EMPTY_TOKEN)
        return Reply(request.response(SaslAuthenticateResponse, error_code=errors.NONE, error_message=None,
                                      auth_bytes=b"", session_lifetime_ms=0))
