"""Logs end to end: single writer with fencing across processes, following readers, crash points, truncation."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

import walkit
from walkit.core.loglist import Position
from walkit.errors import LedgerFenced, NoSuchLedger

pytestmark = pytest.mark.slow

WRITER = os.path.join(os.path.dirname(__file__), "log_writer_process.py")


def start_writer(url: str, name: str, prefix: str, count: int, *extra: str, crash_at: str | None = None,
                 stderr=None):
    env = dict(os.environ)
    if crash_at:
        env["WALKIT_FAILPOINTS"] = f"{crash_at}=kill"
    return subprocess.Popen([sys.executable, WRITER, url, name, prefix, str(count), *extra],
                            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)


def acked_records(lines) -> list[tuple[Position, bytes]]:
    out = []
    for line in lines:
        if line.startswith("acked "):
            _, position, payload = line.split()
            out.append((Position.parse(position), payload.encode()))
    return out


def test_second_writer_fences_the_first_and_readers_see_both_in_order(local_cluster, tmp_path):
    url = local_cluster.metadata_url
    errors = open(tmp_path / "writer.stderr", "w+")
    first = start_writer(url, "orders", "A", 0, stderr=errors)
    try:
        lines = []
        for line in first.stdout:
            lines.append(line)
            if len(acked_records(lines)) >= 200:
                break
        with walkit.Client(url) as client:
            second = client.open_log("orders")
            # The rest is read through first.stdout, whose buffer may hold lines already read from the
            # pipe: communicate(timeout=...) would read the pipe around it and lose them.
            first.wait(timeout=60)                            # fenced at its next append: a few lines more
            rest = first.stdout.read().splitlines()
            errors.seek(0)
            assert rest[-1] == "fenced", errors.read()       # the first writer's append raised LedgerFenced
            a_acked = acked_records(lines + rest)
            b_positions = [second.append(f"B-{i}".encode()) for i in range(100)]
            second.close()
            records = [(r.position, r.payload) for r in client.read_log("orders")]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        errors.close()
    payloads = [p for _, p in records]
    a_part = [p for p in payloads if p.startswith(b"A-")]
    b_part = [p for p in payloads if p.startswith(b"B-")]
    assert payloads == a_part + b_part                         # every A record comes before every B record
    assert a_part[:len(a_acked)] == [p for _, p in a_acked]    # every acked A record, in order
    assert a_part == [f"A-{i}".encode() for i in range(len(a_part))]
    assert b_part == [f"B-{i}".encode() for i in range(100)]
    assert [pos for pos, _ in records] == sorted(pos for pos, _ in records)
    assert [pos for pos, p in records if p.startswith(b"B-")] == b_positions


def test_follower_sees_every_record_once_across_roll_and_handover(local_cluster):
    url = local_cluster.metadata_url
    with walkit.Client(url) as client_a, walkit.Client(url) as client_b, walkit.Client(url) as follower_client:
        writer_a = client_a.open_log("events", roll_entries=40)
        seen: list[bytes] = []
        done = threading.Event()

        def follow() -> None:
            for record in follower_client.read_log("events", follow=True, poll=0.2):
                seen.append(record.payload)
                if record.payload == b"B-29":
                    done.set()
                    return

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        a_records = [f"A-{i}".encode() for i in range(100)]            # 100 records: two rolls
        for payload in a_records:
            writer_a.append(payload)
        assert len(client_a.log_metadata("events").segments) >= 3
        writer_b = client_b.open_log("events")                          # handover: fences A
        with pytest.raises(LedgerFenced):
            writer_a.append(b"A-late")
        b_records = [f"B-{i}".encode() for i in range(30)]
        for payload in b_records:
            writer_b.append(payload)
        assert done.wait(30), f"the follower stopped after {len(seen)} records"
        thread.join(10)
        writer_b.close()
    assert seen == a_records + b_records


@pytest.mark.parametrize("crash_at", ["log.open.after_create", "log.roll.after_create", "log.roll.after_cas"])
def test_writer_killed_at_a_failpoint_loses_nothing_acked(local_cluster, crash_at):
    url = local_cluster.metadata_url
    if crash_at == "log.open.after_create":
        setup = start_writer(url, "crashy", "A", 25)                    # a first writer finishes normally
        assert setup.communicate(timeout=60)[0].splitlines()[-1].startswith("acked")
        victim = start_writer(url, "crashy", "V", 5, crash_at=crash_at)  # dies while opening
    else:
        victim = start_writer(url, "crashy", "A", 25, "roll", crash_at=crash_at)
    output = victim.communicate(timeout=60)[0].splitlines()
    assert victim.returncode == -9, output                            # SIGKILLed at the fault point
    assert "rolled" not in output
    with walkit.Client(url) as client:
        acked = [p for _, p in acked_records(output)]
        writer = client.open_log("crashy")                               # the next writer opens cleanly
        after = writer.append(b"after-crash")
        writer.close()
        payloads = [r.payload for r in client.read_log("crashy")]
    if crash_at == "log.open.after_create":
        assert acked == []
        assert payloads == [f"A-{i}".encode() for i in range(25)] + [b"after-crash"]
    else:
        assert acked == [f"A-{i}".encode() for i in range(25)]
        assert payloads == acked + [b"after-crash"]
    assert after.ledger_id > max(p.ledger_id for p, _ in acked_records(output) or [(Position(-1, 0), b"")])


def test_truncate_removes_only_whole_ledgers_before_the_position(local_cluster):
    with walkit.Client(local_cluster.metadata_url) as client:
        writer = client.open_log("trimmed", roll_entries=10)
        positions = [writer.append(f"r{i}".encode()) for i in range(35)]   # ledgers of 10, 10, 10, 5
        ledgers = sorted({p.ledger_id for p in positions})
        assert len(ledgers) == 4
        cut = positions[15]                                                # inside the second ledger
        deleted = writer.truncate(before=cut)
        assert deleted == [ledgers[0]]
        assert writer.truncate(before=Position(ledgers[1], 0)) == []      # nothing ends before the ledger's start
        writer.close()
        remaining = [r.payload for r in client.read_log("trimmed")]
        assert remaining == [f"r{i}".encode() for i in range(10, 35)]      # r10..r14 stay: same ledger as the cut
        assert ledgers[0] not in client.log_metadata("trimmed").ledger_ids
        with pytest.raises(NoSuchLedger):
            client.ledger_metadata(ledgers[0])
