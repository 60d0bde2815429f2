"""walkit.placement chooses bookies so that each write set spans as many racks as it can.

Bookies register with a rack (or zone): `walkit bookie --rack eu-1a`; bookies without one share
the default rack "". A ledger's entry e is stored on its write set ensemble[(e + i) % E], i < Qw
(walkit.core.distribution), so rack awareness is a property of consecutive ensemble positions,
wrapping around: BookKeeper's RackawareEnsemblePlacementPolicy, with its
`minNumRacksPerWriteQuorum` as `min_racks`.

- `choose_ensemble` orders E bookies so that every write set spans as many racks as possible,
  and raises NotEnoughBookies when some write set would span fewer than `min_racks`;
- `choose_replacement` picks the bookie that replaces one position of an ensemble (ensemble
  changes, re-replication, decommission): the best rack spread for the write sets through that
  position, preferring the replaced bookie's own rack on ties (as BookKeeper's replaceBookie
  does), so the ledger keeps the placement it was created with;
- `spread_order` lists candidates so that neighbours differ in rack, for callers that can only
  take a prefix of a list;
- `write_set_racks` measures an ensemble: the fewest racks any of its write sets spans.

Everything here is pure: bookies come in as {address: rack}, randomness as a `random.Random`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Mapping, Sequence

from walkit.errors import ConfigError, NotEnoughBookies

#: How many randomized greedy attempts `choose_ensemble` makes before it settles for the best.
ATTEMPTS = 32


def racks_of(bookies) -> dict[str, str]:
    """racks_of maps each bookie address to its rack, from {address: BookieInfo} (or rack strings)."""
    return {address: (info if isinstance(info, str) else getattr(info, "rack", "")) for address, info in bookies.items()}


def check_min_racks(min_racks: int, write_quorum: int) -> None:
    """check_min_racks raises ConfigError unless 1 <= min_racks <= write_quorum."""
    if not isinstance(min_racks, int) or isinstance(min_racks, bool) or not 1 <= min_racks <= write_quorum:
        raise ConfigError(f"min_racks must be an integer between 1 and the write quorum ({write_quorum}), "
                          f"got {min_racks!r}")


def write_set_racks(ensemble: Sequence[str], racks: Mapping[str, str], write_quorum: int) -> int:
    """write_set_racks returns the fewest distinct racks that any write set of `ensemble` spans."""
    size = len(ensemble)
    return min(len({racks.get(ensemble[(first + i) % size], "") for i in range(write_quorum)})
               for first in range(size))


def _windows_through(position: int, size: int, write_quorum: int):
    """_windows_through yields the write sets (lists of positions) that contain `position`."""
    for first in range(position - write_quorum + 1, position + 1):
        yield [(first + i) % size for i in range(write_quorum)]


def _score(slots: list, position: int, rack: str, racks_at, size: int, write_quorum: int) -> tuple[int, int]:
    """_score rates `rack` at `position`: (fewest racks of a write set through it, their sum).

    Places of a write set that are still empty count as new racks: they may yet get one.
    """
    worst, total = write_quorum, 0
    for window in _windows_through(position, size, write_quorum):
        seen, empty = {rack}, 0
        for p in window:
            if p == position:
                continue
            if slots[p] is None:
                empty += 1
            else:
                seen.add(racks_at(slots[p]))
        distinct = len(seen) + empty
        worst = min(worst, distinct)
        total += distinct
    return worst, total


def choose_ensemble(bookies: Mapping[str, str], ensemble_size: int, write_quorum: int, *,
                    min_racks: int = 1, rng: random.Random | None = None) -> list[str]:
    """choose_ensemble picks `ensemble_size` bookies of {address: rack}, in write-set order.

    Every write set spans as many racks as the candidates allow (at most Qw); NotEnoughBookies
    says why when there are too few bookies, or when some write set would span fewer than
    `min_racks` racks.
    """
    check_min_racks(min_racks, write_quorum)
    if len(bookies) < ensemble_size:
        raise NotEnoughBookies(f"need {ensemble_size} writable bookies, {len(bookies)} available")
    rng = rng or random.Random()
    best, best_score = None, (-1, -1)
    for _ in range(ATTEMPTS):
        ensemble = _greedy(bookies, ensemble_size, write_quorum, rng)
        score = (write_set_racks(ensemble, bookies, write_quorum), len({bookies[b] for b in ensemble}))
        if score > best_score:
            best, best_score = ensemble, score
        if score[0] >= min(write_quorum, len(set(bookies.values()))):
            break                         # as good as these racks allow
    if best_score[0] < min_racks:
        racks = sorted(set(bookies.values()))
        raise NotEnoughBookies(
            f"cannot spread write sets of {write_quorum} over {min_racks} racks with an ensemble of "
            f"{ensemble_size}: the writable bookies are on {len(racks)} rack(s) "
            f"({', '.join(repr(r) for r in racks)}); the best placement spans {best_score[0]}")
    return best


def _greedy(bookies: Mapping[str, str], size: int, write_quorum: int, rng: random.Random) -> list[str]:
    """_greedy fills positions one by one with the rack that scores best, preferring large racks."""
    free: dict[str, list[str]] = defaultdict(list)
    for address, rack in bookies.items():
        free[rack].append(address)
    for members in free.values():
        rng.shuffle(members)
    slots: list[str | None] = [None] * size
    racks_at = bookies.__getitem__
    for position in range(size):
        options = [rack for rack, members in free.items() if members]
        rng.shuffle(options)
        rack = max(options, key=lambda r: (_score(slots, position, r, racks_at, size, write_quorum), len(free[r])))
        slots[position] = free[rack].pop()
    return slots


def choose_replacement(ensemble: Sequence[str], position: int, candidates: Mapping[str, str], write_quorum: int, *,
                       racks: Mapping[str, str] | None = None, min_racks: int = 1,
                       rng: random.Random | None = None) -> str:
    """choose_replacement picks the bookie of `candidates` ({address: rack}) for ensemble[position].

    `racks` gives the racks of the ensemble's other bookies (default: `candidates` plus the
    default rack). The choice maximizes the racks of the write sets through the position, then
    prefers the replaced bookie's rack, then chance. NotEnoughBookies if no candidate is left
    or if the write sets would span fewer than `min_racks` racks.
    """
    check_min_racks(min_racks, write_quorum)
    options = [b for b in candidates if b not in ensemble]
    if not options:
        raise NotEnoughBookies(f"no writable bookie outside the ensemble {', '.join(ensemble)} can replace "
                               f"{ensemble[position]}")
    rng = rng or random.Random()
    rng.shuffle(options)
    known = {**(racks or {}), **candidates}
    slots = list(ensemble)
    slots[position] = None
    size = len(slots)
    old_rack = known.get(ensemble[position], "")

    def rank(address: str):
        rack = candidates[address]
        return _score(slots, position, rack, lambda b: known.get(b, ""), size, write_quorum), rack == old_rack
    chosen = max(options, key=rank)
    worst = rank(chosen)[0][0]
    if worst < min_racks:
        raise NotEnoughBookies(f"no bookie can replace {ensemble[position]} with write sets on {min_racks} racks "
                               f"(the best choice, {chosen}, gives {worst})")
    return chosen


def spread_order(bookies: Mapping[str, str], rng: random.Random | None = None) -> list[str]:
    """spread_order lists every bookie so that neighbours differ in rack where possible.

    It deals one bookie from each rack in turn, largest racks first, in random order within a
    rack: any prefix of the list is spread over as many racks as the prefix can be.
    """
    rng = rng or random.Random()
    by_rack: dict[str, list[str]] = defaultdict(list)
    for address, rack in bookies.items():
        by_rack[rack].append(address)
    queues = list(by_rack.values())
    for queue in queues:
        rng.shuffle(queue)
    rng.shuffle(queues)
    queues.sort(key=len, reverse=True)
    order: list[str] = []
    while queues:
        for queue in queues:
            order.append(queue.pop())
        queues = [q for q in queues if q]
    return order
