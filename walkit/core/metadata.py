"""walkit.core.metadata defines LedgerMetadata, the record a ledger keeps in the metadata store.

A ledger's metadata (docs/internals/protocol.md#ledger-metadata) holds its quorum sizes, its state (OPEN,
IN_RECOVERY or CLOSED), the last entry once closed, and its fragments: ensembles keyed by the
first entry they hold. Metadata values are immutable; every change returns a new value that the
shell writes with compare-and-swap.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, replace
from typing import Mapping

from walkit.errors import ConfigError

OPEN = "OPEN"
IN_RECOVERY = "IN_RECOVERY"
CLOSED = "CLOSED"
STATES = (OPEN, IN_RECOVERY, CLOSED)

#: The metadata key of a ledger is LEDGER_PREFIX + its id, zero-padded so keys sort by id.
LEDGER_PREFIX = "ledgers/"
#: The counter `MetadataStore.next_id` draws ledger ids from.
LEDGER_ID_COUNTER = "ledger-id"
#: A deleted ledger leaves a marker under DELETED_PREFIX + its id, written before its metadata
#: goes: bookies drop a ledger's data only on this positive sign, never because its metadata
#: is missing (a wrong or emptied metadata store looks just the same; walkit.deletions).
DELETED_PREFIX = "deleted-ledgers/"


def deleted_key(ledger_id: int) -> str:
    """deleted_key returns the metadata-store key of a deleted ledger's marker."""
    return f"{DELETED_PREFIX}{ledger_id:020d}"


def deletion_marker(wall_ms: int) -> bytes:
    """deletion_marker is the value of a deletion marker written at `wall_ms` (ms since the epoch)."""
    return json.dumps({"deleted_ms": wall_ms}).encode()


def ledger_key(ledger_id: int) -> str:
    """ledger_key returns the metadata-store key of a ledger's metadata."""
    return f"{LEDGER_PREFIX}{ledger_id:020d}"


def ledger_id_of(key: str) -> int:
    """ledger_id_of returns the ledger id named by a key made by `ledger_key`."""
    return int(key[len(LEDGER_PREFIX):] if key.startswith(LEDGER_PREFIX) else key)


