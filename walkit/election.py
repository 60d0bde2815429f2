"""walkit.election elects one leader among candidates, over any MetadataStore.

    election = LeaderElection(store, "auditor", "10.0.0.7:3181", on_lost=stop_auditing)
    election.campaign(timeout=30)          # blocks until this candidate leads
    election.epoch                         # larger for every new leadership
    election.leader()                      # the leading candidate, from anywhere
    election.leadership()                  # (the leading candidate, its epoch), from anywhere
    election.resign()

The leader holds the ephemeral key ``elections/<name>/leader`` through `store.register`, so the
key goes when the leader resigns, closes its store or dies (once its session or heartbeat
expires). Other candidates watch ``elections/<name>`` and try again when the key goes.

Epochs: a new leader draws its epoch from the counter ``elections/<name>`` (`next_id`) after it
won the key, and publishes it in the key's value. Only one candidate holds the key at a time
and next_id only grows, so each leadership's epoch is larger than every earlier one's; carry it
in what the leader writes so that a deposed leader's late writes can be refused.

Leadership is lost when the store's session is LOST: `is_leader` turns False, the
registration is closed (so the store does not create it again in its next session) and
`on_lost` is called. While the session is SUSPENDED the leader stays leader (the session may
come back); check `store.state` where that matters. Give each candidate its own store: a store
replaces its own registrations, so two candidates on one store would both win.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Callable

from walkit.errors import ConfigError, NodeExists, NoSuchKey, Timeout
from walkit.plugins.metadata import check_key
from walkit.spi import SessionState
from walkit.watchhub import watch_shared

log = logging.getLogger(__name__)

ELECTIONS_PREFIX = "elections"

#: How often a waiting candidate looks at the leader key even without a watch event.
RECHECK_S = 1.0

_campaigning: set[tuple[int, str]] = set()      # (id(store), name) with a candidate; one per store
_campaigning_lock = threading.Lock()


class LeaderElection:
    """LeaderElection is one candidate (`candidate`, any string) in the election `name`."""

    def __init__(self, store, name: str, candidate: str, *, on_lost: Callable[[], None] | None = None) -> None:
        check_key(name)
        if not isinstance(candidate, str) or not candidate:
            raise ConfigError(f"a candidate is a non-empty string, not {candidate!r}")
        self.store = store
        self.name = name
        self.candidate = candidate
        self.on_lost = on_lost
        self.prefix = f"{ELECTIONS_PREFIX}/{name}"
        self.leader_key = f"{self.prefix}/leader"
        self._lock = threading.Lock()
        self._session = None
        self._epoch: int | None = None
        self._losses = 0
        store.add_state_listener(self._on_state)

    @property
    def is_leader(self) -> bool:
        """is_leader is True from a won campaign until resign() or the loss of the store's session."""
        return self._session is not None

    @property
    def epoch(self) -> int | None:
        """epoch is the epoch of this candidate's current (or last) leadership, None before any."""
        return self._epoch

    def leader(self) -> str | None:
        """leader returns the candidate that leads now, or None if nobody does."""
        held = self.leadership()
        return None if held is None else held[0]

    def leadership(self) -> tuple[str, int | None] | None:
        """leadership returns (candidate, epoch) of the leadership now, None if nobody leads; the epoch is
        None for a moment after the candidate won, until it published it."""
        try:
            value, _ = self.store.get(self.leader_key)
        except NoSuchKey:
            return None
        doc = json.loads(value)
        return doc["candidate"], doc.get("epoch")

    def campaign(self, timeout: float, *, recheck_s: float = RECHECK_S, wake: threading.Event | None = None,
                 give_up: Callable[[], bool] | None = None) -> int:
        """campaign blocks until this candidate leads and returns its epoch; Timeout after `timeout` s.

        While another candidate leads it waits for the watch of the election to fire, and tries
        again every `recheck_s` even without one. `wake`, if given, is the event it waits on (set
        it to make the candidate look now); `give_up()`, asked at each look, ends the campaign
        with Timeout when it returns True.
        """
        if self.is_leader:
            return self._epoch
        slot = (id(self.store), self.name)
        with _campaigning_lock:
            if slot in _campaigning:
                raise ConfigError(f"another candidate of election {self.name!r} uses this store; "
                                  f"give each candidate its own store")
            _campaigning.add(slot)
        try:
            return self._campaign(time.monotonic() + timeout, timeout, recheck_s, wake, give_up)
        except BaseException:
            with _campaigning_lock:
                _campaigning.discard(slot)
            raise

    def _campaign(self, deadline: float, timeout: float, recheck_s: float, wake: threading.Event | None,
                  give_up: Callable[[], bool] | None) -> int:
        changed = wake if wake is not None else threading.Event()
        watch = None                             # set only once another candidate is found leading
        try:
            while True:
                changed.clear()
                if give_up is not None and give_up():
                    raise Timeout(f"{self.candidate!r} stopped campaigning for {self.name!r}")
                losses = self._losses
                nonce = uuid.uuid4().hex
                try:
                    session = self.store.register(self.leader_key, self._value(nonce, None))
                except NodeExists:
                    if watch is None:            # the key may have gone before the watch was set: try again now
                        watch = watch_shared(self.store, ELECTIONS_PREFIX, self.prefix, lambda key: changed.set())
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise Timeout(f"{self.candidate!r} did not become leader of {self.name!r} "
                                      f"within {timeout:g} s (leader: {self.leader()!r})") from None
                    changed.wait(min(remaining, recheck_s))
                    continue
                epoch = self.store.next_id(self.prefix)
                session.update(self._value(nonce, epoch))
                with self._lock:
                    if self._losses == losses:
                        self._session, self._epoch = session, epoch
                        log.info("%s leads %s (epoch %d)", self.candidate, self.name, epoch)
                        return epoch
                session.close()                  # the session was lost while we won: try again
        finally:
            if watch is not None:
                watch.cancel()

    def resign(self) -> None:
        """resign gives up leadership (the key goes at once); on_lost is not called."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            self._release_slot()
            session.close()

    def _value(self, nonce: str, epoch: int | None) -> bytes:
        return json.dumps({"candidate": self.candidate, "epoch": epoch, "nonce": nonce}).encode()

    def _release_slot(self) -> None:
        with _campaigning_lock:
            _campaigning.discard((id(self.store), self.name))

    def _on_state(self, state: SessionState) -> None:
        if state is not SessionState.LOST:
            return
        with self._lock:
            self._losses += 1
            session, self._session = self._session, None
        if session is None:
            return
        self._release_slot()
        log.warning("%s lost the leadership of %s (epoch %s): the metadata session was lost",
                    self.candidate, self.name, self._epoch)
        session.close()
        if self.on_lost is not None:
            self.on_lost()


def depose(store, name: str) -> bool:
    """depose deletes the leader key of election `name`, so that its leader loses the election and the candidates
    campaign again; it returns whether there was one. After a principal's right to lead was revoked, its node
    may hold the key for as long as its session lives (walkit acl revoke on a replicated name's log)."""
    try:
        store.delete(f"{ELECTIONS_PREFIX}/{check_key(name)}/leader")
        return True
    except NoSuchKey:
        return False
