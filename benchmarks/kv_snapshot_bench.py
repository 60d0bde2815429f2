"""How long a KV snapshot holds up the records being applied, against copying the state (the format 1 way).

    python benchmarks/kv_snapshot_bench.py [--keys 300000] [--rounds 5]

A store of --keys string keys (and a few large hashes) is built in one KVMachine. Each round
measures, on this machine and in this run:

- baseline: the time to copy the keyspace's dict, which is what the snapshot of format 1 did on
  the apply thread, between two records;
- open: the time `snapshot()` holds the apply thread now (it opens a view and copies WATCH's
  window of changes);
- longest gap: while the snapshot is written on another thread, records are applied on this
  one without a pause; the longest time between two applies is the stall a client sees (the
  writer takes the lock for one chunk of SNAPSHOT_CHUNK keys at a time);
- quiet gap: the longest time between two of as many applies with no snapshot being written
  (the collector's pauses and the machine's noise, which the gap above includes too).

The process tunes the collector as `walkit kv serve` does (walkit.tune_gc).

It prints the medians over the rounds and their ratios to the baseline.
"""

from __future__ import annotations

import argparse
import io
import statistics
import threading
import time

import walkit
from walkit import Position
from walkit.adapters.kv.machine import KVMachine
from walkit.adapters.kv.records import command_record

STAMP = 1_700_000_000_000


def build(keys: int) -> KVMachine:
    machine = KVMachine()
    position = Position(1, 0)
    for i in range(keys):
        machine.apply(command_record(STAMP, [b"SET", b"key:%08d" % i, b"v" * 64]), position)
    for h in range(10):
        machine.apply(command_record(STAMP, [b"HSET", b"hash:%d" % h,
                                             *(x for f in range(1000) for x in (b"f%d" % f, b"x"))]), position)
    return machine


def applies(machine: KVMachine, count: int, until=None) -> list[float]:
    """applies applies SETs (`count` of them, or while `until()`) and returns the gaps between them."""
    gaps, last, i = [], time.perf_counter(), 0
    position = Position(1, 0)
    size = len(machine.state.data)
    while (until() if until is not None else i < count):
        machine.apply(command_record(STAMP, [b"SET", b"key:%08d" % (i * 7919 % size), b"w"]), position)
        now = time.perf_counter()
        gaps.append(now - last)
        last, i = now, i + 1
    return gaps


def one_round(machine: KVMachine) -> tuple[float, float, float, float]:
    started = time.perf_counter()
    copied = dict.copy(machine.state.data)
    baseline = time.perf_counter() - started
    del copied
    out = io.BytesIO()
    started = time.perf_counter()
    persist = machine.snapshot(out)
    opened = time.perf_counter() - started
    writer = threading.Thread(target=persist)
    writer.start()
    gaps = applies(machine, 0, writer.is_alive)
    writer.join()
    quiet = applies(machine, len(gaps))
    return baseline, opened, max(gaps, default=0.0), max(quiet, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    walkit.tune_gc()
    machine = build(options.keys)
    results = [one_round(machine) for _ in range(options.rounds)]
    baseline, opened, gap, quiet = (statistics.median(column) for column in zip(*results))
    print(f"{options.keys:,} keys, {options.rounds} rounds, medians:")
    print(f"  baseline: copying the keyspace (format 1's snapshot)  {baseline * 1000:8.2f} ms")
    print(f"  opening a snapshot now (the apply thread waits)      {opened * 1000:8.2f} ms  "
          f"({opened / baseline:.3f}x the baseline)")
    print(f"  longest gap between applies while it is written      {gap * 1000:8.2f} ms  "
          f"({gap / baseline:.3f}x the baseline)")
    print(f"  longest gap between as many applies, no snapshot     {quiet * 1000:8.2f} ms")


if __name__ == "__main__":
    main()
