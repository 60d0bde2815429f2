"""walkit.plugins.metadata.etcd_auth signs an etcd store's requests with its user's token, renewed when etcd drops it.

etcd3gw has no authentication of its own. etcd's v3 JSON gateway authenticates with ``POST
/v3/auth/authenticate {"name", "password"}``, which answers a token; every later request
carries it in the ``Authorization`` header. etcd forgets a token that was idle for its
``--auth-token-ttl`` (300 s by default), when the user's password changes, and (``simple``
tokens) when etcd restarts before it replayed the authentication; it then answers
``etcdserver: invalid auth token`` (HTTP 401). etcd checks the token before it proposes a
request, so a refused request was not applied and is safe to send again, writes included: the
store authenticates once more and retries it once.

One `EtcdAuth` per store holds the token its connections share (the requests, the lease
keep-alive, the watch streams).
"""

from __future__ import annotations

import logging
import threading

import requests
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception

from walkit.plugins.metadata.credentials import OPERATOR_HINT, Credentials

log = logging.getLogger(__name__)


class EtcdAuthFailed(Etcd3Exception):
    """EtcdAuthFailed is raised when etcd refuses the user's name or password."""


def token_refused(text: str) -> bool:
    """token_refused is True when etcd's error text says the request's token is missing or stale."""
    return "invalid auth token" in text or "user name is empty" in text


def hint(text: str, user: str | None, root: str, what: str = "") -> str:
    """hint says how to fix the authentication problem etcd's error `text` names, in call `what` ("" if none)."""
    if "permission denied" in text and "'security/" in what:
        return OPERATOR_HINT
    if "user name is empty" in text:
        return ("; etcd has authentication enabled: give the store a user, etcd://user:password@host:port/root "
                "(or ?password_file=)")
    if "permission denied" in text:
        return (f"; etcd user {user!r} has no permission on these keys: grant its role readwrite on the "
                f"prefix {root}/")
    return ""


class EtcdAuth:
    """EtcdAuth holds one user's etcd token, shared by a store's connections, and renews it.

    `url` is the gateway's ``/v3/auth/authenticate`` URL; `authentications` counts the tokens
    it obtained.
    """

    def __init__(self, credentials: Credentials, url: str) -> None:
        self.user = credentials.user
        self._password = credentials.password
        self._url = url
        self._lock = threading.Lock()
        self._token: str | None = None
        self.authentications = 0

    def __repr__(self) -> str:
        return f"<EtcdAuth user={self.user!r}>"

    def token(self, session: requests.Session, timeout: float) -> str:
        """token returns the current token, authenticating first (through `session`) if there is none."""
        with self._lock:
            if self._token is None:
                self._token = self._authenticate(session, timeout)
            return self._token

    def renew(self, stale: str, session: requests.Session, timeout: float) -> str:
        """renew returns a token newer than `stale`, authenticating unless another connection already did."""
        with self._lock:
            if self._token in (None, stale):
                self._token = self._authenticate(session, timeout)
            return self._token

    @staticmethod
    def headers(token: str) -> dict:
        """headers are the HTTP headers that carry `token` ("" when etcd has authentication disabled)."""
        return {"Authorization": token} if token else {}

    def _authenticate(self, session: requests.Session, timeout: float) -> str:
        try:
            response = session.post(self._url, json={"name": self.user, "password": self._password}, timeout=timeout)
        except requests.exceptions.Timeout as exc:                      # as etcd3gw's own requests do
            raise ConnectionTimeoutError(str(exc)) from None
        except requests.exceptions.ConnectionError as exc:
            raise ConnectionFailedError(str(exc)) from None
        if response.ok:
            self.authentications += 1
            return response.json()["token"]
        try:
            reason = response.json().get("error") or response.text
        except ValueError:
            reason = response.text
        if "authentication is not enabled" in reason:
            log.warning("etcd at %s has authentication disabled: user %r is not used", self._url, self.user)
            return ""
        if "authentication failed" in reason:
            raise EtcdAuthFailed(f"etcd refused user {self.user!r}: authentication failed ({reason}); check the "
                                 f"user and password (or password_file) of the etcd:// URI")
        raise Etcd3Exception(reason, response.reason)
