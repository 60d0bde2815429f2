"""walkit.adapters.kv.auth is who may use a `walkit kv serve`: Redis' requirepass and ACL users.

    users = Users.configure(requirepass="s3cret", users=[("alice", "pw")], acl_text=None)
    users.required                            # True: connections start unauthenticated
    users.authenticate(b"alice", b"pw")       # "alice"; None for wrong credentials

As in redis-server 7, the user `default` is the one a connection starts as and the one
``AUTH password`` names; ``AUTH user password`` and ``HELLO 3 AUTH user password`` name any
user. Without any setting, `default` takes no password (``on nopass``) and every connection is
authenticated from the start. `requirepass` gives it a password. One difference from Redis, on
purpose: when users are configured and `default` is not (neither requirepass nor a ``user
default`` line), `default` is off, so a server given users never serves anonymous
connections; a ``user default on nopass`` line brings them back.

The ACL file takes lines ``user NAME RULE...`` (split like redis-server's, so quotes work;
blank lines and, unlike Redis, ``#`` comment lines are skipped). Rules:

- ``on``, ``off``: the user may log in, or not (a user starts off, as in Redis);
- ``>password``, ``<password``: add or remove a password; ``#<sha256 hex>``, ``!<sha256 hex>``:
  the same with the password's SHA-256 (what ACL SAVE writes); ``nopass``: any password;
  ``resetpass``: none; ``reset``: none and off;
- ``~*``, ``allkeys``, ``%RW~*``, ``&*``, ``allchannels``, ``+@all``, ``allcommands``,
  ``sanitize-payload``, ``skip-sanitize-payload``: accepted; walkit kv lets every user run every
  command on every key, so these change nothing.

Other rules (key patterns, command lists, selectors) would restrict a user, which walkit kv
cannot do: the file is refused rather than read as granting more than it says.

Only SHA-256 digests of passwords are kept; `authenticate` compares them with
hmac.compare_digest against every password of the user, and an unknown user against a decoy,
so the time taken says nothing about the password or whether the user exists. Messages of
BadUsers name the line and the rule's kind, never a password.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field

from walkit.adapters.kv.resp import ProtocolError, split_inline

DEFAULT = "default"
#: How long the answer to a failed AUTH (and everything the connection sent after it) waits.
FAILED_AUTH_DELAY_S = 0.1
#: Rules that grant every key, channel or command: all users have those already.
_GRANTS_EVERYTHING = frozenset({"~*", "allkeys", "%RW~*", "%rw~*", "&*", "allchannels", "+@all", "allcommands",
                                "sanitize-payload", "skip-sanitize-payload"})
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
_NAME = re.compile(r"[^\s:]{1,128}")


class BadUsers(ValueError):
    """BadUsers is a password, user or ACL file setting that cannot be used (never quoting a password)."""


def digest(password: bytes) -> bytes:
    """digest is the SHA-256 of a password, the form in which passwords are kept and compared."""
    return hashlib.sha256(password).digest()


@dataclass
class User:
    """User is one ACL user: whether it may log in, and its password digests (or `nopass`)."""

    name: str
    enabled: bool = False
    nopass: bool = False
    digests: list[bytes] = field(default_factory=list, repr=False)

    def rule(self, rule: str, where: str) -> None:
        """rule applies one ACL rule (see the module doc); BadUsers for one walkit kv does not take."""
        if rule == "on" or rule == "off":
            self.enabled = rule == "on"
        elif rule[:1] in (">", "<"):
            self._password(rule[0] == ">", digest(rule[1:].encode("utf-8")))
        elif rule[:1] in ("#", "!"):
            if not _HEX_DIGEST.fullmatch(rule[1:]):
                raise BadUsers(f"{where}: a {rule[0]}HASH rule needs the 64 hex digits of a SHA-256")
            self._password(rule[0] == "#", bytes.fromhex(rule[1:]))
        elif rule == "nopass":
            self.nopass, self.digests = True, []
        elif rule in ("resetpass", "reset"):
            self.nopass, self.digests = False, []
            if rule == "reset":
                self.enabled = False
        elif rule not in _GRANTS_EVERYTHING:
            raise BadUsers(f"{where}: rule {rule!r} is not supported: walkit kv gives every user every command and "
                           f"key, and takes only on, off, >password, <password, #sha256, !sha256, nopass, "
                           f"resetpass, reset and rules granting everything (~*, &*, +@all)")

    def _password(self, add: bool, value: bytes) -> None:
        if add:
            self.nopass = False
            if value not in self.digests:
                self.digests.append(value)
        elif value in self.digests:
            self.digests.remove(value)


class Users:
    """Users are the ACL users of one server (see the module doc); `Users()` is a server without passwords."""

    def __init__(self, users: dict[str, User] | None = None) -> None:
        users = dict(users or {})
        if DEFAULT not in users:
            users[DEFAULT] = User(DEFAULT, enabled=not users, nopass=not users)
        self._users = users
        self._decoy = digest(secrets.token_bytes(32))

    @classmethod
    def configure(cls, *, requirepass: str | None = None, users=(), acl_text: str | None = None,
                  acl_source: str = "ACL file") -> "Users":
        """configure builds the users from `walkit kv serve`'s settings: requirepass (the default user's
        password), (name, password) pairs and an ACL file's text. A user defined twice is refused."""
        defined: dict[str, User] = {}

        def define(user: User, where: str) -> None:
            if user.name in defined:
                raise BadUsers(f"{where}: user {user.name!r} is defined more than once")
            defined[user.name] = user
        if acl_text is not None:
            for user, where in parse_acl(acl_text, acl_source):
                define(user, where)
        for name, password in users:
            check_name(name, "--user")
            if not password:
                raise BadUsers(f"--user {name}: the password is empty")
            define(User(name, enabled=True, digests=[digest(password.encode("utf-8"))]), "--user")
        if requirepass is not None:
            if not requirepass:
                raise BadUsers("requirepass: the password is empty")
            define(User(DEFAULT, enabled=True, digests=[digest(requirepass.encode("utf-8"))]), "requirepass")
        return cls(defined)

    @property
    def required(self) -> bool:
        """required tells whether connections start unauthenticated (the default user is not on and nopass)."""
        default = self._users[DEFAULT]
        return not (default.enabled and default.nopass)

    @property
    def default_enabled(self) -> bool:
        """default_enabled tells whether the default user may log in (AUTH password)."""
        return self._users[DEFAULT].enabled

    @property
    def default_nopass(self) -> bool:
        """default_nopass tells whether the default user takes no password (AUTH password is then an error)."""
        return self._users[DEFAULT].nopass

    @property
    def names(self) -> list[str]:
        """names are the users' names, sorted."""
        return sorted(self._users)

    def __repr__(self) -> str:
        return f"Users({', '.join(self.names)})"

    def authenticate(self, name: bytes, password: bytes) -> str | None:
        """authenticate returns the user `name` names if it is on and `password` is one of its own, else None."""
        user = self._users.get(name.decode("utf-8", "replace"))
        given = digest(password)
        matched = False
        for expected in (user.digests if user is not None and user.digests else [self._decoy]):
            matched |= hmac.compare_digest(given, expected)
        if user is None or not user.enabled:
            return None
        return user.name if matched or user.nopass else None

    def known(self, name: bytes) -> bool:
        """known tells whether a user of this name exists (log lines name only those)."""
        return name.decode("utf-8", "replace") in self._users


