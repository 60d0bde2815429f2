"""Where slots are led: `preferred` (rendezvous hashing) moves only the slots of a broker that dies or joins."""

from __future__ import annotations

from collections import Counter

from walkit.adapters.topics.ownership import Slot, preferred

SLOTS = [Slot("orders", p) for p in range(300)] + [Slot(None, b) for b in range(50)]


def test_a_broker_that_dies_moves_only_its_own_slots_and_spreads_them_over_the_survivors():
    before = {slot: preferred(slot, [1, 2, 3, 4], 1) for slot in SLOTS}
    after = {slot: preferred(slot, [1, 2, 4], 1) for slot in SLOTS}
    moved = [slot for slot in SLOTS if before[slot] != after[slot]]
    assert moved and all(before[slot] == 3 for slot in moved)
    assert all(after[slot] != 3 for slot in SLOTS)
    assert set(Counter(after[slot] for slot in moved)) == {1, 2, 4}


def test_a_broker_that_joins_takes_slots_from_the_others_and_no_other_slot_moves():
    before = {slot: preferred(slot, [1, 2, 3], 1) for slot in SLOTS}
    after = {slot: preferred(slot, [1, 2, 3, 7], 1) for slot in SLOTS}
    moved = [slot for slot in SLOTS if before[slot] != after[slot]]
    assert moved and all(after[slot] == 7 for slot in moved)


def test_slots_spread_over_the_brokers_and_the_choice_ignores_the_order_of_the_list():
    counts = Counter(preferred(slot, [1, 2, 3], 1) for slot in SLOTS)
    assert min(counts.values()) > len(SLOTS) / 3 * 0.75, counts
    assert all(preferred(slot, [3, 1, 2], 1) == preferred(slot, [1, 2, 3], 1) for slot in SLOTS)
    assert preferred(SLOTS[0], [], 5) == 5
