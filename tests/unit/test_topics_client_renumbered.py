"""The topics nemesis client's record of the sends librdkafka renumbers, and the check that reads it.

librdkafka bumps an idempotent producer's epoch on its own and numbers every message it still
holds from sequence 0 of the new epoch, also one whose earlier attempt may be stored: the broker
stores such a message again, as Kafka would (tests/network/topics_client.py's doc). The client
records each send unanswered at a bump as info (RENUMBERED), and `check` lets such a value be
consumed a second time at another offset, nothing more. tests/adapters/test_topics_epoch_bump.py
does it with real librdkafka against a real broker.
"""

from __future__ import annotations

import types

from walkit.testing.history import History

from tests.network.topics_client import RENUMBERED, Sender, check

GROUP = "g"
BUMP = "DRAIN [rdkafka#producer-1] [thrd:10.0.0.1:9092/1]: All partitions drained, bumped epoch to PID{Id:1,Epoch:1}"
NEW_PID = "GETPID [rdkafka#producer-1] [thrd:main]: Acquired PID{Id:2,Epoch:0} (previous PID{Id:1,Epoch:3})"


class FakeProducer:
    """FakeProducer keeps each produce's delivery callback; the test plays librdkafka's reports."""

    def __init__(self) -> None:
        self.callbacks = []

    def produce(self, topic, value, partition, on_delivery) -> None:
        self.callbacks.append(on_delivery)


class Delivered:
    """Delivered is the message of a delivery report: its partition and offset."""

    def __init__(self, partition: int, offset: int | None) -> None:
        self._partition, self._offset = partition, offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int | None:
        return self._offset


class Failed:
    """Failed is the error of a delivery report (not fatal)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text

    def fatal(self) -> bool:
        return False


def sender(history: History) -> Sender:
    args = types.SimpleNamespace(seed=1, name="c0", partitions=2, topic="t")
    made = Sender(history, args, deadline=0.0)
    made.process = "c0/producer.1"
    return made


def test_sends_unanswered_at_an_epoch_bump_are_info_even_when_delivered_and_later_sends_are_not():
    history = History()
    client, producer = sender(history), FakeProducer()
    a, b = client.send(producer, 0, "a"), client.send(producer, 1, "b")
    client.librdkafka_said("NEWPID [rdkafka#producer-1] [thrd:x]: t [0] changed PID{Invalid} -> PID{Id:1,Epoch:0}")
    client.librdkafka_said(BUMP)
    c = client.send(producer, 0, "c")
    producer.callbacks[0](None, Delivered(0, 5))
    producer.callbacks[1](None, Delivered(1, 3))
    producer.callbacks[2](None, Delivered(0, 6))
    assert (a.outcome, a.error) == ("info", RENUMBERED)
    assert (b.outcome, b.error) == ("info", RENUMBERED)
    assert (c.outcome, c.result) == ("ok", {"offset": 6})
    assert client.acked == [6, 3]                 # the consumers catch up past the renumbered copies too
    assert client.unanswered == {} and client.renumbered == set()


def test_a_new_producer_id_renumbers_too_and_a_send_that_failed_stays_the_error_it_got():
    history = History()
    client, producer = sender(history), FakeProducer()
    a, b = client.send(producer, 0, "a"), client.send(producer, 0, "b")
    producer.callbacks[0](None, Delivered(0, 1))  # answered before the change: ok at its offset
    client.librdkafka_said(NEW_PID)
    producer.callbacks[1](Failed("Local: Message timed out"), Delivered(0, None))
    assert (a.outcome, a.result) == ("ok", {"offset": 1})
    assert (b.outcome, b.error) == ("info", "Local: Message timed out")


def history_of(sends: list[tuple[str, str, int]], consumed: list[list[tuple[int, str]]]) -> list:
    """history_of scripts sends (value, "ok" or RENUMBERED, offset) to partition 0 and the group's
    consume batches of (offset, value) records."""
    history = History()
    for value, outcome, offset in sends:
        op = history.invoke("c0/producer.1", "send", value={"partition": 0, "value": value})
        if outcome == "ok":
            history.ok(op, {"offset": offset})
        else:
            history.info(op, outcome)
    for batch in consumed:
        op = history.invoke("c0/consumer", "consume", key=GROUP)
        history.ok(op, [{"partition": 0, "offset": offset, "value": value} for offset, value in batch])
    return history.ops


def test_check_lets_a_renumbered_value_be_consumed_again_at_another_offset():
    ops = history_of([("a", "ok", 0), ("r", RENUMBERED, 3), ("b", "ok", 2)],
                     [[(0, "a"), (1, "r")], [(2, "b"), (3, "r")]])
    verdict = check(ops, GROUP)
    assert verdict.valid, verdict


def test_check_still_finds_an_acknowledged_value_stored_twice():
    """The broken rule: an ok send consumed at two offsets, as the client recorded a renumbered send
    before it knew of epoch bumps (CI: c0-626 consumed at 378 and 380, acknowledged at 380)."""
    ops = history_of([("a", "ok", 0), ("r", "ok", 3), ("b", "ok", 2)],
                     [[(0, "a"), (1, "r")], [(2, "b"), (3, "r")]])
    anomalies = check(ops, GROUP).anomalies
    assert any(text.startswith("wrong offset") and "'r' at 0/1, acknowledged at 3" in text for text in anomalies)
    assert any(text.startswith("duplicated") and "'r' at 0/3" in text for text in anomalies)


def test_check_finds_a_renumbered_value_consumed_a_third_time_or_twice_at_one_offset():
    thrice = history_of([("r", RENUMBERED, 1)], [[(0, "r"), (1, "r")], [(2, "r")]])
    assert [text.split(":")[0] for text in check(thrice, GROUP).anomalies] == ["duplicated"]
    same_offset = history_of([("r", RENUMBERED, 0)], [[(0, "r")], [(0, "r")]])
    assert [text.split(":")[0] for text in check(same_offset, GROUP).anomalies] == ["duplicated"]