def check_name(name: str, where: str) -> None:
    """check_name refuses user names with spaces, colons or control characters, or longer than 128."""
    if not _NAME.fullmatch(name) or not name.isprintable():
        raise BadUsers(f"{where}: a user name is 1-128 printable characters without spaces or ':'")


def parse_acl(text: str, source: str = "ACL file") -> list[tuple[User, str]]:
    """parse_acl reads the `user NAME RULE...` lines of an ACL file; it returns each user and its line's place."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{source} line {number}"
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            words = [w.decode("utf-8") for w in split_inline(line.encode("utf-8"))]
        except ProtocolError:
            raise BadUsers(f"{where}: unbalanced quotes") from None
        if words[0] != "user" or len(words) < 2:
            raise BadUsers(f"{where}: lines are 'user NAME RULE...'")
        check_name(words[1], where)
        user = User(words[1])
        for rule in words[2:]:
            user.rule(rule, where)
        found.append((user, where))
    return found


def parse_user(option: str) -> tuple[str, str]:
    """parse_user splits a --user NAME:PASSWORD option at its first ':' (a password may hold ':')."""
    name, sep, password = option.partition(":")
    if not sep:
        raise BadUsers("--user takes NAME:PASSWORD")
    return name, password


def load_users(*, requirepass: str | None = None, requirepass_file: str | None = None, users=(),
               acl_file: str | None = None) -> Users:
    """load_users builds the Users of `walkit kv serve`'s options: --requirepass or --requirepass-file
    (its first line), --user NAME:PASSWORD options and --acl-file. BadUsers or OSError if they cannot be used."""
    if requirepass is not None and requirepass_file is not None:
        raise BadUsers("give --requirepass or --requirepass-file, not both")
    if requirepass_file is not None:
        with open(requirepass_file, encoding="utf-8") as f:
            lines = f.read().splitlines()
        requirepass = lines[0] if lines else ""
    acl_text = None
    if acl_file is not None:
        with open(acl_file, encoding="utf-8") as f:
            acl_text = f.read()
    return Users.configure(requirepass=requirepass, users=[parse_user(u) for u in users], acl_text=acl_text,
                           acl_source=acl_file or "ACL file")
