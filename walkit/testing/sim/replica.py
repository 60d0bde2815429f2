"""walkit.testing.sim.replica: walkit.replicate nodes under seeded faults, checked after every step.

Several nodes of one replicated counter (each a real walkit.core.replica.ReplicaMachine, running
real log writers and readers against the simulated bookies and metadata store) elect a leader,
take submits from clients, apply them, answer reads, snapshot and truncate. The faults are the
world's (bookie crashes, message loss and delay, metadata calls that fail or lose their answer)
plus what a node's own environment does to it:

- its metadata session is SUSPENDED and comes back, or expires on the server (the election
  key goes; a new leader may be elected while the node still thinks it leads) and is LOST when
  the node hears of it. Suspension, expiry and the node learning of it are scheduled
  independently, per node;
- it is cut off from the metadata store only (it still reaches the bookies: the partition of
  issue 40), or from the bookies only, or one way only (its requests arrive, answers do not);
- its clock runs fast or slow within `max_clock_drift`;
- it crashes (also while a snapshot is taken and published) and restarts from the latest
  snapshot.

Clients name their sessions (client id, seq) and retry a submit that failed or got no answer on
another node, with the same seq, until it is acknowledged; they also read, from leaders and
followers. Invariants, after every event:

- every node applies entries in log order, each position once, and the same records at the same
  position as every other node (the reference log is the first node's);
- no record of a client session is applied twice on any node (exactly-once), and every answer
  to a session's submit is its first application's result;
- every read reflects every submit acknowledged before the read was asked (linearizability of
  lease reads and read barriers): the state the node answered from is at or past the position
  of each of them;
- each ledger of the log takes appends from one node only (its recovery's write-backs aside):
  one writer at a time;
- a snapshot's state equals the replay of the log up to its position, and its sessions are the
  reference sessions there;
- at the end (faults stop) a leader serves, every client's submits were all acknowledged, and
  every node applied the same log to the same state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from walkit.core import events as ev
from walkit.core import replicaevents as rev
from walkit.core.batch import Session
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.loglist import LogConfig, Position, log_key
from walkit.core.replica import LEADING, ReplicaConfig, ReplicaMachine
from walkit.errors import MetadataError, NotLeader
from walkit.testing.sim.world import Scenario, World

PASSWORD = b"replica"
NAME = "counter"


@dataclass(frozen=True)
class ReplicaSimConfig:
    """ReplicaSimConfig sets the cluster's shape and how hostile the run is."""

    bookies: int = 4
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    nodes: int = 3
    clients: int = 3
    submits: int = 6                  # per client
    reads: int = 6                    # per client
    drop_rate: float = 0.01
    duplicate_rate: float = 0.01
    max_delay_ms: int = 8
    max_sync_ms: int = 3
    metadata_delay_ms: int = 6
    metadata_fault_rate: float = 0.0
    bookie_crashes: int = 1
    node_crashes: int = 1
    metadata_cuts: int = 1            # a node cut off from the metadata store only
    late_notice: float = 0.5          # share of cuts the node notices (SUSPENDED) only after the server expired it
    script: str = ""                  # a named scenario instead of random faults (see `partitioned_leader`)
    submits_from_ms: int = 0          # no client submits before this (the first leader may never write)
    bookie_cuts: int = 0              # a node cut off from the bookies only (maybe one way)
    session_blips: int = 1            # SUSPENDED and back, without expiry
    session_timeout_ms: int = 300
    lease_ms: int = 120
    max_clock_drift: float = 0.05
    roll_entries: int = 4
    snapshot_rate: float = 0.1        # chance an applied entry is followed by a snapshot
    linger_ms: int = 0
    fault_window_ms: int = 2500
    end_ms: int = 40_000
    request_timeout_ms: int = 100
    add_timeout_ms: int = 150
    tail_poll_ms: int = 300           # the follower's long poll (watches of the log cut it short)
    follow_linger_ms: int = 0         # a caught-up follower's wait before its next long poll

    @classmethod
    def random(cls, rng: random.Random, hard: bool = False) -> "ReplicaSimConfig":
        """random draws a configuration from `rng`; `hard` draws only from the hostile end of each range."""
        # Drawn without consuming `rng` (from its state), so every seed drew what it drew before it existed.
        linger = random.Random(repr(rng.getstate()[1])).choice([0, 5, 20])
        return replace(cls._random(rng, hard), follow_linger_ms=linger)

    @classmethod
    def _random(cls, rng: random.Random, hard: bool) -> "ReplicaSimConfig":
        e, qw, qa = rng.choice([(3, 2, 2), (3, 3, 2), (2, 2, 2), (3, 2, 1)])
        if hard:
            return cls(bookies=e + rng.randint(0, 2), ensemble=e, write_quorum=qw, ack_quorum=qa,
                       nodes=3, clients=rng.randint(2, 3), submits=rng.randint(5, 8),
                       reads=rng.randint(4, 8), drop_rate=rng.choice([0.01, 0.03]),
                       duplicate_rate=0.02, max_delay_ms=rng.choice([8, 20]),
                       metadata_fault_rate=rng.choice([0.0, 0.05]), bookie_crashes=rng.randint(1, 2),
                       node_crashes=rng.randint(1, 2), metadata_cuts=rng.randint(1, 2), bookie_cuts=rng.randint(0, 1),
                       session_blips=rng.randint(1, 2), session_timeout_ms=rng.choice([200, 400]),
                       lease_ms=rng.choice([60, 150]), max_clock_drift=rng.choice([0.05, 0.2]),
                       roll_entries=rng.choice([2, 4]), snapshot_rate=rng.choice([0.05, 0.3]),
                       linger_ms=rng.choice([0, 5]), tail_poll_ms=rng.choice([100, 500, 3000]))
        return cls(bookies=e + rng.randint(0, 2), ensemble=e, write_quorum=qw, ack_quorum=qa,
                   nodes=rng.randint(2, 3), clients=rng.randint(1, 3), submits=rng.randint(2, 8),
                   reads=rng.randint(0, 8), drop_rate=rng.choice([0.0, 0.01, 0.03]),
                   duplicate_rate=rng.choice([0.0, 0.02]), max_delay_ms=rng.choice([2, 8, 20]),
                   metadata_fault_rate=rng.choice([0.0, 0.0, 0.05]), bookie_crashes=rng.randint(0, 2),
                   node_crashes=rng.randint(0, 2), metadata_cuts=rng.randint(0, 2), bookie_cuts=rng.randint(0, 1),
                   session_blips=rng.randint(0, 2), session_timeout_ms=rng.choice([200, 400]),
                   lease_ms=rng.choice([0, 60, 150]), max_clock_drift=rng.choice([0.0, 0.05, 0.2]),
                   roll_entries=rng.choice([2, 4, 50]), snapshot_rate=rng.choice([0.0, 0.05, 0.3]),
                   linger_ms=rng.choice([0, 0, 5]), tail_poll_ms=rng.choice([100, 500, 3000]))


