"""topics_client is the topics workload the nemesis test runs on a client host, recording a history.

    python topics_client.py run OUT --name C --seed S --seconds T --bootstrap B --topic T --partitions N
                                --group G --acked-dir DIR --clients C1,C2 [--rate R] [--unsafe-commits]
                                [--healed-file H]
    python topics_client.py leaders --bootstrap B --topic T --group G    # prints {"partitions", "coordinator"}

`run` runs a producer and a consumer of group G side by side for T seconds (with --healed-file H,
until 3 s after the test wrote H, when its nemesis was over: walkit.testing.nemesis.Deadline) and writes the
history (walkit.testing.history JSONL, the shapes `check_queue` reads) to OUT.

The producer (confluent-kafka, idempotent, acks=all) sends the unique values `C-0`, `C-1`, ...
about R a second, each to a partition drawn (from SEED) among those with fewer than MAX_PENDING
sends awaiting their answer, so a partition without a leader does not hold the others up. Its
retries are librdkafka's own within the idempotent session: the broker recognises a retried
batch by its producer id and sequence and answers with the offsets it got the first time, so a
retry cannot store a record twice unless the broker is wrong (which the check would show). A
send acknowledged is `ok` with its offset; a delivery error is `info`: librdkafka does not tell
Python whether a failed message reached the log (a timed-out request may have been appended),
so no send is ever recorded `fail`. A send librdkafka acknowledged without an offset (a batch
whose answer was lost, acknowledged by a later batch's success) is `info` with the error
"acknowledged without an offset". When the time is up it waits for every pending answer
and writes DIR/C.acked.json: the highest acknowledged offset per partition.

Epoch bumps (RENUMBERED): librdkafka bumps its own producer epoch (KIP-360) when a request
other than the first in flight gets OUT_OF_ORDER_SEQUENCE_NUMBER (rdkafka_request.c, "skipped
sequence numbers"), when a queued message times out, or on a permanent error; it then numbers
every message it still holds from sequence 0 of the new epoch (rd_kafka_toppar_pid_change),
also a message whose earlier attempt ended in a timeout and may be stored. The broker cannot
tell such a message from a new one, nor could Kafka's: it stores it again (librdkafka issue
4953). The producer runs with librdkafka's `eos` debug context and a logger, whose lines reach
Python through poll() in order with the delivery reports, so the sends still unanswered when
librdkafka says it bumped the epoch (or took a new producer id) are known: each is `info` with
the error "renumbered by an epoch bump", even when delivered (its offset is said in the log,
and counted in the acked file). `check` lets such a value be consumed twice, at two offsets.

The consumer polls batches and commits each batch's offsets synchronously, tagging the commit
with a token of its own (the commit's metadata). A batch is recorded as an ok "consume" only
once its commit is known to have taken effect: the commit succeeded, or it failed but the
committed offsets read back from the coordinator carry this batch's token (a commit whose
answer was lost may have been applied). Otherwise the batch is recorded as `info` with the
offsets it asked to commit (its records are not counted; check_queue lists those no other batch
consumed as unknown, since the commit may have taken effect) and the consumer seeks back to
its first offsets, so it is delivered again if the commit did not take effect.
After T seconds it goes on until every client's acked.json is written and the group's
committed offsets have passed every acknowledged offset (at most CATCH_UP_S), then leaves.

--unsafe-commits is the broken rule the checker must catch: the consumer records every batch
as consumed as soon as it asked for the commit, whether the commit succeeded or not, and does
not seek back; a batch whose commit failed is delivered again after a rebalance.
--pause-s makes the consumer take that long over each batch (its processing), so librdkafka has
fetched the next records when a fault comes: a consumer cut off then still consumes them and
commits, and those commits fail. Without it a consumer that keeps up may hold nothing fetched
when it is cut off, and commit nothing until it is back and has rejoined.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import sys
import threading
import time
import traceback

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from walkit.testing.history import History, Op, Verdict, check_queue
from walkit.testing.nemesis import Deadline

#: Sends awaiting their answer per partition before the producer skips that partition: librdkafka's
#: idempotence window (RD_KAFKA_IDEMP_MAX_INFLIGHT, 5 in flight per partition). With more, a partition
#: whose leader stops answering over a connection that stays up (a cut, a paused broker) holds 5 in
#: flight and more queued, and librdkafka's broker thread spins: rd_kafka_toppar_producer_serve sets
#: its wake-up to "now" for the queued ones it may not send (measured: a core for the whole fault).
MAX_PENDING = 5
#: How long librdkafka tries to deliver a message (its retries included) before giving up: info.
MESSAGE_TIMEOUT_MS = 20_000
#: How long the consumer goes on after the workload's time, catching up with every acknowledged send.
CATCH_UP_S = 60.0
#: How long a consumer keeps asking the coordinator what a failed commit left committed.
SETTLE_S = 20.0
#: Records per consume batch, and how long a poll waits for them.
BATCH, POLL_S = 50, 0.5
#: librdkafka's debug contexts for the producer: eos always (its epoch bumps, see the module doc),
#: more from the environment for an investigation (TOPICS_CLIENT_DEBUG=eos,msg).
DEBUG = ",".join(dict.fromkeys(["eos", *filter(None, os.environ.get("TOPICS_CLIENT_DEBUG", "").split(","))]))
#: The error a send is recorded with (info) when librdkafka renumbered it while it was unanswered.
RENUMBERED = "renumbered by an epoch bump"
#: What librdkafka's eos lines say when its producer id or epoch changes under the messages it holds
#: (rdkafka_idempotence.c: "All partitions drained, bumped epoch to PID{...}", "Acquired PID{...} (previous ...)").
NEW_EPOCH = ("bumped epoch to", "(previous PID")


def say(*parts) -> None:
    """say prints one line of the client's log, stamped with the machine's monotonic clock."""
    print(f"{time.monotonic():.3f}", *parts, flush=True)


class LibrdkafkaLines(logging.Handler):
    """LibrdkafkaLines hands each line librdkafka logs (through the producer's logger) to a Sender."""

    def __init__(self, sender: "Sender") -> None:
        super().__init__(logging.DEBUG)
        self.sender = sender

    def emit(self, record: logging.LogRecord) -> None:
        self.sender.librdkafka_said(record.getMessage(), record.levelno)


class Sender:
    """Sender is the producer side of the workload (see the module doc).

    `config` overrides the producer's settings (a test's shorter timeouts).
    """

    def __init__(self, history: History, args, deadline: Deadline, config: dict | None = None) -> None:
        self.history = history
        self.args = args
        self.deadline = deadline
        self.config = config or {}
        self.rng = random.Random(f"{args.seed}-{args.name}")
        self.pending = [0] * args.partitions
        self.acked = [-1] * args.partitions          # the highest acknowledged offset per partition
        self.incarnation = 0
        self.fatal: KafkaError | None = None
        self.unanswered: dict[int, object] = {}      # op index -> send op librdkafka has not reported on
        self.renumbered: set[int] = set()            # of those, the ones unanswered at an epoch bump

    def new_producer(self) -> Producer:
        """new_producer starts an idempotent producer session, a new process of the history; librdkafka's
        log lines go to `librdkafka_said`, served by poll() in order with the delivery reports."""
        self.incarnation += 1
        self.process = f"{self.args.name}/producer.{self.incarnation}"
        logger = logging.getLogger(f"topics_client.{self.args.name}.{self.incarnation}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        logger.addHandler(LibrdkafkaLines(self))
        return Producer({"bootstrap.servers": self.args.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": MESSAGE_TIMEOUT_MS, "request.timeout.ms": 5000,
                         "retry.backoff.ms": 100, "retry.backoff.max.ms": 1000,
                         "socket.connection.setup.timeout.ms": 3000, "log_level": 3, "debug": DEBUG,
                         "logger": logger, "error_cb": lambda error: say("producer error", error), **self.config})

    def send(self, producer: Producer, partition: int, value: str):
        """send records and produces one send of `value` to `partition`; it returns the op."""
        op = self.history.invoke(self.process, "send", value={"partition": partition, "value": value})
        self.pending[partition] += 1
        self.unanswered[op.index] = op
        try:
            producer.produce(self.args.topic, value=value.encode(), partition=partition,
                             on_delivery=lambda error, message, op=op: self.delivered(op, error, message))
        except (BufferError, KafkaException) as exc:   # refused before it was queued: never sent
            self.pending[partition] -= 1
            del self.unanswered[op.index]
            self.history.fail(op, repr(exc))
        return op

    def librdkafka_said(self, line: str, level: int = logging.DEBUG) -> None:
        """librdkafka_said takes one line of librdkafka's log: at a new epoch or producer id, every send
        still unanswered is renumbered (see the module doc). The client's log gets librdkafka's
        warnings and errors, its epoch changes, and every line when TOPICS_CLIENT_DEBUG asks for more."""
        if any(words in line for words in NEW_EPOCH):
            self.renumbered.update(self.unanswered)
            say(f"{len(self.unanswered)} unanswered sends renumbered:", line)
        elif level > logging.DEBUG or line.startswith(("DRAIN", "NEWPID", "ERRSEQ")) or DEBUG != "eos":
            say(line)

    def run(self) -> None:
        """run sends until the deadline, then waits for every answer and writes the acked file."""
        producer = self.new_producer()
        sent = 0
        interval = 1.0 / self.args.rate
        next_send = time.monotonic()
        while not self.deadline.passed():
            if self.fatal is not None:            # the idempotent session is over: a new producer
                say("producer fatal", self.fatal)
                producer.flush(MESSAGE_TIMEOUT_MS / 1000 + 10)
                producer, self.fatal = self.new_producer(), None
            now = time.monotonic()
            if now < next_send:
                producer.poll(next_send - now)    # serves delivery reports while it waits for the pace
                continue
            next_send = now + interval
            open_partitions = [p for p in range(self.args.partitions) if self.pending[p] < MAX_PENDING]
            if not open_partitions:
                continue
            partition = self.rng.choice(open_partitions)
            self.send(producer, partition, f"{self.args.name}-{sent}")
            sent += 1
        left = producer.flush(MESSAGE_TIMEOUT_MS / 1000 + 10)
        say(f"producer done: {sent} sent, {left} unanswered, acked up to {self.acked}")
        path = os.path.join(self.args.acked_dir, f"{self.args.name}.acked.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"acked": self.acked}, f)
        os.replace(path + ".tmp", path)           # readers see the whole file or none

    def delivered(self, op, error: KafkaError | None, message) -> None:
        """delivered records the outcome of one send (librdkafka's delivery report)."""
        try:
            self._delivered(op, error, message)
        except BaseException:                     # librdkafka's callbacks must not raise: say it, go on
            say("delivery report failed\n" + traceback.format_exc())

    def _delivered(self, op, error: KafkaError | None, message) -> None:
        partition = op.value["partition"]
        self.pending[partition] -= 1
        del self.unanswered[op.index]
        renumbered = op.index in self.renumbered
        self.renumbered.discard(op.index)
        if error is None and renumbered:
            # stored under the new epoch, and maybe before it too (see the module doc)
            say(RENUMBERED, op.value, "acknowledged at", message.offset())
            if message.offset() is not None:
                self.acked[partition] = max(self.acked[partition], message.offset())
            self.history.info(op, RENUMBERED)
        elif error is None and message.offset() is None:
            # librdkafka acknowledges a batch whose answer was lost once a later batch of the
            # session succeeds (the broker takes sequences in order), without an offset: check_queue
            # needs the offset of an ok send, so it is info; the test checks it was consumed.
            say("acknowledged without an offset", op.value)
            self.history.info(op, "acknowledged without an offset")
        elif error is None:
            assert message.partition() == partition, (message.partition(), partition)
            self.acked[partition] = max(self.acked[partition], message.offset())
            self.history.ok(op, {"offset": message.offset()})
        else:
            self.history.info(op, str(error))
            if error.fatal():
                self.fatal = error


class Receiver:
    """Receiver is the consumer side of the workload (see the module doc)."""

    def __init__(self, history: History, args, deadline: Deadline) -> None:
        self.history = history
        self.args = args
        self.deadline = deadline
        self.process = f"{args.name}/consumer"
        self.commits = 0
        self.partitions = [TopicPartition(args.topic, p) for p in range(args.partitions)]

    def run(self) -> None:
        """run consumes and commits until caught up after the deadline (or CATCH_UP_S later)."""
        consumer = Consumer({"bootstrap.servers": self.args.bootstrap, "group.id": self.args.group,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                             "socket.connection.setup.timeout.ms": 3000, "log_level": 3,
                             "error_cb": lambda error: say("consumer error", error)})
        consumer.subscribe([self.args.topic],
                           on_assign=lambda c, parts: say("assigned", [tp.partition for tp in parts]),
                           on_revoke=lambda c, parts: say("revoked", [tp.partition for tp in parts]))
        next_check = 0.0
        try:
            while True:
                now = time.monotonic()
                if self.deadline.passed() and now >= next_check:
                    next_check = now + 1.0
                    if self.caught_up(consumer):
                        say("consumer caught up")
                        return
                    if now >= self.deadline.ended_at + MESSAGE_TIMEOUT_MS / 1000 + 10 + CATCH_UP_S:
                        say("consumer gave up catching up")
                        return
                messages = consumer.consume(BATCH, POLL_S)
                records = []
                for message in messages:
                    if message.error() is not None:
                        say("consume error", message.error())
                        continue
                    records.append({"partition": message.partition(), "offset": message.offset(),
                                    "value": message.value().decode()})
                if records:
                    self.commit(consumer, records)
                    if self.args.pause_s:
                        time.sleep(self.args.pause_s)      # its processing (see --pause-s)
        finally:
            consumer.close()

    def commit(self, consumer: Consumer, records: list[dict]) -> None:
        """commit commits a batch's offsets and records the batch as consumed once that is known to hold."""
        self.commits += 1
        token = f"{self.process}#{self.commits}"
        first: dict[int, int] = {}
        end: dict[int, int] = {}
        for record in records:
            first.setdefault(record["partition"], record["offset"])
            end[record["partition"]] = record["offset"] + 1
        op = self.history.invoke(self.process, "consume", key=self.args.group,
                                 value={"token": token, "offsets": {p: [first[p], end[p]] for p in end}})
        offsets = [TopicPartition(self.args.topic, p, o, metadata=token) for p, o in sorted(end.items())]
        try:
            answer = consumer.commit(offsets=offsets, asynchronous=False)
            failed = [tp.error for tp in answer or () if tp.error is not None]
            if failed:
                raise KafkaException(failed[0])
        except KafkaException as exc:
            if self.args.unsafe_commits:           # the broken rule: counted although not committed
                self.history.ok(op, records)
                return
            say("commit failed", token, exc)
            if self.committed_as(consumer, token, end):
                self.history.ok(op, records)
                return
            self.history.info(op, f"commit failed: {exc}")
            for partition, offset in first.items():   # deliver the batch again
                try:
                    consumer.seek(TopicPartition(self.args.topic, partition, offset))
                except KafkaException as seek_error:  # no longer assigned: its next owner starts from the commit
                    say("seek back", partition, seek_error)
            return
        self.history.ok(op, records)

    def committed_as(self, consumer: Consumer, token: str, end: dict[int, int]) -> bool:
        """committed_as tells whether the coordinator holds the commit `token` of offsets `end`,
        asking until it answers (at most SETTLE_S)."""
        until = time.monotonic() + SETTLE_S
        while True:
            try:
                found = consumer.committed([TopicPartition(self.args.topic, p) for p in end], timeout=5)
                held = all(tp.error is None and tp.metadata == token and tp.offset == end[tp.partition]
                           for tp in found)
                say("committed after the failure", token, held,
                    [(tp.partition, tp.offset, tp.metadata) for tp in found])
                return held
            except KafkaException as exc:
                if time.monotonic() >= until:
                    say("no answer about", token, exc)
                    return False
            time.sleep(0.2)                        # paces the questions; the answer is what is waited for

    def caught_up(self, consumer: Consumer) -> bool:
        """caught_up tells whether every client wrote its acked file and the group's committed
        offsets passed every offset acknowledged to any of them."""
        needed = [0] * self.args.partitions
        for client in self.args.clients.split(","):
            path = os.path.join(self.args.acked_dir, f"{client}.acked.json")
            if not os.path.exists(path):
                return False
            with open(path) as f:
                for partition, offset in enumerate(json.load(f)["acked"]):
                    needed[partition] = max(needed[partition], offset + 1)
        try:
            found = consumer.committed(self.partitions, timeout=5)
        except KafkaException as exc:
            say("committed?", exc)
            return False
        return all(needed[tp.partition] == 0 or (tp.error is None and tp.offset >= needed[tp.partition])
                   for tp in found)


def check(ops: list[Op], group: str) -> Verdict:
    """check is check_queue of `group` over the clients' histories, except that a value whose send
    librdkafka renumbered (RENUMBERED) may be consumed a second time at another offset: its copy
    from before the epoch bump and its copy after it (see the module doc). That second record is
    left out of the consume op it is in; a third, or a second at the same offset, is still a duplicate."""
    renumbered = {op.value["value"] for op in ops if op.f == "send" and op.error == RENUMBERED}
    first_at: dict[str, tuple] = {}
    second: set[str] = set()
    kept: dict[int, Op] = {}                     # id(consume op) -> the op without its second copies
    consumes = [op for op in ops if op.f == "consume" and op.outcome == "ok"]
    for op in sorted(consumes, key=lambda op: (op.complete_time, op.index)):
        records = []
        for record in op.result:
            value, place = record["value"], (record["partition"], record["offset"])
            if value in renumbered:
                if first_at.get(value, place) != place and value not in second:
                    second.add(value)
                    continue
                first_at.setdefault(value, place)
            records.append(record)
        if len(records) != len(op.result):
            kept[id(op)] = dataclasses.replace(op, result=records)
    return check_queue([kept.get(id(op), op) for op in ops], [group])


def run(args) -> None:
    """run runs the producer and the consumer and writes the history; it exits 1 if either crashed."""
    history = History()
    deadline = Deadline(args.seconds, args.healed_file)
    sender, receiver = Sender(history, args, deadline), Receiver(history, args, deadline)
    crashed = []

    def guarded(fn):
        """guarded runs `fn`, noting a crash so that the program exits 1."""
        try:
            fn()
        except BaseException:
            crashed.append(threading.current_thread().name)
            say(f"{threading.current_thread().name} crashed\n" + traceback.format_exc())
    threads = [threading.Thread(target=guarded, args=(sender.run,), name="producer"),
               threading.Thread(target=guarded, args=(receiver.run,), name="consumer")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    history.to_jsonl(args.out)
    say(f"done {len(history)}")
    if crashed:
        sys.exit(f"crashed: {', '.join(crashed)}")


def leaders(args) -> None:
    """leaders prints the host of each partition's leader and of the group's coordinator (null if unknown)."""
    admin = AdminClient({"bootstrap.servers": args.bootstrap, "socket.connection.setup.timeout.ms": 2000})
    found: dict = {"partitions": {}, "coordinator": None}
    try:
        metadata = admin.list_topics(args.topic, timeout=5)
        hosts = {broker.id: broker.host for broker in metadata.brokers.values()}
        found["partitions"] = {p.id: hosts.get(p.leader) for p in metadata.topics[args.topic].partitions.values()}
    except KafkaException as exc:
        print(f"metadata: {exc}", file=sys.stderr)
    try:
        group = admin.describe_consumer_groups([args.group], request_timeout=5)[args.group].result(6)
        found["coordinator"] = group.coordinator.host
    except KafkaException as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
    print(json.dumps(found))


def main() -> None:
    """main parses the command line (see the module doc) and runs `run` or `leaders`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    work = commands.add_parser("run")
    work.add_argument("out")
    work.add_argument("--name", required=True)
    work.add_argument("--seed", required=True)
    work.add_argument("--seconds", type=float, required=True)
    work.add_argument("--healed-file", default=None)
    work.add_argument("--rate", type=float, default=30.0)
    work.add_argument("--acked-dir", required=True)
    work.add_argument("--clients", required=True)
    work.add_argument("--unsafe-commits", action="store_true")
    work.add_argument("--pause-s", type=float, default=0.0)
    ask = commands.add_parser("leaders")
    for command in (work, ask):
        command.add_argument("--bootstrap", required=True)
        command.add_argument("--topic", required=True)
        command.add_argument("--group", required=True)
    work.add_argument("--partitions", type=int, required=True)
    args = parser.parse_args()
    run(args) if args.command == "run" else leaders(args)


if __name__ == "__main__":
    main()
