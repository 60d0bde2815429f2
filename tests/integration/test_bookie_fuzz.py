"""A bookie process takes 100,000 hostile frames and still serves a real client (issue 11).

The frames come from `walkit.testing.fuzz.HostileFrames` (seeded: a failure names the seed and
the last kinds sent). Every 500 frames a marker request follows, and the test reads replies
until the marker's answer arrives: a bookie answers one connection's frames in order, so by then
it has handled every frame before it. Every reply must decode; every 5,000 frames a real
`walkit.Client` writes a ledger through this bookie and reads it back, and the process must
still be the one that started.
"""

from __future__ import annotations

import collections
import os

import pytest
import zmq

import walkit
from walkit.core.messages import ReadLacRequest
from walkit.local import LocalCluster
from walkit.testing.fuzz import HostileFrames
from walkit.wire.codec import decode_responses, encode_requests

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("WALKIT_FUZZ_SEED", "20261122"))
FRAMES = int(os.environ.get("WALKIT_FUZZ_FRAMES", "100000"))
CHECK_EVERY = 5000
MARK_EVERY = 500
#: Marker requests use txn ids no fuzz frame is likely to carry.
MARKER_TXN = 0xFEED_0000_0000_0000


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_bookie_survives_100k_hostile_frames_and_serves_a_real_client(tmp_path):
    with LocalCluster(bookies=1, data_dir=str(tmp_path / "cluster"), storage="files") as cluster, \
            walkit.Client(cluster.metadata_url, timeout=20) as client:
        pid = cluster.pid(0)
        socket = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.connect(f"tcp://{cluster.addresses[0]}")
        sent, replies, kinds = 0, 0, collections.Counter()
        recent: collections.deque = collections.deque(maxlen=20)
        rss = [rss_kb(pid)]

        def caught_up(marker: int) -> None:
            """caught_up sends a marker and reads replies until its answer: every earlier frame was handled."""
            nonlocal replies
            socket.send(encode_requests([ReadLacRequest(txn=MARKER_TXN + marker, ledger_id=10**12)]))
            while True:
                assert socket.poll(30_000, zmq.POLLIN), (
                    f"seed {SEED}: no answer to marker {marker} after {sent} frames; last kinds {list(recent)}")
                responses = decode_responses(socket.recv())      # whatever the bookie says is well-formed
                replies += len(responses)
                if any(r.txn == MARKER_TXN + marker for r in responses):
                    return

        def check_serving(round_: int) -> None:
            assert cluster.is_running(0) and cluster.pid(0) == pid, (
                f"seed {SEED}: the bookie died after {sent} frames; last kinds {list(recent)}\n{cluster.log_tail(0)}")
            writer = client.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"pw")
            payloads = [f"round {round_} entry {i}".encode() for i in range(20)]
            for payload in payloads:
                writer.append_async(payload)
            writer.close()
            reader = client.open_ledger(writer.ledger_id, password=b"pw")
            assert [e.payload for e in reader.read()] == payloads
            rss.append(rss_kb(pid))

        check_serving(0)
        try:
            for message in HostileFrames(SEED):
                if sent >= FRAMES:
                    break
                if len(message.frames) == 1:
                    socket.send(message.frames[0])
                else:
                    socket.send_multipart(message.frames)
                sent += 1
                kinds[message.kind] += 1
                recent.append(message.kind)
                if sent % MARK_EVERY == 0:
                    caught_up(sent // MARK_EVERY)
                if sent % CHECK_EVERY == 0:
                    check_serving(sent // CHECK_EVERY)
            check_serving(-1)
        finally:
            socket.close(linger=0)
        assert sent == FRAMES and replies > FRAMES, (sent, replies)
        assert set(kinds) == {"random-bytes", "truncated", "bit-flips", "byte-overwrites", "out-of-range",
                              "amplifier", "segment-table", "multi-part"}
        print(f"\nfuzz seed {SEED}: {sent} frames {dict(kinds)}, {replies} responses, bookie RSS {rss[0]} -> {rss[-1]} kB")
