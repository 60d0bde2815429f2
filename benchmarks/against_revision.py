"""`walkit bench` of this checkout against an earlier revision, in one run, as a ratio.

    python benchmarks/against_revision.py 47dbedb --rounds 5 [--entries 50000 --window 1000]

This machine's speed moves by half from one hour to the next, so a figure measured today says
little against one measured last week. This script measures both sides now: it checks REVISION
out into a temporary git worktree, installs it into a virtual environment of its own (pip, with
the bench extra), then alternates `walkit bench --runs 1` of the installed walkit (this
checkout, with `pip install -e .`) and of REVISION, ROUNDS times each, so both see the same
machine, and prints the median of each figure and the ratio now / then. Figures a revision's
bench does not report are left out of its column (earlier revisions had no append_many phase,
and their catch-up read did not drop the page cache, so it counts as a warm one).
The worktree and the environment are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

def _at(*path: str):
    """_at reads the figure at `path` of walkit bench's JSON (None where a revision does not report it)."""
    def read(result: dict) -> float | None:
        for key in path:
            if not isinstance(result, dict) or key not in result:
                return None
            result = result[key]
        return float(result)
    return read


def _cold_read(result: dict) -> float | None:
    read = result.get("catch_up_read", {})
    return _at("median", "entries_per_s")(read) if read.get("cold") else None


def _warm_read(result: dict) -> float | None:
    """_warm_read is the warm catch-up read; a revision that never dropped the page cache read warm only."""
    if "catch_up_read_warm" in result:
        return _at("catch_up_read_warm", "median", "entries_per_s")(result)
    if result.get("catch_up_read", {}).get("cold"):
        return None
    return _at("catch_up_read", "median", "entries_per_s")(result)


#: (label, how to read it from walkit bench's JSON, True if higher is better)
FIGURES = (
    ("appends/s, window in flight", _at("append", "median", "entries_per_s"), True),
    ("appends p99 ms", _at("append", "median", "p99_ms"), False),
    ("append_many entries/s", _at("append_many", "median", "entries_per_s"), True),
    ("one in flight p50 ms", _at("one_in_flight", "median", "p50_ms"), False),
    ("one in flight p99 ms", _at("one_in_flight", "median", "p99_ms"), False),
    ("catch-up read/s, cold page cache", _cold_read, True),
    ("catch-up read/s, warm", _warm_read, True),
)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.3f}"


def _bench(python: str, args: list[str], out: str) -> dict:
    command = [python, "-m", "walkit", "bench", "--runs", "1", "--json", out, *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def _install(revision: str, folder: str) -> str:
    """_install checks `revision` out under `folder` and installs it in a venv there; it returns its python."""
    repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    tree, venv = os.path.join(folder, "tree"), os.path.join(folder, "venv")
    subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", tree, revision], check=True,
                   capture_output=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e", f"{tree}[bench]"],
                   check=True)
    return python


def _remove(folder: str) -> None:
    tree = os.path.join(folder, "tree")
    if os.path.isdir(tree):
        subprocess.run(["git", "-C", tree, "worktree", "remove", "--force", tree], capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", help="the earlier revision (a commit, tag or branch)")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each side, alternated")
    parser.add_argument("--entries", type=int, default=50_000)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--json", default=None, help="also write every run's figures to this file")
    args = parser.parse_args()
    bench_args = ["--entries", str(args.entries), "--window", str(args.window)]
    folder = tempfile.mkdtemp(prefix="walkit-against-")
    runs: dict[str, list[dict]] = {"now": [], "then": []}
    try:
        then_python = _install(args.revision, folder)
        for round_ in range(args.rounds):
            for side, python in (("now", sys.executable), ("then", then_python)):
                result = _bench(python, bench_args, os.path.join(folder, f"{side}-{round_}.json"))
                runs[side].append({label: read(result) for label, read, _ in FIGURES})
                print(f"round {round_ + 1}/{args.rounds} {side}: {runs[side][-1]}", file=sys.stderr)
    finally:
        _remove(folder)
    print(f"walkit bench {' '.join(bench_args)}, medians of {args.rounds} alternated runs each")
    print(f"{'figure':36} {'now':>12} {args.revision[:12]:>12} {'now/then':>9}")
    table = []
    for label, _, higher in FIGURES:
        now = statistics.median(v) if (v := [r[label] for r in runs["now"] if r[label] is not None]) else None
        then_ = statistics.median(v) if (v := [r[label] for r in runs["then"] if r[label] is not None]) else None
        ratio = f"{now / then_:.2f}x" if now is not None and then_ else "-"
        table.append({"figure": label, "now": now, "then": then_, "higher_is_better": higher})
        print(f"{label:36} {_fmt(now):>12} {_fmt(then_):>12} {ratio:>9}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"revision": args.revision, "table": table, "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
