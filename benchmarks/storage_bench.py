"""Group-commit throughput of the bookie storages against the disk's raw write + fdatasync limit.

    python benchmarks/storage_bench.py --size 1024 --groups 1,10,100,1000 --runs 3 --json out.json

For each group size G (entries per sync) it times a loop of G `put`s (to four ledgers, as a bookie
serving four writers sees them) then one `sync()` on a fresh storage, for the files journal
(``files://``; ``files-append`` is the same with ``preallocate_mb=0``, its active entry log
grown by appends) and SQLite (``sqlite://``), and, as the limit, a plain file on the same disk
where each batch is one write of the same bytes the journal writes for G entries (record
headers included) followed by ``os.fdatasync``. It reports entries/s,
syncs (fsyncs) per second, MB/s of payload and the ratio to raw. Each configuration runs about
`--entries` entries (at least 20 and at most `--max-syncs` syncs). The machine is shared and
noisy, so every figure is the median over `--runs` runs. Results are printed and written as
JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from walkit.plugins import open_storage
from walkit.plugins.storage.files.journal import encode_put

BACKENDS = {
    "files": lambda folder: open_storage(f"files://{folder}/files"),
    # the same with its active entry log grown by appends, not preallocated: the baseline of preallocate_mb
    "files-append": lambda folder: open_storage(f"files://{folder}/files?preallocate_mb=0"),
    "sqlite": lambda folder: open_storage(f"sqlite://{folder}/sqlite/bookie.db"),
}


def syncs_for(group: int, args) -> int:
    """syncs_for returns how many group commits a configuration runs."""
    return max(20, min(args.max_syncs, args.entries // group))


def run_raw(folder: str, group: int, syncs: int, size: int) -> float:
    """run_raw times `syncs` batches of write + fdatasync of G journal records' bytes; returns seconds."""
    batch = bytearray()
    for entry_id in range(group):
        encode_put(batch, 1, entry_id, os.urandom(size))
    fd = os.open(os.path.join(folder, "raw"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        began = time.perf_counter()
        for _ in range(syncs):
            os.write(fd, batch)
            os.fdatasync(fd)
        return time.perf_counter() - began
    finally:
        os.close(fd)


def run_storage(backend: str, folder: str, group: int, syncs: int, size: int) -> float:
    """run_storage times `syncs` groups of G puts and one sync on a fresh storage; returns seconds."""
    storage = BACKENDS[backend](folder)
    payloads = [os.urandom(size) for _ in range(16)]
    try:
        n = 0
        began = time.perf_counter()
        for _ in range(syncs):
            for _ in range(group):                   # four ledgers, each with consecutive entry ids
                storage.put(1 + n % 4, n // 4, payloads[n % 16])
                n += 1
            storage.sync()
        return time.perf_counter() - began
    finally:
        storage.close()


def measure(args) -> list[dict]:
    """measure runs every (backend, group) configuration once and returns one row each."""
    rows = []
    for group in args.groups:
        syncs = syncs_for(group, args)
        for backend in ["raw", *args.backends]:
            folder = tempfile.mkdtemp(prefix="storage-bench-", dir=args.dir)
            try:
                if backend == "raw":
                    seconds = run_raw(folder, group, syncs, args.size)
                else:
                    seconds = run_storage(backend, folder, group, syncs, args.size)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            entries = group * syncs
            rows.append({"backend": backend, "group": group, "entries": entries, "syncs": syncs,
                         "seconds": seconds, "entries_per_s": entries / seconds, "fsyncs_per_s": syncs / seconds,
                         "mb_per_s": entries * args.size / seconds / 1e6})
    return rows


def medians(runs: list[list[dict]]) -> list[dict]:
    """medians folds several runs into one row per configuration, with the ratio to raw."""
    result = []
    for rows in zip(*runs):
        row = dict(rows[0])
        for key in ("seconds", "entries_per_s", "fsyncs_per_s", "mb_per_s"):
            row[key] = statistics.median(r[key] for r in rows)
        result.append(row)
    raw = {row["group"]: row["entries_per_s"] for row in result if row["backend"] == "raw"}
    for row in result:
        row["ratio_to_raw"] = row["entries_per_s"] / raw[row["group"]]
    return result


def main() -> None:
    """main parses the arguments, runs the benchmark and prints (and optionally saves) the results."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1024, help="entry bytes")
    parser.add_argument("--groups", type=lambda s: [int(g) for g in s.split(",")], default=[1, 10, 100, 1000],
                        help="entries per sync, comma-separated")
    parser.add_argument("--backends", type=lambda s: s.split(","), default=["files", "files-append", "sqlite"])
    parser.add_argument("--entries", type=int, default=50_000, help="entries per configuration (about)")
    parser.add_argument("--max-syncs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: the system temp dir)")
    parser.add_argument("--json", default=None, help="write results to this file")
    args = parser.parse_args()

    runs = [measure(args) for _ in range(args.runs)]
    result = medians(runs)
    where = args.dir or tempfile.gettempdir()
    print(f"{args.size} B entries, median of {args.runs} runs, in {where}")
    print(f"{'backend':12} {'group':>6} {'entries/s':>12} {'fsyncs/s':>10} {'MB/s':>8} {'vs raw':>7}")
    for row in result:
        print(f"{row['backend']:12} {row['group']:>6} {row['entries_per_s']:>12,.0f} {row['fsyncs_per_s']:>10,.0f} "
              f"{row['mb_per_s']:>8.1f} {row['ratio_to_raw']:>7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if k != "json"}, "median": result,
                       "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
