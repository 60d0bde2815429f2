"""walkit.registry keeps the list of live bookies in the metadata store.

Each running bookie holds an ephemeral registration under ``bookies/<id>`` whose value is a
small JSON document (`BookieInfo`). The id is the name ledger metadata gives the bookie
(BookKeeper's BP-41 bookie id); the registration maps it to the address clients dial
(`BookieInfo.endpoint`), so a bookie whose address changes keeps its ledgers. An id defaults
to the bookie's first advertised address, which is all a bookie was called before ids existed:
registrations without an endpoint are dialled at their id.

The key disappears when the bookie stops (at once) or dies (when its session or heartbeat
expires), so `live()` is the set of bookies a new ledger may use. Read-only bookies stay
registered, flagged, and are never chosen for writes; so do bookies being decommissioned
(`draining`). Each bookie names its rack (or zone); `writable()` lists candidates rack by
rack and `choose()` places ensembles with walkit.placement.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from walkit.core.dispatch import Bookies
from walkit.errors import NoSuchKey, NotEnoughBookies
from walkit.placement import choose_ensemble, choose_replacement, spread_order

BOOKIES_PREFIX = "bookies"

_BOOKIE_ID = re.compile(r"[A-Za-z0-9._:\[\]-]{1,255}")


def valid_bookie_id(name: str) -> bool:
    """valid_bookie_id tells whether `name` may be a bookie id: it becomes part of metadata keys, so
    letters, digits and . _ - : [ ] only (an address such as 10.0.0.5:3181 or [::1]:3181 is one)."""
    return bool(_BOOKIE_ID.fullmatch(name)) and name not in (".", "..")


@dataclass(frozen=True, slots=True)
class BookieInfo:
    """BookieInfo is what a bookie publishes about itself."""

    address: str                # the bookie's id: what ledger metadata names (by default its first address)
    read_only: bool = False
    storage: str = ""
    public_key: str = ""        # the bookie's CurveZMQ public key (Z85) when it runs secured
    rack: str = ""              # the rack or zone (walkit.placement); "" is the default rack
    draining: bool = False      # being decommissioned: read-only until its data moved away
    http: str = ""              # host:port of its metrics and health endpoint, if any
    disk: int = 0               # the identity of its storage (walkit.bookie.identity); 0: unknown
    endpoint: str = ""          # host:port clients dial now; "" (a bookie from before ids): the id itself

    @property
    def dial(self) -> str:
        """dial is the host:port to connect to: the registered endpoint, or the id for older bookies."""
        return self.endpoint or self.address

    def to_bytes(self) -> bytes:
        """to_bytes encodes the info for the metadata store."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "BookieInfo":
        """from_bytes decodes info written by `to_bytes`, by this or an older or newer walkit.

        Fields it does not know are ignored and fields an older bookie did not write take their
        defaults, so registrations stay readable across versions.
        """
        doc = json.loads(data)
        return cls(**{k: v for k, v in doc.items() if k in cls.__dataclass_fields__})


def bookie_key(address: str) -> str:
    """bookie_key is the registration key of a bookie."""
    return f"{BOOKIES_PREFIX}/{address}"


