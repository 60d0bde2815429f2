"""python -m walkit.testing.sim --seed N [--log | --unbounded | --replica] [--hard] [--trace]: replay one simulator run.

Runs the ledger scenario (the log scenario with --log, the unbounded-ledger battle with
--unbounded, walkit.replicate nodes with --replica) for seed N and prints its summary, or the
violated invariant with the trace that led to it. `--hard` draws the seed's configuration from the
hostile end of every range, as CI's runs do (tests/sim, `--sim-draw hard`). `--seeds N` runs seeds
0..N-1 and reports the first failure and the rate.
"""

from __future__ import annotations

import argparse
import sys
import time

from walkit.testing.sim import InvariantViolation, LogSimulation, ReplicaSimulation, Simulation, UnboundedSimulation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m walkit.testing.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, help="replay this seed")
    parser.add_argument("--seeds", type=int, default=0, help="run seeds 0..N-1")
    parser.add_argument("--log", action="store_true", help="the log scenario (default: the ledger scenario)")
    parser.add_argument("--unbounded", action="store_true", help="writers battling for an unbounded ledger")
    parser.add_argument("--replica", action="store_true", help="walkit.replicate nodes under faults")
    parser.add_argument("--hard", action="store_true", help="draw from the hostile end of every range (CI's draw)")
    parser.add_argument("--trace", action="store_true", help="print the trace of a passing run too")
    args = parser.parse_args(argv)
    scenario = (UnboundedSimulation if args.unbounded else LogSimulation if args.log
                else ReplicaSimulation if args.replica else Simulation)
    seeds = [args.seed] if args.seed is not None else range(args.seeds)
    started = time.monotonic()
    for seed in seeds:
        sim = scenario(seed, hard=args.hard)
        try:
            summary = sim.run()
        except InvariantViolation as violation:
            print(violation)
            return 1
        if args.seed is not None:
            print(summary)
            if args.trace:
                print("\n".join(sim.trace))
    elapsed = time.monotonic() - started
    if args.seed is None:
        print(f"{len(seeds)} seeds passed in {elapsed:.1f} s ({len(seeds) / max(elapsed, 1e-9):.0f} seeds/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
