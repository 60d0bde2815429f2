"""walkit.plugins.metadata.credentials holds the user and password a metadata URI names, and hides the password.

The ZooKeeper and etcd stores take a user in their URI: ``zk://user:password@host:port/root``,
or, to keep the password out of the URI (and out of process listings and shell history),
``zk://user@host:port/root?password_file=/path`` whose file holds the password (one trailing
newline is dropped). A ``@``, ``:``, ``/``, ``?`` or ``#`` in a user or password written into
the URI is percent-encoded (``%40``, ``%3A``, ``%2F``, ``%3F``, ``%23``).

`redact` is how a URI is shown: ``zk://user:***@host:port/root``. The stores keep only the
redacted form in their `uri` attribute and put only that into logs and error messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from walkit.errors import ConfigError

#: What a password is replaced with wherever a URI is shown.
HIDDEN = "***"

#: What a refused change of the allow-list or the grants means when they are the operator's.
OPERATOR_HINT = ("; the allow-list and the grants (security/...) may be changed only by the operator's user "
                 "(docs/operations/security.md, the operator's own user): use the operator's metadata URI")


@dataclass(frozen=True)
class Credentials:
    """Credentials is a user and its password; the password never shows in its repr."""

    user: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.user:
            raise ConfigError("metadata credentials: the user is empty")
        if not self.password:
            raise ConfigError(f"metadata credentials: user {self.user!r} has an empty password")


def redact(uri: str) -> str:
    """redact returns `uri` with the password of its userinfo replaced by ``***``.

    It never shows less than the password: when the userinfo is malformed (an unencoded ``/``,
    ``?`` or ``#`` in the password) it hides everything up to the URI's last ``@``, so a root
    path holding an ``@`` may be hidden too.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    try:
        netloc = urlsplit(uri).netloc
    except ValueError:
        netloc = ""
    userinfo = netloc.rpartition("@")[0] if "@" in netloc else rest.rpartition("@")[0]
    user, colon, _ = userinfo.partition(":")
    if not colon:
        return uri
    return f"{scheme}://{user}:{HIDDEN}@{rest[len(userinfo) + 1:]}"


def read_password_file(path: str) -> str:
    """read_password_file returns the password a file holds, without its trailing newline."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the metadata password file {path}: {exc}") from None
    if text.endswith("\n"):
        text = text[:-1].removesuffix("\r")
    if not text:
        raise ConfigError(f"the metadata password file {path} is empty")
    return text


def split_userinfo(netloc: str, shown: str, password_file: str | None) -> tuple[str, Credentials | None]:
    """split_userinfo splits a URI's netloc into its hosts and its credentials (None without a user).

    `shown` is the redacted URI, for error messages; `password_file`, if given, holds the
    password instead of the URI.
    """
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        if password_file is not None:
            raise ConfigError(f"{shown}: password_file needs a user in the URI, e.g. "
                              f"scheme://user@host:port/root?password_file={password_file}")
        return hosts, None
    user, colon, password = userinfo.partition(":")
    user, password = unquote(user), unquote(password)
    if colon and password_file is not None:
        raise ConfigError(f"{shown}: give the password either in the URI or in password_file, not both")
    if password_file is not None:
        password = read_password_file(password_file)
    elif not password:
        raise ConfigError(f"{shown}: user {user!r} has no password; write scheme://user:password@host:port/root "
                          f"or add ?password_file=/path")
    return hosts, Credentials(user, password)