class _Node:
    """_Node is one replica process: its machine, its counter, its session and clock as the world sees them."""

    def __init__(self, sim: "ReplicaSimulation", name: str, process, machine: ReplicaMachine, rate: float) -> None:
        self.sim = sim
        self.name = name
        self.process = process
        self.machine = machine
        self.rate = rate                     # its clock's speed (drift)
        self.offset = sim.world.now
        self.value = 0                       # the counter
        self.position: Position | None = None
        self.applied_sessions: set[tuple[str, int]] = set()
        self.campaigning = False
        self.reads: dict[int, tuple] = {}    # read token -> (client, asked at, upto: a wait_applied's position)
        self.submits: dict[int, tuple] = {}  # submit token -> (client, seq)
        self.metadata_cut = False
        self.bookie_cut: str | None = None   # None, "both", "requests" (its requests lost), "answers"
        self.session_alive = True            # as the server sees it
        self.session_known = "CONNECTED"     # as the node was told
        self.subs: dict[str, "_Sub"] = {}
        self.apply_free_at = 0               # when its apply thread is done with what it was handed

    def now(self) -> int:
        return int(self.offset + (self.sim.world.now - self.offset) * self.rate)

    def outcome(self, command) -> None:
        self.sim._node_command(self, command)


class _Sub:
    """_Sub is the owner of one sub-machine's I/O (a log writer or reader the node's machine runs)."""

    def __init__(self, node: _Node, key: str) -> None:
        self.node = node
        self.key = key
        self.machine = self

    def step(self, event) -> list:
        return self.node.machine.step(rev.From(self.key, event))

    def outcome(self, command) -> None:
        self.node.sim._node_command(self.node, command)


