"""walkit.testing.sim runs the sans-IO core under seeded faults and checks invariants after every step.

Two scenarios share one simulated world (walkit.testing.sim.world: bookies, network, metadata
store and client processes, all driven by a seed):

- `Simulation` (walkit.testing.sim.ledger): one ledger written, recovered by racing and
  crashing recoverers, tailed by LAC readers and read back;
- `LogSimulation` (walkit.testing.sim.log): a log with several writers that open, append, roll,
  truncate, close and crash (also at the named failpoints), and followers tailing it;
- `UnboundedSimulation` (walkit.testing.sim.unbounded): writers battling for one unbounded
  ledger across terms (docs/internals/protocol.md#unbounded-ledgers), and `seed_001_counterexample`,
  the log divergence of docs/internals/protocol.md#log-divergence scripted;
- `ReplicaSimulation` (walkit.testing.sim.replica): walkit.replicate nodes (ReplicaMachine)
  under partitions, session expiry, clock drift, crashes and snapshots, with clients that retry
  exactly-once submits and read; and `partitioned_leader`, issue 40's partition scripted.

A failing seed is a one-line reproduction: ``pytest tests/sim --seed N`` or
``python -m walkit.testing.sim --seed N [--log | --unbounded]``.
"""

from walkit.testing.sim.ledger import SHAPES, SimConfig, Simulation
from walkit.testing.sim.log import LogSimConfig, LogSimulation
from walkit.testing.sim.replica import ReplicaSimConfig, ReplicaSimulation, partitioned_leader
from walkit.testing.sim.unbounded import UnboundedSimConfig, UnboundedSimulation, seed_001_counterexample
from walkit.testing.sim.world import InvariantViolation, VolatileStorage, World

__all__ = ["InvariantViolation", "LogSimConfig", "LogSimulation", "ReplicaSimConfig", "ReplicaSimulation", "SHAPES",
           "SimConfig", "Simulation", "partitioned_leader",
           "UnboundedSimConfig", "UnboundedSimulation", "VolatileStorage", "World", "seed_001_counterexample"]
