"""A consume-transform-produce worker with confluent-kafka transactions: a process the tests SIGKILL.

    python txn_pipeline.py BOOTSTRAP GROUP TRANSACTIONAL_ID IN_TOPIC OUT_TOPIC [HOLD_AT HOLD_S]

It reads IN_TOPIC in GROUP (read_committed, no auto-commit) and writes each record's value to
OUT_TOPIC, a batch of records per transaction with the input offsets sent to the transaction
(`send_offsets_to_transaction`), as Kafka's exactly-once pipelines do: a retriable failure of the
commit is retried; any other failure aborts the transaction and rewinds the consumer to the
group's committed offsets; a fatal error (fenced by a newer worker) ends the process with status
3. It prints "committed N" after each commit (N: records so far) and runs until killed. With
HOLD_AT, the first transaction that reaches HOLD_AT records is held open, its records sent and
acknowledged, for HOLD_S seconds after printing "holding" (a slow step of the application), so a
test can kill this process or a broker while a transaction is open.

librdkafka's `send_offsets_to_transaction` can block past its timeout, for good, when the group's
coordinator died and left the cluster's metadata (librdkafka issues #5456 and #5511, open in
2.16): a watchdog then prints "client hang" and ends the process with status 4, as an
application's supervisor would restart it; the tests start a replacement.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

FENCED_STATUS = 3
#: The status of a process whose send_offsets_to_transaction outlived SEND_OFFSETS_S by HANG_S.
HUNG_STATUS = 4
SEND_OFFSETS_S, HANG_S = 30, 15


def rewind(consumer: Consumer) -> None:
    """rewind seeks every assigned partition back to the group's committed offset."""
    assignment = consumer.assignment()
    for committed in consumer.committed(assignment, 30):
        consumer.seek(TopicPartition(committed.topic, committed.partition,
                                     committed.offset if committed.offset >= 0 else 0))


def hung(call: str) -> None:
    """hung ends the process when librdkafka's `call` blocked past its own timeout (see the module doc)."""
    print(f"client hang: {call} blocked past its timeout", flush=True)
    os._exit(HUNG_STATUS)


def abort(producer: Producer) -> None:
    """abort aborts the open transaction, retrying what the client says is retriable."""
    while True:
        try:
            producer.abort_transaction(60)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable():
                raise
            print(f"retrying the abort: {exc.args[0]}", flush=True)


#: librdkafka's debug contexts, from the environment (TXN_PIPELINE_DEBUG=eos,cgrp): logged to stderr.
DEBUG = {"debug": os.environ["TXN_PIPELINE_DEBUG"]} if os.environ.get("TXN_PIPELINE_DEBUG") else {}


def main(bootstrap: str, group: str, transactional_id: str, source: str, target: str, hold_at: str = "0",
         hold_s: str = "0") -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, **DEBUG})
    consumer.subscribe([source])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 20000, **DEBUG})
    producer.init_transactions(60)
    done = 0
    while True:
        messages = [m for m in consumer.consume(50, 0.5) if m.error() is None]
        if not messages:
            continue
        try:
            producer.begin_transaction()
            for message in messages:
                producer.produce(target, key=message.key(), value=message.value())
            if 0 < int(hold_at) <= done + len(messages):
                hold_at = "0"
                producer.flush(60)
                print("holding", flush=True)
                time.sleep(float(hold_s))
            watchdog = threading.Timer(SEND_OFFSETS_S + HANG_S, hung, ("send_offsets_to_transaction",))
            watchdog.start()
            try:
                producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                     consumer.consumer_group_metadata(), SEND_OFFSETS_S)
            finally:
                watchdog.cancel()
            while True:
                try:
                    producer.commit_transaction(60)
                    break
                except KafkaException as exc:
                    if not exc.args[0].retriable():
                        raise
                    print(f"retrying the commit: {exc.args[0]}", flush=True)
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal():
                print(f"fatal: {error}", flush=True)
                return FENCED_STATUS
            print(f"aborting: {error}", flush=True)
            abort(producer)
            rewind(consumer)
            continue
        done += len(messages)
        print(f"committed {done}", flush=True)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:8]))
