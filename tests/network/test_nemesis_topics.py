"""The topics broker under a nemesis across hosts: every acknowledged record is consumed exactly once, in order.

Ten hosts: ZooKeeper, four bookies (listening on 0.0.0.0 with --advertise), three `walkit
topics serve` brokers of one cluster (each advertising its host's address), and two client
hosts. The topic has three partitions, so each broker leads about one and follows the others.
On each client host, tests/network/topics_client.py runs an idempotent acks=all producer
(confluent-kafka) sending unique values and a member of one consumer group that records a
batch as consumed only once its synchronous commit is known to have taken effect. After the
faults, the consumers go on until the group's committed offsets pass every acknowledged
offset. walkit.testing.history.check_queue (through topics_client.check) then checks the group:
every acknowledged record consumed exactly once, in offset order per partition, at the offset
its send was acknowledged with, and nothing consumed that was never sent. A batch whose commit
the client was told failed, and could not read back as its own (the next member's commit may
overwrite it first), is in doubt: an earlier attempt of a retried commit may have taken effect
(seen in a "halves" run: the cut coordinator's append of the first attempt landed after the
heal, while librdkafka's retry was answered UNKNOWN_MEMBER_ID, and the next member started
exactly at that batch's end). Its records, if no other batch consumed them, are listed as
unknown in the verdict instead of lost.

The nemesis's "leader" is the broker leading partition 0, as the Metadata of the cluster names
it when a fault starts (`topics_client.py leaders`, asked from a client host): its faults stop
that partition's sends, and reach whatever else its host leads (often another partition, or the
group's coordination, which moves between brokers as they come and go); halves cut other brokers
too. The broken-rule test runs consumers that count a batch as consumed even when its commit failed
(`--unsafe-commits`), while the nemesis cuts one client host from every other host for longer
than the consumers' session timeout (`isolate-client`): the group gives the member's partitions
to the other member, which consumes them from the committed offsets, and the cut member's
commits fail when it is back (it is no longer a member of that generation). Faults of the
brokers do not surely fail a commit: the group survives its coordinator's death and librdkafka
retries a commit until a coordinator answers. The batches counted although their commit failed
were consumed by the other member too: the checker must find them consumed twice.

A send librdkafka acknowledged without an offset (a batch whose answer was lost, acknowledged by
a later batch's success) is info in the history, since check_queue needs the offset of an ok
send; the test checks separately that each was consumed. So is a send librdkafka renumbered under
a new producer epoch of its own (topics_client.RENUMBERED): a copy sent before the bump may be
stored too, as Kafka would store it, so topics_client.check lets such a value be consumed twice,
at two offsets, and the test checks that each was consumed. Each run leaves the histories, the
client logs (`c<i>-client.log`, monotonic times), the broker logs and the faults as applied
(`nemesis.json`, on the histories' clock) in its tmp_path; unavailability is printed for all
sends and for partition 0's alone (the other partitions' sends go on while it has no leader).

Replay a seed: pytest tests/network/test_nemesis_topics.py --nemesis-seed S; run longer:
--nemesis-seeds N --nemesis-seconds T.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from walkit.testing.history import History
from walkit.testing.multihost import Deployment
from walkit.testing.nemesis import Nemesis, Schedule, unavailability
from walkit.testing.network import Network

import pytest

from tests.network.topics_client import RENUMBERED, check

pytestmark = pytest.mark.network

CLIENT = os.path.join(os.path.dirname(__file__), "topics_client.py")
PORT = 9092
TOPIC = "nemesis"
PARTITIONS = 3
GROUP = "nemesis-group"
#: The error topics_client.py records a send with when librdkafka acknowledged it without an offset.
IMPLICIT_ACK = "acknowledged without an offset"


def topics_cluster(net: Network, d: Deployment):
    """topics_cluster starts ZooKeeper, 4 bookies and 3 brokers and creates the topic;
    returns (meta host, bookies, brokers, client hosts, bootstrap list)."""
    meta = net.add_host("meta")
    d.zookeeper(meta)
    bookies = d.bookies([net.add_host(f"b{i}") for i in range(4)], listen="0.0.0.0:3181")
    brokers = []
    for i in range(3):
        host = net.add_host(f"k{i}")
        brokers.append(d.service(host, "topics", [sys.executable, "-m", "walkit", "topics", "serve",
                                                  "--metadata", d.metadata_url, "--host", "0.0.0.0",
                                                  "--port", str(PORT), "--advertise", f"{host.address}:{PORT}"]))
    for broker in brokers:
        broker.wait_log(r"serving the Kafka protocol", timeout=90)
    clients = [net.add_host(f"c{i}") for i in range(2)]
    bootstrap = ",".join(f"{broker.host.address}:{PORT}" for broker in brokers)
    d.walkit(clients[0], "topics", "create", TOPIC, "-p", str(PARTITIONS), "-b", bootstrap, timeout=90)
    return meta, bookies, brokers, clients, bootstrap


def leader_of(d: Deployment, brokers, asker, bootstrap: str):
    """leader_of is the broker leading partition 0, as the cluster's Metadata tells `asker`; None if it does not say."""
    try:
        done = d.python(asker, CLIENT, "leaders", "--bootstrap", bootstrap, "--topic", TOPIC, "--group", GROUP,
                        check=False, timeout=20)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    found = json.loads(done.stdout)
    address = found["partitions"].get("0")
    return next((broker for broker in brokers if broker.host.address == address), None)


