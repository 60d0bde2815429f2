"""walkit.plugins.metadata.etcd_watch follows a key prefix in etcd: one streaming watch, resumed after errors.

The etcd store (walkit.plugins.metadata.etcd) opens one EtcdWatch per `watch()` call. It posts
a watch request to etcd's v3 JSON gateway and reads the stream of events (one JSON document per
line) on its own thread and HTTP connection, handing each key to the store's callback thread.
With a user, the watch request carries the store's token (walkit.plugins.metadata.etcd_auth);
etcd checks it when the watch is created and cancels a watch whose token it does not know, so
the watch then authenticates again and watches anew.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time

import requests
from etcd3gw.exceptions import Etcd3Exception

from walkit.errors import MetadataError
from walkit.plugins.metadata.etcd_auth import EtcdAuthFailed, hint, token_refused
from walkit.plugins.metadata.session import UserWatch

log = logging.getLogger(__name__)

#: An idle watch stream is opened again after this long, in case its peer died silently.
WATCH_IDLE_S = 60.0


class WatchRefused(Exception):
    """WatchRefused is raised when etcd cancels a watch as it creates it (no permission, bad token)."""


class EtcdWatch:
    """EtcdWatch is one streaming etcd watch over a prefix, on its own thread and connection.

    It reports keys equal to the prefix or under ``prefix/``; after a broken stream it watches
    again from the revision after the last one it saw, so nothing is missed. If etcd compacted
    that revision away, it reports the prefix itself (anything may have changed).
    """

    def __init__(self, store, path: str) -> None:
        """EtcdWatch follows `path` (the full etcd key of the prefix) for `store`, an EtcdMetadataStore."""
        self.store = store
        self.path = path
        self.user: UserWatch | None = None
        self.revision: int | None = None          # the last revision seen
        self._http = requests.Session()
        self._response: requests.Response | None = None
        self._messages = None
        self._stopped = threading.Event()

    def start(self, deadline: float) -> None:
        """start opens the stream (raising MetadataError if etcd does not answer in time) and the thread."""
        while True:
            remaining = max(0.05, deadline - time.monotonic())
            try:
                self._open(connect_s=min(remaining, 5.0), idle_s=min(remaining, WATCH_IDLE_S))
                break
            except (WatchRefused, EtcdAuthFailed) as exc:
                self.stop()
                reason = getattr(exc, "detail_text", None) or str(exc)
                raise MetadataError(f"watch {self.user.prefix!r}: etcd at {self.store.address} refused it: {reason}"
                                    f"{hint(reason, self.store.user, self.store.root)}") from None
            except (requests.RequestException, Etcd3Exception, ValueError, KeyError) as exc:
                if time.monotonic() >= deadline:
                    self.stop()
                    raise self.store._unreachable(f"watch {self.user.prefix!r}", str(exc)) from None
                self._stopped.wait(0.05)
        threading.Thread(target=self._run, name="walkit-etcd-watch", daemon=True).start()

    def stop(self) -> None:
        """stop ends the stream at once (its thread then exits)."""
        self._stopped.set()
        self.store._watches.discard(self)
        response = self._response
        if response is not None:
            try:
                fd = response.raw._fp.fileno()           # as etcd3gw's Watcher.stop does
                with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.shutdown(socket.SHUT_RDWR)
            except (AttributeError, OSError, ValueError):
                pass
            response.close()
        self._http.close()

    def _open(self, connect_s: float, idle_s: float, renewed: bool = False) -> None:
        """_open posts the watch request and reads etcd's answer; the stream may then idle for `idle_s`.

        A watch etcd cancels for its token is opened once more with a new token.
        """
        request = {"key": base64.b64encode(self.path.encode()).decode(),
                   "range_end": base64.b64encode((self.path + "0").encode()).decode()}
        if self.revision is not None:
            request["start_revision"] = self.revision + 1
        auth = self.store._auth
        token = auth.token(self._http, connect_s) if auth is not None else ""
        response = self._http.post(self.store._client.get_url("/watch"), json={"create_request": request},
                                   headers=auth.headers(token) if auth is not None else None,
                                   stream=True, timeout=(connect_s, idle_s))
        self._response = response
        if self._stopped.is_set():
            response.close()
            return
        response.raise_for_status()
        self._messages = self._read(response)
        first = next(self._messages)
        if not first.get("created"):
            raise ValueError(f"etcd did not create the watch: {first}")
        if first.get("canceled") and not int(first.get("compact_revision", 0)):
            reason = first.get("cancel_reason", "")
            response.close()
            if auth is None or renewed or not token_refused(reason):
                raise WatchRefused(reason)
            auth.renew(token, self._http, connect_s)
            self._open(connect_s, idle_s, renewed=True)
            return
        if self.revision is None:
            self.revision = int(first["header"]["revision"])

    @staticmethod
    def _read(response: requests.Response):
        buffer = b""
        for chunk in response.iter_content(chunk_size=None):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    message = json.loads(line)
                    if "error" in message:
                        raise ValueError(f"etcd watch error: {message['error']}")
                    yield message["result"]
        raise ConnectionError("the watch stream ended")

    def _run(self) -> None:
        delay = 0.05
        while not self._stopped.is_set():
            try:
                if self._messages is None:
                    self._open(connect_s=min(self.store.timeout, 5.0), idle_s=WATCH_IDLE_S)
                    delay = 0.05
                for result in self._messages:
                    self._handle(result)
            except Exception as exc:  # noqa: BLE001 - any broken stream: watch again from the last revision
                if not self._stopped.is_set():
                    log.debug("etcd watch on %s broke (%s); watching again", self.path, exc)
            self._messages = None
            if self._response is not None:
                self._response.close()
            self._stopped.wait(delay)
            delay = min(delay * 2, 1.0)

    def _handle(self, result: dict) -> None:
        if result.get("canceled"):
            if int(result.get("compact_revision", 0)):
                self.revision = None
                self._fire(self.path)
            raise ConnectionError(f"etcd cancelled the watch: {result.get('cancel_reason', '')}")
        for event in result.get("events", ()):
            kv = event["kv"]
            self.revision = max(self.revision or 0, int(kv.get("mod_revision", 0)))
            key = base64.b64decode(kv["key"]).decode()
            if key == self.path or key.startswith(self.path + "/"):
                self._fire(key)

    def _fire(self, path: str) -> None:
        key = path[len(self.store.root) + 1:]
        self.store._dispatcher.submit(lambda: self.user.fire(key))