def check_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """check_quorums raises ConfigError unless E >= Qw >= Qa >= 1 (docs/internals/protocol.md#ledger-metadata)."""
    for name, value in (("ensemble", ensemble_size), ("write_quorum", write_quorum), ("ack_quorum", ack_quorum)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    if not ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise ConfigError(
            "quorums must satisfy ensemble >= write_quorum >= ack_quorum >= 1, got "
            f"ensemble={ensemble_size}, write_quorum={write_quorum}, ack_quorum={ack_quorum}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerMetadata:
    """LedgerMetadata is one ledger's replicated configuration and state.

    `ensembles` maps the first entry id of each fragment to the bookie addresses of that
    fragment, in ensemble order. `last_entry_id` is -1 for an empty closed ledger and None
    while the ledger is not CLOSED. `password_check` lets a client refuse a wrong password
    before it reads (see walkit.core.digest.password_check). `custom` holds string pairs for
    applications. `owner` is the principal that created it (secured clusters).

    With `guaranteed_write_quorum` (docs/internals/protocol.md#guaranteed-write-quorum;
    walkit.core.writer) every entry of a closed ledger, and every entry of all but the last
    fragment, is on Qw bookies.

    An `unbounded` ledger (docs/internals/protocol.md#unbounded-ledgers) is written by one writer at
    a time over many terms: `term` is the current one (its writer's adds carry it; bookies refuse
    lower terms), a new writer takes over by recovering into the next term (IN_RECOVERY at term + 1,
    then OPEN again), and entries below `first_entry_id` were truncated away with the fragments that
    held only them. `term_holder` names the recovery that took `term` (a random token it drew): two
    recoveries that take the next term from the same metadata write different bytes, so a put whose
    outcome was unknown and is settled by reading the key back tells whose write landed. Unbounded
    ledgers always use guaranteed write quorum (the protocol is only safe with it).

    `disks` maps a fragment's first entry id to the disk identity of each of its bookies, in
    ensemble order (walkit.bookie.identity: random per formatted storage; 0 where unknown), as
    they were when the fragment was written. A bookie whose storage was emptied and formatted
    again answers NO_SUCH_ENTRY for entries it once acknowledged, and has forgotten its fences;
    so an answer counts as that bookie's for an entry only if it comes from the disk its
    fragment records (`answer_counts`). Ledgers written before disks were recorded have none,
    and every answer counts for them.
    """

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: Mapping[int, tuple[str, ...]]
    state: str = OPEN
    last_entry_id: int | None = None
    digest_type: str = "crc32c"
    password_check: str = ""
    created_ms: int = 0
    custom: Mapping[str, str] = field(default_factory=dict)
    owner: str = ""
    guaranteed_write_quorum: bool = False
    unbounded: bool = False
    term: int = 0
    first_entry_id: int = 0
    term_holder: str = ""
    disks: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        # Metadata is read from a store others write (a principal writes its own ledgers' in principal mode): a
        # value of the wrong type would fail far from here, in the auditor or a bookie's garbage collection.
        numbers = (self.ledger_id, self.created_ms, self.term, self.first_entry_id, *self.ensembles)
        if (not all(type(n) is int for n in numbers) or type(self.last_entry_id) not in (int, type(None))
                or not all(isinstance(v, str) for v in (self.state, self.digest_type, self.password_check,
                                                        self.owner, self.term_holder))
                or not all(isinstance(b, str) for bookies in self.ensembles.values() for b in bookies)
                or not isinstance(self.custom, Mapping)
                or type(self.guaranteed_write_quorum) is not bool or type(self.unbounded) is not bool):
            raise ConfigError("ledger metadata holds a field of the wrong type")
        if self.state not in STATES:
            raise ConfigError(f"unknown ledger state {self.state!r}")
        if not self.ensembles or min(self.ensembles) > self.first_entry_id:
            raise ConfigError(f"a ledger needs a first ensemble starting at entry {self.first_entry_id} or before")
        if self.unbounded and not self.guaranteed_write_quorum:
            raise ConfigError("an unbounded ledger needs guaranteed write quorum")
        if self.term < 0 or ((self.first_entry_id or self.term_holder) and not self.unbounded):
            raise ConfigError("only unbounded ledgers have a first entry other than 0 or a term holder, "
                              "and terms are >= 0")
        for first, bookies in self.ensembles.items():
            if len(bookies) != self.ensemble_size or len(set(bookies)) != len(bookies):
                raise ConfigError(f"fragment at entry {first} must list {self.ensemble_size} distinct bookies")
        if (self.state == CLOSED) != (self.last_entry_id is not None):
            raise ConfigError("last_entry_id is set exactly when the ledger is CLOSED")
        for first, disks in self.disks.items():
            if first not in self.ensembles or len(disks) != self.ensemble_size:
                raise ConfigError(f"the disks at entry {first} must match a fragment of {self.ensemble_size} bookies")
            if not all(type(d) is int and 0 <= d < 1 << 64 for d in disks):
                raise ConfigError(f"the disks at entry {first} must be integers from 0 to 2**64 - 1, got {list(disks)}")

    # -- queries --------------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        """is_closed is True once the ledger's last entry is final."""
        return self.state == CLOSED

    @property
    def fragment_starts(self) -> list[int]:
        """fragment_starts lists the first entry ids of the fragments, ascending."""
        return sorted(self.ensembles)

    def ensemble_at(self, entry_id: int) -> tuple[str, ...]:
        """ensemble_at returns the ensemble of the fragment that holds `entry_id`."""
        return self.ensembles[self.fragment_start(entry_id)]

    @property
    def last_fragment_start(self) -> int:
        """last_fragment_start is the first entry id of the last fragment."""
        return max(self.ensembles)

    @property
    def current_ensemble(self) -> tuple[str, ...]:
        """current_ensemble is the ensemble of the last fragment, where new entries go."""
        return self.ensembles[self.last_fragment_start]

    def fragment_start(self, entry_id: int) -> int:
        """fragment_start is the first entry id of the fragment that holds `entry_id`."""
        starts = self.fragment_starts
        return starts[max(0, bisect.bisect_right(starts, entry_id) - 1)]

    def disk_of(self, entry_id: int, bookie: str) -> int:
        """disk_of is the disk `bookie` had when the fragment holding `entry_id` was written (0: unknown)."""
        first = self.fragment_start(entry_id)
        disks = self.disks.get(first)
        if disks is None:
            return 0
        ensemble = self.ensembles[first]
        return disks[ensemble.index(bookie)] if bookie in ensemble else 0

    def answer_counts(self, entry_id: int, bookie: str, disk: int) -> bool:
        """answer_counts tells whether an answer from `bookie`'s `disk` speaks for the fragment of `entry_id`.

        It does unless the fragment recorded another disk for the bookie: then the bookie's
        storage was replaced since, and what it holds or lacks says nothing of that fragment.
        """
        recorded = self.disk_of(entry_id, bookie)
        return recorded == 0 or disk == recorded

    def holds_nothing_counts(self, disk: int) -> bool:
        """holds_nothing_counts tells whether a NO_SUCH_LEDGER answer from `disk` may count as absence at all.

        Not from a bookie that names no disk (an older walkit) when this ledger records disks:
        an older secured bookie cannot read such metadata and answers NO_SUCH_LEDGER for a
        ledger it holds. Each entry's answer must also pass `answer_counts`.
        """
        return disk != 0 or not self.disks

    @property
    def bookies(self) -> set[str]:
        """bookies is every bookie address named by any fragment."""
        return {b for ensemble in self.ensembles.values() for b in ensemble}

    # -- changes (each returns new metadata) ---------------------------------------------
    def with_fragment(self, first_entry_id: int, ensemble: tuple[str, ...],
                      disks: tuple[int, ...] | None = None) -> "LedgerMetadata":
        """with_fragment returns metadata with a new last fragment starting at `first_entry_id`.

        `disks` are the disks of `ensemble`'s bookies (see `disks`; None: none known). A
        fragment that would start where the last one starts replaces it: that fragment holds no
        confirmed entry yet (BookKeeper does the same).
        """
        if first_entry_id < self.last_fragment_start:
            raise ValueError(f"a new fragment cannot start at {first_entry_id}, before {self.last_fragment_start}")
        ensembles = dict(self.ensembles)
        ensembles[first_entry_id] = tuple(ensemble)
        return replace(self, ensembles=ensembles, disks=_with_disks(self.disks, first_entry_id, disks))

    def with_disk_where_unknown(self, bookie: str, disk: int) -> "LedgerMetadata":
        """with_disk_where_unknown returns metadata recording `disk` for `bookie` in every fragment that names it
        with no disk recorded (ledgers written before disks were: `walkit bookies format-and-rejoin`
        records the disk that held them, so the new disk's answers never count for them)."""
        disks = dict(self.disks)
        for first, ensemble in self.ensembles.items():
            if bookie in ensemble:
                recorded = list(disks.get(first, (0,) * self.ensemble_size))
                if recorded[ensemble.index(bookie)] == 0:
                    recorded[ensemble.index(bookie)] = disk
                    disks[first] = tuple(recorded)
        return replace(self, disks=disks)

    def with_fragments(self, fragments: Mapping[int, tuple[str, ...]],
                       disks: Mapping[int, tuple[int, ...] | None] | None = None) -> "LedgerMetadata":
        """with_fragments returns metadata whose existing fragments at the keys of `fragments` name other bookies.

        Re-replication (walkit.autorecovery) uses it: `disks` gives the new disks of each
        rewritten fragment (a fragment missing from it keeps none).
        """
        ensembles = dict(self.ensembles)
        ensembles.update({first: tuple(bookies) for first, bookies in fragments.items()})
        recorded = dict(self.disks)
        for first in fragments:
            recorded = _with_disks(recorded, first, (disks or {}).get(first))
        return replace(self, ensembles=ensembles, disks=recorded)

    def in_recovery(self, holder: str = "") -> "LedgerMetadata":
        """in_recovery returns the metadata marked IN_RECOVERY (docs/internals/protocol.md#recovery, step 1).

        An unbounded ledger moves to the next term as well: the recoverer's own, held by
        `holder` (its token; see `term_holder`).
        """
        if not self.unbounded:
            return replace(self, state=IN_RECOVERY)
        return replace(self, state=IN_RECOVERY, term=self.term + 1, term_holder=holder)

    def reopened(self) -> "LedgerMetadata":
        """reopened returns an unbounded ledger's metadata OPEN again, in the recoverer's term."""
        return replace(self, state=OPEN)

    def truncated(self, before: int) -> "LedgerMetadata":
        """truncated returns an unbounded ledger's metadata without the entries below `before`.

        Fragments that hold only such entries are dropped, so the metadata stays small however
        many fragments the ledger went through; the last fragment always stays.
        """
        if before <= self.first_entry_id:
            return self
        starts = self.fragment_starts
        kept = {first: self.ensembles[first] for first, following in zip(starts, starts[1:] + [None])
                if following is None or following > before}
        return replace(self, ensembles=kept, first_entry_id=before,
                       disks={first: disks for first, disks in self.disks.items() if first in kept})

    def closed(self, last_entry_id: int) -> "LedgerMetadata":
        """closed returns the metadata marked CLOSED with its final last entry."""
        return replace(self, state=CLOSED, last_entry_id=last_entry_id)

    # -- encoding -------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """to_bytes encodes the metadata as JSON for the metadata store."""
        doc = {
            "ledger_id": self.ledger_id, "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum, "ack_quorum": self.ack_quorum,
            "state": self.state, "last_entry_id": self.last_entry_id,
            "digest_type": self.digest_type, "password_check": self.password_check,
            "created_ms": self.created_ms,
            "ensembles": [[first, list(self.ensembles[first])] for first in self.fragment_starts],
            "custom": dict(self.custom),
        }
        if self.owner:
            doc["owner"] = self.owner
        if self.disks:
            doc["disks"] = [[first, list(self.disks[first])] for first in sorted(self.disks)]
        if self.guaranteed_write_quorum:
            doc["guaranteed_write_quorum"] = True
        if self.unbounded:
            # Fragments accumulate over an unbounded ledger's life: each names its bookies by
            # their index in one list, so a fragment costs a few bytes, not three addresses.
            names = sorted(self.bookies)
            index = {name: i for i, name in enumerate(names)}
            doc.update(unbounded=True, term=self.term, first_entry_id=self.first_entry_id, bookies=names,
                       ensembles=[[first, [index[b] for b in self.ensembles[first]]] for first in self.fragment_starts])
            if self.term_holder:
                doc["term_holder"] = self.term_holder
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "LedgerMetadata":
        """from_bytes decodes metadata written by `to_bytes`.

        A field it does not know (metadata written by a newer walkit: `term_holder` came with
        2026-11's unbounded-ledger fix) is refused with ConfigError rather than dropped: a
        client that rewrote the record without it could undo what it guards.
        """
        try:
            return cls._decode(json.loads(data))
        except ConfigError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise ConfigError(f"ledger metadata does not decode: {type(exc).__name__}: {exc}") from None

    @classmethod
    def _decode(cls, doc) -> "LedgerMetadata":
        unknown = sorted(set(doc) - set(cls.__dataclass_fields__) - {"bookies"})
        if unknown:
            raise ConfigError(f"ledger metadata has fields this walkit does not know ({', '.join(unknown)}): "
                              f"a newer walkit wrote it; upgrade this one")
        names = doc.pop("bookies", None)
        if "disks" in doc:
            doc["disks"] = {int(first): tuple(disks) for first, disks in doc["disks"]}
        if names is None:
            doc["ensembles"] = {int(first): tuple(bookies) for first, bookies in doc["ensembles"]}
        else:
            doc["ensembles"] = {int(first): tuple(names[i] for i in bookies) for first, bookies in doc["ensembles"]}
        return cls(**doc)


def _with_disks(disks: Mapping[int, tuple[int, ...]], first: int,
                new: tuple[int, ...] | None) -> dict[int, tuple[int, ...]]:
    """_with_disks is `disks` with the fragment at `first` recording `new` (nothing if no disk is known)."""
    result = dict(disks)
    if new is None or not any(new):
        result.pop(first, None)
    else:
        result[first] = tuple(new)
    return result
