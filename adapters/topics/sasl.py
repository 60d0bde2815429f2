"""walkit.adapters.topics.sasl authenticates Kafka connections with SASL PLAIN and SCRAM, as Kafka's broker does.

`Users` holds the accepted user names and credentials (keyed digests and SCRAM credentials
only, compared in constant time); `Users.parse` reads `user:password` lines or the
`user_NAME="PASSWORD"` entries of a Kafka JAAS file, `Users.parse_credentials` the salted
SCRAM lines `walkit topics users add` writes (scram.py). `SaslGate` is one connection's authentication, without I/O:
the server feeds it every frame until it says the connection is authenticated, and sends
what it answers. It follows Kafka's SaslServerAuthenticator (KIP-43, KIP-152):

- before the handshake only ApiVersions (any number of times) and SaslHandshake are
  served; SaslHandshake names the mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; another
  is answered UNSUPPORTED_SASL_MECHANISM with the list, then the connection closes);
- after SaslHandshake v1 the client sends SaslAuthenticate (v0-v2) carrying the PLAIN token
  (RFC 4616: authzid NUL user NUL password), or SCRAM's two client messages, one per
  SaslAuthenticate, each answered with the server's in auth bytes (scram.ScramExchange). Success is answered with empty auth bytes and
  session lifetime 0 (no re-authentication needed); failure with SASL_AUTHENTICATION_FAILED
  and Kafka's message ("Authentication failed: Invalid username or password"), after
  FAILED_AUTHENTICATION_DELAY, then the connection closes;
- after SaslHandshake v0 the next frame is the bare token (a size prefix and the bytes, no
  Kafka header); success is answered with an empty size-prefixed frame (SCRAM: the server's
  message, size-prefixed), failure closes;
- any other frame before authentication (another request type, a malformed one, a frame
  above MAX_UNAUTHENTICATED_FRAME) closes the connection without an answer, as Kafka does.

Passwords never leave this module: log lines name the user only when it exists.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass

from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
)

from walkit.adapters.topics import errors
from walkit.adapters.topics.scram import (
    HASHES, BadCredential, Credential, ScramExchange, is_credential_line, parse_line,
)
from walkit.adapters.topics.wire import BadRequest, Request, api_versions_error, parse_request

PLAIN = "PLAIN"
MECHANISMS = [PLAIN, *HASHES]
#: Kafka's sasl.server.max.receive.size: the largest frame a connection may send before it authenticates.
MAX_UNAUTHENTICATED_FRAME = 524288
#: Kafka's connections.failed.authentication.delay.ms: a failed authentication is answered this late.
FAILED_AUTHENTICATION_DELAY = 0.1
#: Kafka's PlainSaslServer message for an unknown user or a wrong password (the same, on purpose).
INVALID_CREDENTIALS = "Authentication failed: Invalid username or password"

log = logging.getLogger("walkit.adapters.topics")
_JAAS_USER = re.compile(r'\buser_([^\s="]+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class BadUsers(ValueError):
    """BadUsers is a users file or option that cannot be read (its message says which line, never a password)."""


class Users:
    """Users are the user names and credentials a SASL broker accepts.

    `passwords` are users given with their password (USER:PASSWORD lines, --sasl-user): only an
    HMAC of each, under a key made at start, is kept for PLAIN, and SCRAM credentials are
    derived from it with a new salt. `credentials` are SCRAM credentials of a users file
    (scram.py: salted, written by `walkit topics users add`); a PLAIN login of such a user is
    checked against them. `check` compares in constant time, and an unknown user against a
    decoy, so the time taken says nothing about the password or whether the user exists.
    """

    def __init__(self, passwords: dict[str, str], credentials: dict[tuple[str, str], Credential] | None = None) -> None:
        self._key = secrets.token_bytes(32)
        self.decoy_key = secrets.token_bytes(32)             # the salts of unknown users' SCRAM exchanges
        self._digests = {}
        self._credentials = dict(credentials or {})
        for name, password in passwords.items():
            if not name or not password:
                raise BadUsers("user names and passwords must not be empty")
            self._digests[name] = self._digest(password.encode("utf-8"))
            for mechanism in HASHES:
                self._credentials[name, mechanism] = Credential.derive(mechanism, password.encode("utf-8"))
        self._decoy = self._digest(secrets.token_bytes(16))
        self._names = set(self._digests) | {name for name, _ in self._credentials}

    def _digest(self, password: bytes) -> bytes:
        return hmac.new(self._key, password, hashlib.sha256).digest()

    @property
    def names(self) -> list[str]:
        """names are the user names, sorted."""
        return sorted(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __repr__(self) -> str:
        return f"Users({', '.join(self.names)})"

    def check(self, name: str, password: bytes) -> bool:
        """check tells whether `password` (UTF-8 bytes) is `name`'s, in time independent of both
        (for a user known by its SCRAM credentials only: the time of one PBKDF2)."""
        if name not in self._digests:
            stored = [c for (user, _), c in self._credentials.items() if user == name]
            if stored:
                return stored[0].matches(password)
        expected = self._digests.get(name, self._decoy)
        matches = hmac.compare_digest(self._digest(password), expected)
        return matches and name in self._digests

    def current(self) -> "Users":
        """current is these users (a UsersFile's `current` may be newer)."""
        return self

    def credential(self, name: str, mechanism: str) -> Credential | None:
        """credential is `name`'s SCRAM credential for `mechanism`, None if it has none."""
        return self._credentials.get((name, mechanism))

    @staticmethod
    def parse(text: str, source: str = "users") -> dict[str, str]:
        """parse reads `user:password` lines (# comments, blank lines) or a JAAS file's `user_NAME="PASSWORD"`.

        A JAAS file is recognised by `PlainLoginModule` or a `user_NAME=` entry; only its
        user_ entries are read (`username`/`password` are a Kafka broker's own credentials
        for other brokers, which walkit brokers do not need). In a line the user name ends
        at the first ':', so a password may contain ':'. SCRAM credential lines are skipped
        here (parse_credentials reads them).
        """
        if "PlainLoginModule" in text or _JAAS_USER.search(text):
            found = {name: re.sub(r"\\(.)", r"\1", quoted) for name, quoted in _JAAS_USER.findall(text)}
            if not found:
                raise BadUsers(f"{source}: a JAAS file without user_NAME=\"PASSWORD\" entries")
            return found
        found = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#") or is_credential_line(line):
                continue
            name, sep, password = line.partition(":")
            if not sep or not name.strip() or not password:
                raise BadUsers(f"{source} line {number}: expected USER:PASSWORD")
            found[name.strip()] = password
        return found

    @staticmethod
    def parse_credentials(text: str, source: str = "users") -> dict[tuple[str, str], Credential]:
        """parse_credentials reads the SCRAM credential lines of a users file (scram.parse_line)."""
        found = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if is_credential_line(line):
                try:
                    user, credential = parse_line(line, f"{source} line {number}")
                except BadCredential as exc:
                    raise BadUsers(str(exc)) from None
                found[user, credential.mechanism] = credential
        return found

    @classmethod
    def load(cls, path: str | None = None, pairs: tuple[str, ...] = ()) -> "Users":
        """load reads a users file (Users.parse, Users.parse_credentials) and adds NAME:PASSWORD `pairs`
        (a pair wins over the file)."""
        passwords, credentials = {}, {}
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as exc:
                raise BadUsers(f"cannot read the users file {path}: {exc.strerror}") from None
            passwords.update(cls.parse(text, source=path))
            if "PlainLoginModule" not in text and not _JAAS_USER.search(text):
                credentials = cls.parse_credentials(text, source=path)
        for number, pair in enumerate(pairs, 1):
            name, sep, password = pair.partition(":")
            if not sep or not name or not password:
                raise BadUsers(f"user {number} of --sasl-user: expected NAME:PASSWORD")
            passwords[name] = password
        if not passwords and not credentials:
            raise BadUsers("SASL is on but no user was given")
        credentials = {key: value for key, value in credentials.items() if key[0] not in passwords}
        return cls(passwords, credentials)


class UsersFile:
    """UsersFile is the users of a users file (and --sasl-user `pairs`), read again when the file changes.

    `current()` is what a new connection authenticates against: at most every CHECK_EVERY_S it
    stats the file, and loads it again if its size, time or inode changed. A file that cannot
    be read or parsed then is logged and the users before it stay. Connections that logged in
    already stay logged in (Kafka's brokers, without re-authentication, do the same).
    """

    CHECK_EVERY_S = 1.0

    def __init__(self, path: str, pairs: tuple[str, ...] = ()) -> None:
        self.path, self.pairs = path, pairs
        self._stamp = self._stat()
        self._users = Users.load(path, pairs)
        self._checked = time.monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            found = os.stat(self.path)
        except OSError:
            return None
        return found.st_mtime_ns, found.st_size, found.st_ino

    def current(self) -> Users:
        """current is the users as the file holds them now (see the class doc)."""
        now = time.monotonic()
        if now - self._checked >= self.CHECK_EVERY_S:
            self._checked = now
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._users = Users.load(self.path, self.pairs)
                    log.info("read the SASL users file %s again: users %s", self.path, ", ".join(self._users.names))
                except BadUsers as exc:
                    log.warning("the SASL users file changed and cannot be used, the users before stay: %s", exc)
        return self._users

    @property
    def names(self) -> list[str]:
        """names are the current users' names, sorted."""
        return self.current().names


def _names_user(line: str, user: str) -> bool:
    """_names_user tells whether a users file line (USER:PASSWORD or SCRAM) is `user`'s."""
    line = line.strip()
    if is_credential_line(line):
        words = line.split()
        return len(words) > 1 and words[1] == user
    return line.partition(":")[0].strip() == user and not line.startswith("#")


def edit_users_file(path: str, user: str, password: str | None, mechanisms=tuple(HASHES)) -> bool:
    """edit_users_file replaces `user`'s lines of the users file `path` with SCRAM credentials of
    `password` for `mechanisms` (None: removes them). The file is written whole (mode 0600, then
    renamed into place); it returns whether the user had lines before."""
    if not user or any(c.isspace() or c == ":" for c in user):
        raise BadUsers("a user name is not empty and has no spaces or ':'")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        lines = []
    if "PlainLoginModule" in "\n".join(lines) or any(_JAAS_USER.search(line) for line in lines):
        raise BadUsers(f"{path} is a JAAS file: edit it by hand, or keep SCRAM users in a file of their own")
    kept = [line for line in lines if not _names_user(line, user)]
    had = len(kept) < len(lines)
    if password is not None:
        if not password:
            raise BadUsers("the password is empty")
        kept += [Credential.derive(m, password.encode("utf-8")).line(user) for m in mechanisms]
    temporary = f"{path}.{secrets.token_hex(4)}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in kept))
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return had


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
    """SaslGate is one connection's SASL authentication (see the module doc).

    `receive(frame)` takes each frame body (without its size prefix) in arrival order and
    returns either a Request the server serves as usual (ApiVersions) or a Reply. Once
    `user` is set, the connection is authenticated and the gate is done with.
    """

    def __init__(self, users: Users) -> None:
        self.users = users
        self.state = "handshake"          # handshake -> authenticate (v1) | token (v0) -> done | failed
        self.user: str | None = None
        self.scram: ScramExchange | None = None     # the SCRAM exchange, if the handshake chose SCRAM

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
        if mechanism not in MECHANISMS:
            answer = request.response(SaslHandshakeResponse, error_code=errors.UNSUPPORTED_SASL_MECHANISM,
                                      mechanisms=MECHANISMS)
            return self._fail(f"unsupported SASL mechanism {str(mechanism)[:40]!r}", answer)
        self.state = "authenticate" if request.version >= 1 else "token"
        if mechanism != PLAIN:
            self.scram = ScramExchange(self.users.credential, mechanism, self.users.decoy_key)
        return Reply(request.response(SaslHandshakeResponse, error_code=errors.NONE, mechanisms=MECHANISMS))

    def _token(self, token: bytes, request: Request | None) -> Reply:
        """_token checks a PLAIN token or takes a SCRAM message, framed in SaslAuthenticate (`request`) or bare (None)."""
        challenge = b""
        if self.scram is not None:
            step = self.scram.receive(token)
            user, message, reason, challenge = step.user, step.message, step.failure, step.challenge
            if user is None and reason is None:                 # server-first: the exchange goes on
                if request is None:
                    return Reply(len(challenge).to_bytes(4, "big") + challenge)
                return Reply(request.response(SaslAuthenticateResponse, error_code=errors.NONE, error_message=None,
                                              auth_bytes=challenge, session_lifetime_ms=0))
        else:
            user, message, reason = check_plain(self.users, token)
        if user is None:
            answer = None
            if request is not None:
                answer = request.response(SaslAuthenticateResponse, error_code=errors.SASL_AUTHENTICATION_FAILED,
                                          error_message=message, auth_bytes=b"", session_lifetime_ms=0)
            return self._fail(f"authentication failed: {reason}", answer, FAILED_AUTHENTICATION_DELAY)
        self.state, self.user = "done", user
        if request is None:
            return Reply(len(challenge).to_bytes(4, "big") + challenge)
        return Reply(request.response(SaslAuthenticateResponse, error_code=errors.NONE, error_message=None,
                                      auth_bytes=challenge, session_lifetime_ms=0))