class BookieRegistry:
    """BookieRegistry registers bookies and lists the live ones, over any MetadataStore."""

    def __init__(self, store) -> None:
        self.store = store

    def register(self, info: BookieInfo):
        """register publishes `info` until the returned session is closed (or the process dies)."""
        return self.store.register(bookie_key(info.address), info.to_bytes())

    def info(self, address: str) -> BookieInfo | None:
        """info returns what the bookie with id `address` registered, or None if it is not registered."""
        try:
            value, _ = self.store.get(bookie_key(address))
        except NoSuchKey:
            return None
        return BookieInfo.from_bytes(value)

    def live(self) -> dict[str, BookieInfo]:
        """live maps the id of every registered bookie to its info."""
        found: dict[str, BookieInfo] = {}
        for name in self.store.children(BOOKIES_PREFIX):
            try:
                value, _ = self.store.get(f"{BOOKIES_PREFIX}/{name}")
            except NoSuchKey:
                continue           # went away between the listing and the read
            info = BookieInfo.from_bytes(value)
            found[info.address] = info
        return found

    def writable(self, exclude=frozenset(), live: dict[str, BookieInfo] | None = None) -> list[str]:
        """writable lists live, writable bookies outside `exclude`, in random order rack by rack.

        Neighbours in the list differ in rack where they can (walkit.placement.spread_order),
        so a prefix of it is spread over racks. `live` is a listing from `live()` to use instead
        of reading the store again.
        """
        live = self.live() if live is None else live
        return spread_order({a: info.rack for a, info in live.items() if _writable(info) and a not in exclude})

    def placed(self, kind: str = "", *args) -> list[str]:
        """placed lists writable bookies for the dispatcher's `live_bookies` call, placement first.

        ("create", E, Qw): a rack-aware ensemble of E first (then the others), or NotEnoughBookies
        naming every registered bookie when fewer than E are writable; ("replace",
        ensemble, replaced, Qw): the rack-aware replacement of each replaced bookie, in order,
        then the others. Anything else, or placement that cannot be met: `writable()`. The
        answer is a walkit.core.dispatch.Bookies list: it names every live bookie's disk too.
        """
        live = self.live()
        writable = self.writable(live=live)
        disks = {a: live[a].disk for a in writable if live[a].disk}      # a read-only bookie takes no place
        return Bookies(self._placed(kind, args, live, writable), disks)

    def _placed(self, kind: str, args: tuple, live: dict[str, BookieInfo], writable: list[str]) -> list[str]:
        racks = {a: info.rack for a, info in live.items()}
        if kind == "create" and len(writable) < args[0]:
            raise NotEnoughBookies(shortage(args[0], live))
        try:
            if kind == "create":
                count, write_quorum = args
                chosen = choose_ensemble({a: racks[a] for a in writable}, count, write_quorum)
                return chosen + [b for b in writable if b not in chosen]
            elif kind == "replace":
                ensemble, replaced, write_quorum = args
                slots, candidates, chosen = list(ensemble), {a: racks[a] for a in writable if a not in ensemble}, []
                for bookie in replaced:
                    if not candidates:
                        break
                    pick = choose_replacement(slots, slots.index(bookie), candidates, write_quorum, racks=racks)
                    slots[slots.index(bookie)] = pick
                    chosen.append(pick)
                    del candidates[pick]
                return chosen + [b for b in writable if b not in chosen]
        except (NotEnoughBookies, ValueError, KeyError):
            pass
        return writable

    def choose(self, count: int, exclude=frozenset(), *, write_quorum: int | None = None,
               min_racks: int = 1) -> list[str]:
        """choose picks `count` distinct writable bookies, or raises NotEnoughBookies.

        The bookies come in write-set order: each write set of `write_quorum` (default: all
        `count`) consecutive bookies spans as many racks as possible, and at least `min_racks`
        (walkit.placement.choose_ensemble). The list is a walkit.core.dispatch.Bookies: it
        names the disk each chosen bookie registered with.
        """
        live = self.live()
        candidates = {a: info.rack for a, info in live.items() if _writable(info) and a not in exclude}
        if len(candidates) < count:
            raise NotEnoughBookies(shortage(count, live, exclude))
        chosen = choose_ensemble(candidates, count, write_quorum or count, min_racks=min_racks)
        return Bookies(chosen, {a: live[a].disk for a in chosen if live[a].disk})


def shortage(count: int, live: dict[str, BookieInfo], exclude=frozenset()) -> str:
    """shortage says why fewer than `count` bookies may be chosen: every registered one and its state."""
    usable = [a for a, info in live.items() if _writable(info) and a not in exclude]
    states = []
    for address in sorted(live):
        info = live[address]
        why = ("excluded" if address in exclude else "draining" if info.draining
               else "read-only" if info.read_only else "")
        states.append(f"{address} ({why})" if why else address)
    registered = f"registered: {', '.join(states)}" if states else "no bookie is registered"
    return f"need {count} writable bookies, {len(usable)} available; {registered}"


def _writable(info: BookieInfo) -> bool:
    """_writable tells whether new ledgers may use a bookie: not read-only, not being drained."""
    return not info.read_only and not info.draining