class ReplicaSimulation(Scenario):
    """ReplicaSimulation is one seeded run of replicated-counter nodes; `run()` returns a summary or raises.

    `machine_cls` lets a test substitute a deliberately broken ReplicaMachine.
    """

    def __init__(self, seed: int, config: ReplicaSimConfig | None = None, machine_cls=ReplicaMachine,
                 hard: bool = False) -> None:
        self.seed = seed
        self.config = cfg = config or ReplicaSimConfig.random(random.Random(seed), hard)
        self.machine_cls = machine_cls
        self.world = world = World(
            seed, bookies=cfg.bookies, drop_rate=cfg.drop_rate, duplicate_rate=cfg.duplicate_rate,
            max_delay_ms=cfg.max_delay_ms, max_sync_ms=cfg.max_sync_ms, metadata_delay_ms=cfg.metadata_delay_ms,
            metadata_fault_rate=cfg.metadata_fault_rate, request_timeout_ms=cfg.request_timeout_ms,
            after_step=self._check)
        world.drops = self._drops
        self._store_call = world.store_call
        world.store_call = self._guarded_store_call
        self._send_request = world.send_request
        world.send_request = self._guarded_send
        self.rng = world.rng
        self.replica_config = ReplicaConfig(
            log=LogConfig(ensemble=cfg.ensemble, write_quorum=cfg.write_quorum, ack_quorum=cfg.ack_quorum,
                          roll_entries=cfg.roll_entries),
            lease_ms=cfg.lease_ms, max_clock_drift=cfg.max_clock_drift, max_entries_in_flight=3,
            linger_ms=cfg.linger_ms, poll_ms=50, tail_poll_ms=cfg.tail_poll_ms, follow_linger_ms=cfg.follow_linger_ms,
            add_timeout_ms=max(cfg.add_timeout_ms, world.request_timeout_ms),
            recovery_timeout_ms=3000, read_timeout_ms=world.request_timeout_ms)
        world.on_store_change = self._on_store_change
        self.digests = {kind: Digest(kind, PASSWORD) for kind in ("crc32c",)}
        self.nodes: dict[str, _Node] = {}
        self.generation = 0
        # the election, as the metadata store holds it
        self.holder: _Node | None = None
        self.first_leader: _Node | None = None
        self.epochs = 0
        self.roles: list[tuple[int, str, str, int]] = []     # (time, node, role, epoch) as each node reported it
        self.candidates: list[_Node] = []
        # what happened
        self.reference: dict[Position, list] = {}         # position -> record ids applied there (first node)
        self.reference_value: dict[Position, int] = {}
        self.reference_sessions: dict[Position, bytes] = {}
        self.first_result: dict[tuple[str, int], tuple] = {}   # (client, seq) -> the first application's result
        self.acked: list[tuple[int, Position]] = []        # (world time, position) of acknowledged submits
        self.writers: dict[int, str] = {}                  # ledger -> the one process that appends to it
        self.snapshot: tuple | None = None                      # (position, value, sessions, applied ids)
        self.clients: dict[str, dict] = {}
        self.tokens = iter(range(1, 1 << 62))
        self.finished = False
        self.reads_checked = 0

    # -- plan ------------------------------------------------------------------------------------
    def _plan(self) -> None:
        cfg, rng, world = self.config, self.rng, self.world
        window = cfg.fault_window_ms
        for i in range(cfg.nodes):
            world.at(rng.randint(0, 100), self._start_node, f"n{i}")
        for c in range(cfg.clients):
            client = f"c{c}"
            # even clients submit for the epoch of the leader that last acknowledged them (SubmitRequested.epoch)
            self.clients[client] = {"seq": 0, "acked": 0, "pending": None, "leader": None,
                                    "epochs": c % 2 == 0, "epoch": None}
            t = max(cfg.submits_from_ms, rng.randint(100, 300))
            for _ in range(cfg.submits):
                t += rng.randint(20, 200)
                world.at(t, self._submit, client)
            for _ in range(cfg.reads):
                world.at(rng.randint(100, window + 500), self._read, client)
        if cfg.script == "partitioned-leader":
            world.at(window // 3, self._cut_leader)
        for _ in range(cfg.bookie_crashes):
            world.at(rng.randint(0, window), self._crash_bookie)
        for _ in range(cfg.node_crashes):
            world.at(rng.randint(200, window), self._crash_node)
        for _ in range(cfg.metadata_cuts):
            world.at(rng.randint(100, window), self._cut_metadata)
        for _ in range(cfg.bookie_cuts):
            world.at(rng.randint(100, window), self._cut_bookies)
        for _ in range(cfg.session_blips):
            world.at(rng.randint(100, window), self._session_blip)
        world.at(window, self._quiet)
        self._tick_every(10)

    def run(self) -> dict:
        """run plays the schedule, checking the invariants after every event."""
        self._plan()
        self.world.run(self.config.end_ms, lambda: self.finished)
        self._check_end()
        return {"seed": self.seed, "config": self.config, "acked": len(self.acked), "reads": self.reads_checked,
                "epochs": self.epochs, "roles": self.roles, "applied": max((n.position for n in self.nodes.values() if n.position),
                                                      default=None)}

    def _tick_every(self, period: int) -> None:
        def tick() -> None:
            for node in list(self.nodes.values()):
                self._tick(node)
            self._end_if_settled()
            self.world.at(period, tick)
        self.world.at(0, tick)

    def _tick(self, node: _Node) -> None:
        if node.process.alive:
            node.process.deliver_all(node.process.dispatcher.tick(self.world.now, self.world.now))
            node.process.deliver(node, ev.Ticked(now_ms=node.now(), wall_ms=self.world.now))

    # -- nodes -------------------------------------------------------------------------------------
    def _start_node(self, name: str) -> None:
        if name in self.nodes and self.nodes[name].process.alive:
            return
        self.generation += 1
        world = self.world
        process = world.process(f"{name}.{self.generation}")
        applied, sessions, value, ids = None, b"", 0, set()
        if self.snapshot is not None:
            applied, value, sessions, ids = self.snapshot
        rate = 1 + self.rng.uniform(-self.config.max_clock_drift, self.config.max_clock_drift)
        machine = self.machine_cls(NAME, name, self.replica_config, master_key=master_key(PASSWORD),
                                   password_check=password_check(PASSWORD), digest_for=self.digests.__getitem__,
                                   password=PASSWORD, applied=applied, sessions=sessions, now_ms=world.now,
                                   wall_ms=world.now)
        node = _Node(self, name, process, machine, rate)
        node.value, node.position, node.applied_sessions = value, applied, set(ids)
        self.nodes[name] = node
        self.log("node %s starts (generation %d) from %s", name, self.generation, applied)
        process.attach(node, machine.start())

    def _node_command(self, node: _Node, command) -> None:
        if not node.process.alive:
            return
        kind = type(command)
        world = self.world
        if kind is rev.Via:
            sub = node.subs.get(command.key)
            if sub is None:
                sub = node.subs[command.key] = _Sub(node, command.key)
            node.process.execute(sub, command.commands)
        elif kind is ev.Failpoint:
            if world.faults and self.rng.random() < 0.05:
                self.log("node %s crashes at failpoint %s", node.name, command.name)
                self._crash(node)
        elif kind is rev.Campaign:
            node.campaigning = True
            if node not in self.candidates:
                self.candidates.append(node)
            world.at(self.rng.randint(1, 20), self._elect)
        elif kind is rev.Resign:
            node.campaigning = False
            if node in self.candidates:
                self.candidates.remove(node)
            if self.holder is node:
                self.log("node %s resigns", node.name)
                self.holder = None
                world.at(self.rng.randint(1, 20), self._elect)
        elif kind is rev.ApplyEntry:              # one apply thread: in the order handed, a group one after another
            delay = max(self.rng.randint(0, 3), node.apply_free_at - world.now)
            node.apply_free_at = world.now + delay
            world.at(delay, self._apply, node, command, node.process)
        elif kind is rev.SnapshotState:
            self._snapshot_taken(node, command)
        elif kind is rev.LoadSnapshot:
            world.at(self.rng.randint(1, 30), self._load_snapshot, node, node.process)
        elif kind is rev.CompleteSubmit:
            self._submit_answered(node, command.token, command.result, None)
        elif kind is rev.FailSubmit:
            self._submit_answered(node, command.token, None, command.error)
        elif kind is rev.ReadReady:
            self._read_answered(node, command)
        elif kind is rev.Wake:
            world.at(max(0, int((command.at_ms - node.now()) / node.rate) + 1), self._tick, node)
        elif kind is rev.RoleChanged:
            self.log("node %s is %s (epoch %s)", node.name, command.role, command.epoch)
            self.roles.append((self.world.now, node.name, command.role, command.epoch))
        elif kind is rev.Unhealthy:
            self.fail(f"node {node.name} is unhealthy: {command.why}")
        elif kind is rev.Stopped or kind is rev.Truncated or kind is rev.AppendsDone or kind is rev.Trouble:
            pass
        else:
            self.fail(f"node {node.name}: unexpected command {command!r}")

    def _crash(self, node: _Node) -> None:
        node.process.crash()
        node.campaigning = False
        if node in self.candidates:
            self.candidates.remove(node)
        self.world.at(self.config.session_timeout_ms, self._expire_session, node)
        if self.world.faults:
            self.world.at(self.rng.randint(200, 800), self._start_node, node.name)

    def _crash_node(self) -> None:
        alive = [n for n in self.nodes.values() if n.process.alive]
        if alive and self.world.faults:
            node = self.rng.choice(alive)
            self.log("node %s CRASHES", node.name)
            self._crash(node)

    # -- the election and sessions -------------------------------------------------------------------
    def _elect(self) -> None:
        if self.holder is not None:
            return
        for node in list(self.candidates):
            if not node.process.alive or not node.campaigning:
                self.candidates.remove(node)
                continue
            if node.metadata_cut or not node.session_alive or node.session_known != "CONNECTED":
                continue
            self.candidates.remove(node)
            node.campaigning = False
            self.holder = node
            self.epochs += 1
            if self.first_leader is None:
                self.first_leader = node
            self.log("node %s is elected (epoch %d)", node.name, self.epochs)
            node.process.deliver(node, rev.Elected(epoch=self.epochs))
            return

    def _expire_session(self, node: _Node) -> None:
        """_expire_session ends the node's session on the server: its election key goes."""
        if not node.session_alive:
            return
        node.session_alive = False
        self.log("the session of node %s EXPIRES on the server", node.name)
        if self.holder is node:
            self.holder = None
            self.world.at(self.rng.randint(1, 20), self._elect)
        if node.process.alive and not node.metadata_cut:
            self.world.at(self.rng.randint(0, 50), self._session_lost, node)

    def _session_lost(self, node: _Node) -> None:
        if not node.process.alive or node.session_known == "LOST":
            return
        node.session_known = "LOST"
        self.log("node %s learns its session is LOST", node.name)
        node.process.session += 1                   # calls in flight fail with SessionLost
        node.process.deliver(node, rev.SessionChanged(state="LOST"))
        node.process.deliver(node, rev.ElectionLost(why="the session expired"))
        self.world.at(self.rng.randint(5, 60), self._new_session, node)

    def _new_session(self, node: _Node) -> None:
        if not node.process.alive or node.metadata_cut:
            return
        node.session_alive = True
        node.session_known = "CONNECTED"
        self.log("node %s has a new session", node.name)
        node.process.deliver(node, rev.SessionChanged(state="CONNECTED"))
        self.world.at(self.rng.randint(1, 20), self._elect)

    def _cut_metadata(self) -> None:
        """_cut_metadata cuts a node off from the metadata store only (it still reaches the bookies)."""
        alive = [n for n in self.nodes.values() if n.process.alive and not n.metadata_cut]
        if not alive or not self.world.faults:
            return
        node = self.holder if self.holder in alive and self.rng.random() < 0.7 else self.rng.choice(alive)
        node.metadata_cut = True
        self.log("node %s is CUT OFF from the metadata store", node.name)
        timeout = self.config.session_timeout_ms
        # The node notices (SUSPENDED) when its client does: before the server expires the session,
        # or after (a paused process, a slow client): the two are independent here.
        late = self.rng.random() < self.config.late_notice
        notice = self.rng.randint(timeout + 1, 2 * timeout) if late else self.rng.randint(timeout // 10, timeout)
        self.world.at(notice, self._suspend, node)
        self.world.at(timeout, self._expire_session, node)
        self.world.at(self.rng.randint(timeout // 2, 3 * timeout), self._heal_metadata, node)

    def _cut_leader(self) -> None:
        """_cut_leader cuts the first leader off from the metadata store only, for good; it notices late (after
        the server expired its session) unless `late_notice` is 0 (then at half the session timeout)."""
        node = self.first_leader
        if node is None or not node.process.alive:
            return
        node.metadata_cut = True
        timeout = self.config.session_timeout_ms
        self.log("the leader %s is CUT OFF from the metadata store (it still reaches the bookies)", node.name)
        self.world.at(timeout, self._expire_session, node)
        self.world.at(2 * timeout if self.config.late_notice else timeout // 2, self._suspend, node)

    def _suspend(self, node: _Node, blip: bool = False) -> None:
        if not blip and not node.metadata_cut:
            return                                   # healed before the node noticed
        if node.process.alive and node.session_known == "CONNECTED":
            node.session_known = "SUSPENDED"
            self.log("node %s: session SUSPENDED", node.name)
            node.process.deliver(node, rev.SessionChanged(state="SUSPENDED"))

    def _heal_metadata(self, node: _Node) -> None:
        node.metadata_cut = False
        self.log("node %s reaches the metadata store again", node.name)
        if not node.process.alive:
            return
        if node.session_alive:
            if node.session_known != "CONNECTED":
                node.session_known = "CONNECTED"
                node.process.deliver(node, rev.SessionChanged(state="CONNECTED"))
            self.world.at(self.rng.randint(1, 20), self._elect)
        else:
            self._session_lost(node)

    def _session_blip(self) -> None:
        alive = [n for n in self.nodes.values() if n.process.alive and not n.metadata_cut]
        if alive and self.world.faults:
            node = self.rng.choice(alive)
            self._suspend(node, blip=True)
            self.world.at(self.rng.randint(10, self.config.session_timeout_ms // 2), self._heal_metadata, node)

    def _guarded_store_call(self, process, call) -> None:
        node = self._node_of(process)
        if node is not None and node.metadata_cut:
            self.world.at(self.rng.randint(1, 20), self._refuse_call, process, call)
            return
        self._store_call(process, call)

    def _refuse_call(self, process, call) -> None:
        if process.alive:
            process.deliver_all(process.dispatcher.store_result(call.call_id, None,
                                                                MetadataError(f"{call.method}: cut off")))
            process.flush()

    def _cut_bookies(self) -> None:
        alive = [n for n in self.nodes.values() if n.process.alive and n.bookie_cut is None]
        if not alive or not self.world.faults:
            return
        node = self.holder if self.holder in alive and self.rng.random() < 0.7 else self.rng.choice(alive)
        node.bookie_cut = self.rng.choice(["both", "requests", "answers"])
        self.log("node %s is CUT OFF from the bookies (%s)", node.name, node.bookie_cut)
        self.world.at(self.rng.randint(100, 600), self._heal_bookies, node)

    def _heal_bookies(self, node: _Node) -> None:
        node.bookie_cut = None
        self.log("node %s reaches the bookies again", node.name)

    def _drops(self, process, bookie: str, message) -> bool:
        node = self._node_of(process)
        if node is None or node.bookie_cut is None:
            return False
        is_answer = hasattr(message, "status")
        return node.bookie_cut == "both" or (node.bookie_cut == "answers") == is_answer

    def _node_of(self, process) -> _Node | None:
        node = self.nodes.get(process.name.split(".")[0])
        return node if node is not None and node.process is process else None

    def _crash_bookie(self) -> None:
        if self.world.faults:
            self.world.crash_bookie(self.rng.choice(sorted(self.world.bookies)))

    def _quiet(self) -> None:
        self.log("faults stop; every node and bookie comes back")
        world = self.world
        world.faults = False
        for address, bookie in world.bookies.items():
            if not bookie.up and not bookie.lost:
                world.restart_bookie(address)
        for node in list(self.nodes.values()):
            if node.metadata_cut:
                self._heal_metadata(node)
            node.bookie_cut = None
            if not node.process.alive:
                self._start_node(node.name)

    # -- applying and snapshots ------------------------------------------------------------------------
    def _apply(self, node: _Node, command: rev.ApplyEntry, process) -> None:
        if node.process is not process or not process.alive:
            return
        position = command.position
        if node.position is not None and position <= node.position:
            self.fail(f"node {node.name} was asked to apply {position} after {node.position}")
        ids, results = [], []
        for record in command.records:
            client, seq, amount = record.decode().split(":")
            key = (client, int(seq))
            if key in node.applied_sessions:
                self.fail(f"node {node.name} applied submit {key} twice (the second at {position})")
            node.applied_sessions.add(key)
            node.value += int(amount)
            ids.append(key)
            results.append((node.value, position))
        node.position = position
        expected = self.reference.get(position)
        if expected is None:
            self.reference[position] = ids
            self.reference_value[position] = node.value
            for key, result in zip(ids, results):
                self.first_result.setdefault(key, result)
        elif expected != ids or self.reference_value[position] != node.value:
            self.fail(f"node {node.name} applied {ids} at {position} (value {node.value}); the first node applied "
                      f"{expected} there (value {self.reference_value[position]})")
        for token, result in zip(command.tokens or (), results):
            if token is not None and token in node.submits:    # answered as applied, as the shell does
                self._submit_answered(node, token, result, None)
        snapshot = command.last and self.world.faults and self.rng.random() < self.config.snapshot_rate
        self.log("node %s applied %s at %s -> %d%s", node.name, ids, position, node.value,
                 " (snapshot)" if snapshot else "")
        process.deliver(node, rev.EntryApplied(position=position, results=results, snapshot=snapshot))

    def _snapshot_taken(self, node: _Node, command: rev.SnapshotState) -> None:
        position = command.position
        if node.position != position:
            self.fail(f"node {node.name} snapshots at {position} but applied up to {node.position}")
        reference = self.reference_sessions.setdefault(position, command.sessions)
        if command.sessions != reference and self.machine_cls.SNAPSHOT_SESSIONS:
            self.fail(f"node {node.name}'s sessions at {position} differ from those another node had there")
        if self.reference_value.get(position) != node.value:
            self.fail(f"snapshot of node {node.name} at {position} has value {node.value}, the log's replay "
                      f"{self.reference_value.get(position)}")
        if self.world.faults and self.rng.random() < 0.1:
            self.log("node %s crashes while publishing its snapshot at %s", node.name, position)
            self._crash(node)
            return
        if self.snapshot is None or self.snapshot[0] < position:
            self.snapshot = (position, node.value, command.sessions, frozenset(node.applied_sessions))
            self.log("node %s published a snapshot at %s", node.name, position)
            if node.machine.role is LEADING:
                self.world.at(self.rng.randint(1, 50), self._truncate, node, position)

    def _truncate(self, node: _Node, position: Position) -> None:
        if node.process.alive:
            node.process.deliver(node, rev.TruncateRequested(before=position))

    def _load_snapshot(self, node: _Node, process) -> None:
        if node.process is not process or not process.alive:
            return
        if self.snapshot is None:
            process.deliver(node, rev.RestoreFailed(error=MetadataError("no snapshot")))
            return
        position, value, sessions, ids = self.snapshot
        if node.position is None or node.position < position:
            node.value, node.position, node.applied_sessions = value, position, set(ids)
        self.log("node %s loads the snapshot at %s", node.name, position)
        process.deliver(node, rev.Restored(position=position, sessions=sessions))

    # -- clients -----------------------------------------------------------------------------------------
    def _target(self, client: str, reading: bool = False) -> _Node | None:
        alive = [n for n in self.nodes.values() if n.process.alive]
        if not alive:
            return None
        if self.config.script == "partitioned-leader":
            # c0 reads from the node that led first, whatever happens to it; every submit (and the
            # others' reads) goes to whoever holds the election now: clients that found the new leader.
            if client == "c0" and reading and self.first_leader is not None:
                return self.first_leader
            if self.holder is not None:
                return self.holder
        known = self.clients[client]["leader"]
        if known in self.nodes and self.nodes[known].process.alive and self.rng.random() < 0.8:
            return self.nodes[known]
        return self.rng.choice(alive)

    def _submit(self, client: str) -> None:
        state = self.clients[client]
        if state["pending"] is not None:
            self.world.at(50, self._submit, client)      # one at a time per client, in order
            return
        state["seq"] += 1
        amount = self.rng.randint(1, 9)
        state["pending"] = (state["seq"], amount)
        self._send_submit(client)

    def _send_submit(self, client: str) -> None:
        state = self.clients[client]
        if state["pending"] is None:
            return
        seq, amount = state["pending"]
        node = self._target(client)
        if node is None:
            self.world.at(50, self._send_submit, client)
            return
        token = next(self.tokens)
        node.submits[token] = (client, seq)
        state["sent"] = (token, node.name, self.world.now)
        self.log("client %s submits %d (seq %d) to %s", client, amount, seq, node.name)
        record = f"{client}:{seq}:{amount}".encode()
        epoch = state["epoch"] if state["epochs"] else None
        node.process.deliver(node, rev.SubmitRequested(token=token, record=record, session=Session(client, seq),
                                                       submitter=client, epoch=epoch))
        core = node.machine
        if epoch is not None and _taken(core, token) and (core.epoch != epoch or core.role is not LEADING):
            self.fail(f"{node.name} took submit token {token} for epoch {epoch} while it leads in epoch {core.epoch} "
                      f"({core.role.name}): a record computed on that epoch's records may be appended without them")
        self.world.at(600, self._submit_timeout, client, token)

    def _submit_timeout(self, client: str, token: int) -> None:
        state = self.clients[client]
        if state["pending"] is not None and state.get("sent", (None,))[0] == token:
            self.log("client %s got no answer to submit token %d; retrying", client, token)
            self._send_submit(client)

    def _submit_answered(self, node: _Node, token: int, result, error) -> None:
        client, seq = node.submits.pop(token, (None, None))
        if client is None:
            self.fail(f"node {node.name} answered submit token {token} twice, or one it was never given")
        state = self.clients[client]
        if error is not None:
            if isinstance(error, NotLeader):
                state["leader"] = state["epoch"] = None
            self.log("client %s: submit %d failed at %s: %r", client, seq, node.name, error)
            if state["pending"] is not None and state["pending"][0] == seq and state.get("sent", (None,))[0] == token:
                self.world.at(self.rng.randint(5, 50), self._send_submit, client)
            return
        first = self.first_result.get((client, seq))
        if first is None or tuple(result) != tuple(first):
            self.fail(f"submit {(client, seq)} was answered {result} by {node.name}; its first application gave {first}")
        value, position = result
        if state["pending"] is not None and state["pending"][0] == seq:
            state["pending"] = None
            state["acked"] = seq
        state["leader"] = node.name
        state["epoch"] = node.machine.epoch
        self.acked.append((self.world.now, position))
        if seq % 2 == 0 and not self.config.script:     # every other acknowledged write: a wait on another node
            self.world.at(0, self._wait_elsewhere, client, node.name, seq, position)
        self.log("client %s: submit %d acknowledged at %s (value %d) by %s", client, seq, position, value, node.name)

    def _read(self, client: str) -> None:
        node = self._target(client, reading=True)
        if node is None:
            return
        token = next(self.tokens)
        node.reads[token] = (client, self.world.now, None)
        self.log("client %s reads from %s", client, node.name)
        node.process.deliver(node, rev.ReadRequested(token=token))

    def _wait_elsewhere(self, client: str, acked_by: str, seq: int, position: Position) -> None:
        """_wait_elsewhere has another node wait until it applied `position` (ReadRequested.upto), as a follower that
        forwarded a write waits for it (node.wait_applied). Which node: by `seq`, so no seed draws differently."""
        others = [n for n in self.nodes.values() if n.process.alive and n.name != acked_by]
        if not others:
            return
        node = others[seq % len(others)]
        token = next(self.tokens)
        node.reads[token] = (client, self.world.now, position)
        self.log("client %s waits for %s to apply %s", client, node.name, position)
        node.process.deliver(node, rev.ReadRequested(token=token, upto=position))

    def _read_answered(self, node: _Node, command: rev.ReadReady) -> None:
        client, asked, upto = node.reads.pop(command.token, (None, None, None))
        if client is None:
            self.fail(f"node {node.name} answered read {command.token} twice, or one it was never asked")
        if upto is not None:
            self.reads_checked += 1
            if command.applied is None or command.applied < upto or node.position is None or node.position < upto:
                self.fail(f"a wait of {node.name} for {upto} answered at {command.applied} (its state at "
                          f"{node.position}): before the write it waited for was applied")
            return
        before = [p for t, p in self.acked if t < asked]
        latest = max(before, default=None)
        self.reads_checked += 1
        self.log("client %s read %d at %s from %s (role %s)", client, node.value, node.position, node.name,
                 node.machine.role.value)
        if latest is not None and (node.position is None or node.position < latest):
            self.fail(f"a read asked of {node.name} at t={asked} answered from its state at {node.position} "
                      f"(value {node.value}), missing the submit acknowledged at {latest} before it")

    # -- invariants -----------------------------------------------------------------------------------
    def _check(self) -> None:
        """_check: the invariants not checked where they happen (see the module doc)."""

    def _on_store_change(self, key: str, before, after) -> None:
        """_on_store_change plays the nodes' watches of the log's metadata: late, and sometimes lost."""
        if key != log_key(f"replicated-{NAME}"):
            return
        for node in self.nodes.values():
            if node.process.alive and not node.metadata_cut and self.rng.random() < 0.8:
                self.world.at(self.rng.randint(1, 30), self._log_changed, node, node.process)

    def _log_changed(self, node: "_Node", process) -> None:
        if node.process is process and process.alive:
            process.deliver(node, rev.LogChanged())

    def _guarded_send(self, process, address: str, request) -> None:
        """_guarded_send checks that each ledger takes appends (not recovery's) from one process: one writer."""
        if type(request).__name__ == "AddRequest" and not request.recovery:
            writer = self.writers.setdefault(request.ledger_id, process.name)
            if writer != process.name:
                self.fail(f"ledger {request.ledger_id} takes appends from {process.name} and from {writer}: "
                          f"two nodes write the log")
        self._send_request(process, address, request)

    def _end_if_settled(self) -> None:
        if self.world.faults or self.finished:
            return
        clients_done = all(s["pending"] is None and s["acked"] == self.config.submits for s in self.clients.values())
        leader = self.holder             # a crashed holder keeps the key until its session expires: not a leader
        if (not clients_done or leader is None or self.nodes.get(leader.name) is not leader
                or not leader.process.alive or leader.machine.role is not LEADING):
            return
        # As the machines count: an entry of duplicates only is applied by handing nothing, or nothing but the
        # entry (in a group), so the shell's own position may stop short of it.
        positions = {n.machine.applied for n in self.nodes.values() if n.process.alive}
        if len(positions) == 1 and not any(n.reads for n in self.nodes.values() if n.process.alive):
            self.finished = True

    def _check_end(self) -> None:
        if not self.finished:
            states = {n.name: (n.machine.role.value, n.machine.applied, n.process.alive) for n in self.nodes.values()}
            pending = {c: s["pending"] for c, s in self.clients.items() if s["pending"] is not None}
            self.fail(f"the run did not settle by t={self.world.now}: nodes {states}, pending submits {pending}, "
                      f"holder {self.holder and self.holder.name}")
        values = {n.value for n in self.nodes.values() if n.process.alive}
        if len(values) != 1:
            self.fail(f"the nodes ended with different values: {values}")


def _taken(core: ReplicaMachine, token: int) -> bool:
    """_taken tells whether a node's machine kept submit `token` to append (queued or in flight)."""
    return (any(pending[1] == token for pending in core._pending)
            or any(token in item.tokens for item in core._in_flight))


def partitioned_leader(seed: int, machine_cls=ReplicaMachine, *, prompt_notice: bool = False,
                       empty: bool = False) -> dict:
    """partitioned_leader is issue 40's partition, scripted: a leader cut off from the metadata store but not
    from the bookies, which hears of it only after its session expired on the server (with
    `prompt_notice`, before: as a ZooKeeper client that is not paused notices a lost link).

    One client keeps reading from that node; the others follow the election and write to the
    new leader. A lease that lasted past the new leader's first write would answer that client
    from a state missing it; the run checks every read, and raises InvariantViolation. With
    `empty`, nobody submits before the cut leader's session expired: its lease comes from proofs
    on its empty ledger, which the new leader's open drops from the log's list.
    """
    window, session_timeout = 2000, 200
    # with `empty` the lease (renewed by proofs, which need the metadata store) must outlast the session's expiry
    # and the new leader's open to matter: a lease longer than the session timeout, as a configuration may have
    config = ReplicaSimConfig(nodes=2, clients=3, submits=12, reads=80, lease_ms=1000 if empty else 300,
                              metadata_cuts=0, bookie_cuts=0,
                              node_crashes=0, bookie_crashes=0, session_blips=0, snapshot_rate=0.0, drop_rate=0.0,
                              duplicate_rate=0.0, max_delay_ms=4, session_timeout_ms=session_timeout,
                              max_clock_drift=0.05, roll_entries=1000, script="partitioned-leader", fault_window_ms=window,
                              late_notice=0.0 if prompt_notice else 1.0,
                              submits_from_ms=window // 3 + session_timeout if empty else 0)
    return ReplicaSimulation(seed, config, machine_cls=machine_cls).run()
