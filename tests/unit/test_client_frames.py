"""The client splits what it sends one bookie into frames the bookie takes whole (by count and bytes)."""

from __future__ import annotations

import random

from walkit.client.loop import frames_of
from walkit.core.messages import FRAME_BUDGET, AddRequest, Entry, ReadLacRequest, ReadRequest, encoded_size
from walkit.wire.codec import DEFAULT_MAX_FRAME, DEFAULT_MAX_REQUESTS, encode_requests


def random_request(rng: random.Random, txn: int):
    kind = rng.choice(["add", "add", "read", "lac"])
    if kind == "add":
        entries = [Entry(7, i, i - 1, rng.randbytes(rng.choice([0, 4, 32])), rng.randbytes(rng.choice([0, 1, 100, 5000])))
                   for i in range(rng.randint(1, 40))]
        return AddRequest(txn=txn, ledger_id=7, master_key=rng.randbytes(32), entries=entries, lafr=rng.randint(-1, 9),
                          term=rng.randint(0, 3), recovery=rng.random() < 0.5)
    if kind == "read":
        return ReadRequest(txn=txn, ledger_id=7, entry_ids=list(range(rng.randint(0, 300))), fence=True,
                           master_key=rng.randbytes(32))
    return ReadLacRequest(txn=txn, ledger_id=7, fence=True, master_key=rng.randbytes(32))


def test_the_size_estimate_bounds_the_encoded_size_from_above():
    rng = random.Random(5)
    for txn in range(1, 400):
        request = random_request(rng, txn)
        assert len(encode_requests([request])) <= encoded_size(request)


def test_frames_keep_order_and_stay_under_the_count_and_the_budget():
    rng = random.Random(9)
    requests = [random_request(rng, txn) for txn in range(1, 3000)]
    frames = list(frames_of(requests, max_requests=50, budget=200_000))
    assert [r for frame in frames for r in frame] == requests
    for frame in frames:
        assert len(frame) <= 50
        assert len(frame) == 1 or len(encode_requests(frame)) <= 200_000


def test_large_adds_to_one_bookie_go_in_frames_below_the_frame_limit():
    payload = bytes(20 << 20)
    adds = [AddRequest(txn=i, ledger_id=1, master_key=bytes(32), entries=[Entry(1, i, i - 1, bytes(4), payload)])
            for i in range(1, 6)]                              # 100 MiB for one bookie in one round
    frames = list(frames_of(adds))
    assert [len(f) for f in frames] == [3, 2]
    assert all(len(encode_requests(f)) <= DEFAULT_MAX_FRAME for f in frames)
    assert FRAME_BUDGET < DEFAULT_MAX_FRAME


def test_many_small_requests_split_by_count():
    reads = [ReadRequest(txn=i, ledger_id=1, entry_ids=[i]) for i in range(1, 10_000)]
    assert [len(f) for f in frames_of(reads)][:2] == [DEFAULT_MAX_REQUESTS, DEFAULT_MAX_REQUESTS]


def test_the_dispatcher_splits_an_add_too_large_for_a_frame_into_requests_that_fit():
    """A writer's adds to one bookie (many tiny entries, each costing more on the wire than its
    payload) become several requests, each below a frame, each ending once with its own answer."""
    from walkit.core import events as ev
    from walkit.core.dispatch import Dispatcher
    dispatcher = Dispatcher()
    entries = [Entry(7, i, i - 1, bytes(4), bytes(1)) for i in range(1_000_000)]       # ~69 MB on the wire
    dispatcher.execute("writer", [ev.SendAdds(bookie="b1", ledger_id=7, master_key=bytes(32), entries=entries)])
    requests = dispatcher.take_requests()["b1"]
    assert len(requests) > 1 and [e for r in requests for e in r.entries] == entries
    assert all(encoded_size(r) <= FRAME_BUDGET for r in requests)
    assert len({r.txn for r in requests}) == len(requests)