def run_nemesis(tmp_path, seed: int, seconds: float, *, unsafe: bool = False, **schedule_options):
    """run_nemesis runs one seeded nemesis against a topics cluster; returns (applied faults, ops)."""
    schedule = Schedule.random(seed, seconds, **schedule_options)
    print(f"nemesis seed {seed}: {[f.kind for f in schedule.faults]}; histories in {tmp_path}")
    with Network() as net, Deployment(net, str(tmp_path)) as d:
        meta, bookies, brokers, clients, bootstrap = topics_cluster(net, d)
        runs = []
        healed = os.path.join(d.workdir, "healed")     # written when the nemesis is over: the clients go on 3 s
        for host in clients:
            out = os.path.join(d.workdir, f"{host.name}.history.jsonl")
            argv = [sys.executable, CLIENT, "run", out, "--name", host.name, "--seed", str(seed),
                    "--seconds", str(schedule.duration_s + 3), "--bootstrap", bootstrap, "--topic", TOPIC,
                    "--partitions", str(PARTITIONS), "--group", GROUP, "--acked-dir", d.workdir,
                    "--clients", ",".join(h.name for h in clients), "--healed-file", healed,
                    *(["--unsafe-commits", "--pause-s", "0.5"] if unsafe else [])]
            with open(os.path.join(d.workdir, f"{host.name}-client.log"), "w") as log:
                runs.append((host, out, host.popen(argv, env=d.env, stdout=log, stderr=subprocess.STDOUT)))
        nemesis = Nemesis(net, schedule, servers=brokers, bookies=bookies, meta=meta, clients=clients,
                          leader=lambda: leader_of(d, brokers, clients[0], bootstrap))
        applied = nemesis.run()
        open(healed, "w").close()
        with open(os.path.join(d.workdir, "nemesis.json"), "w") as f:   # the faults, on the histories' clock
            json.dump([dataclasses.asdict(fault) for fault in applied], f, indent=1)
        ops = []
        for host, out, process in runs:
            code = process.wait(timeout=150)
            assert code == 0, f"the client on {host.name} exited {code}: see {host.name}-client.log in {tmp_path}"
            ops += History.from_jsonl(out).ops
    for fault in applied:
        print(f"  {fault.kind:22} {fault.detail}")
    return applied, ops


def summary(ops) -> str:
    """summary counts the sends by outcome and the consume ops that counted."""
    sends = [op for op in ops if op.f == "send"]
    counts = {outcome: sum(op.outcome == outcome for op in sends) for outcome in ("ok", "info", "fail")}
    consumed = [op for op in ops if op.f == "consume" and op.outcome == "ok"]
    uncertain = sum(op.f == "consume" and op.outcome != "ok" for op in ops)
    implicit = sum(op.error == IMPLICIT_ACK for op in sends)
    renumbered = sum(op.error == RENUMBERED for op in sends)
    records = sum(len(op.result) for op in consumed)
    return (f"sends {counts} ({implicit} info acknowledged without an offset, {renumbered} renumbered by an "
            f"epoch bump); {len(consumed)} batches consumed ({records} records), {uncertain} not counted "
            f"(commit failed)")


def test_every_acknowledged_record_is_consumed_exactly_once_in_order_under_a_seeded_nemesis(
        tmp_path, nemesis_seed, nemesis_seconds):
    applied, ops = run_nemesis(tmp_path, nemesis_seed, nemesis_seconds)
    verdict = check(ops, GROUP)
    partition0 = [op for op in ops if op.f == "send" and op.value["partition"] == 0]
    print(f"seed {nemesis_seed}: {summary(ops)}\n{verdict}\n"
          f"unavailable s per fault: {unavailability(applied, ops, f='send')}; "
          f"partition 0 alone: {unavailability(applied, partition0, f='send')}")
    assert verdict.valid, f"seed {nemesis_seed} (histories in {tmp_path}): {verdict}"
    consumed = {record["value"] for op in ops if op.f == "consume" and op.outcome == "ok" for record in op.result}
    delivered = [op for op in ops if op.f == "send" and op.error in (IMPLICIT_ACK, RENUMBERED)]
    missing = [op.describe() for op in delivered if op.value["value"] not in consumed]
    assert not missing, f"seed {nemesis_seed}: sends librdkafka delivered as info never consumed: {missing}"
    acked = [op for op in ops if op.f == "send" and op.outcome == "ok"]
    assert len(acked) > 100, len(acked)
    last_heal = max(fault.healed for fault in applied)
    assert any(op.complete_time > last_heal for op in acked), "no send was acknowledged after the last heal"


def test_the_checker_finds_the_duplicates_of_consumers_that_count_batches_whose_commit_failed(tmp_path):
    seed = 3
    applied, ops = run_nemesis(tmp_path, seed, 24, unsafe=True, kinds=("isolate-client",), hold_s=(10.0, 12.0))
    verdict = check(ops, GROUP)
    duplicated = [text for text in verdict.anomalies if text.startswith("duplicated")]
    print(f"known-bad variant, seed {seed}: {summary(ops)}; {len(verdict.anomalies)} anomalies, "
          f"{len(duplicated)} duplicated")
    assert duplicated, f"seed {seed}: the checker found no record consumed twice by consumers that count failed commits"
