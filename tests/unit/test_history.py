"""Histories and their checkers (walkit.testing.history): hand-written histories that each break
one rule, and seeded simulations of a correct register, bank and queue that must check valid;
a seed that fails is reproduced by its test id (test_simulated_registers_are_valid[seed])."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from walkit.testing.history import (
    FAIL, INFO, OK, History, HistoryError, check_bank, check_queue, check_registers,
)

SEEDS = range(300)


class Clock:
    """Clock is a settable clock for scripted histories."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Row:
    """Row is one op of a scripted history: invoked at `start`, completed (or given up) at `end`."""

    process: Any
    f: str
    key: Any
    value: Any
    start: float
    end: float | None
    outcome: str | None = OK
    result: Any = None
    op: Any = None
    extra: dict = field(default_factory=dict)   # simulation notes


def record(rows: list[Row]) -> History:
    """record plays `rows` through History's own API, each call at its row's time."""
    clock = Clock()
    history = History(clock=clock)
    events = [(row.start, 0, n) for n, row in enumerate(rows)]
    events += [(row.end, 1, n) for n, row in enumerate(rows) if row.outcome is not None]
    for when, completes, n in sorted(events):
        clock.now, row = when, rows[n]
        if not completes:
            row.op = history.invoke(row.process, row.f, row.key, row.value)
        elif row.outcome == OK:
            history.ok(row.op, row.result)
        elif row.outcome == FAIL:
            history.fail(row.op, "refused")
        else:
            history.info(row.op, TimeoutError("timed out"))
    return history


def w(key, value, start, end, outcome=OK, process="p1"):
    return Row(process, "write", key, value, start, end, outcome)


def r(key, got, start, end, outcome=OK, process="p2"):
    return Row(process, "read", key, None, start, end, outcome, got)


def cas(key, old, new, start, end, outcome=OK, process="p3"):
    return Row(process, "cas", key, (old, new), start, end, outcome)


def registers(*rows: Row):
    return check_registers(record(list(rows)))


# -- History ----------------------------------------------------------------------------------------

def test_history_records_invocations_and_completions_with_their_times():
    clock = Clock()
    history = History(clock=clock)
    write = history.invoke("p1", "write", "x", 1)
    clock.now = 2.0
    read = history.invoke("p2", "read", "x")
    clock.now = 3.0
    history.ok(write)
    history.ok(read, 1)
    lost = history.invoke("p3", "write", "x", 2)
    history.info(lost, TimeoutError("no answer"))
    assert [(op.index, op.invoke_time, op.complete_time, op.outcome) for op in history] == [
        (0, 0.0, 3.0, OK), (1, 2.0, 3.0, OK), (2, 3.0, None, INFO)]
    assert (read.value, read.result, write.value, write.result) == (1, 1, 1, None)
    assert lost.error == "TimeoutError: no answer" and lost.end == float("inf")


def test_completing_an_op_twice_is_refused():
    history = History()
    op = history.invoke("p1", "write", "x", 1)
    history.ok(op)
    with pytest.raises(HistoryError, match="already completed"):
        history.fail(op, "late")


def test_history_numbers_ops_of_concurrent_threads_without_gaps():
    history = History()

    def client(process: int) -> None:
        for n in range(200):
            op = history.invoke(process, "write", "x", (process, n))
            history.ok(op)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ops = history.ops
    assert [op.index for op in ops] == list(range(800))
    assert all(op.outcome == OK and op.complete_time >= op.invoke_time for op in ops)
    assert check_registers(history).valid   # each write completes before the process's next


# -- registers: hand-written histories --------------------------------------------------------------

def test_read_after_write_sees_the_write():
    assert registers(r("x", None, 0, 1), w("x", 1, 2, 3), r("x", 1, 4, 5)).valid


def test_stale_read_after_a_completed_write_is_invalid():
    verdict = registers(w("x", 1, 0, 1), w("x", 2, 2, 3), r("x", 1, 4, 5))
    assert not verdict.valid
    (anomaly,) = verdict.anomalies
    assert "key 'x' is not linearizable" in anomaly
    assert "#2 p2 read 'x' -> 1 [4..5] ok" in anomaly   # the read, with its times
    assert "#1 p1 write 'x' 2 [2..3] ok" in anomaly     # the write it missed


@pytest.mark.parametrize("got", [1, 2])
def test_read_concurrent_with_a_write_may_see_either_value(got):
    assert registers(w("x", 1, 0, 1), w("x", 2, 2, 5), r("x", got, 3, 4)).valid


def test_reads_may_not_go_back_once_a_concurrent_write_was_seen():
    verdict = registers(w("x", 1, 0, 1), w("x", 2, 2, 10), r("x", 2, 3, 4), r("x", 1, 5, 6))
    assert not verdict.valid


def test_info_write_may_take_effect_much_later():
    assert registers(w("x", 1, 0, 1, INFO), r("x", None, 2, 3), r("x", None, 50, 51), r("x", 1, 100, 101)).valid


def test_info_write_takes_effect_once_for_good():
    verdict = registers(w("x", 1, 0, 1, INFO), r("x", 1, 10, 11), r("x", None, 20, 21))
    assert not verdict.valid


def test_info_write_never_read_is_valid():
    assert registers(w("x", 1, 0, 1, INFO), r("x", None, 2, 3), r("x", None, 4, 5)).valid


def test_info_write_cannot_take_effect_before_its_invocation():
    assert not registers(r("x", 1, 0, 1), w("x", 1, 2, 3, INFO)).valid


def test_op_never_completed_counts_as_info():
    assert registers(w("x", 1, 0, None, None), r("x", 1, 5, 6)).valid


def test_info_read_is_dropped():
    assert registers(w("x", 1, 0, 1), r("x", 7, 2, 3, INFO)).valid


def test_failed_write_read_back_is_invalid():
    verdict = registers(w("x", 1, 0, 1, FAIL), r("x", 1, 2, 3))
    assert not verdict.valid
    assert "returned a value that no write or cas wrote" in verdict.anomalies[0]
    assert "#1 p2 read 'x' -> 1 [2..3] ok" in verdict.anomalies[0]


def test_read_of_a_value_never_written_is_invalid():
    verdict = registers(w("x", 1, 0, 1), r("x", 9, 2, 3))
    assert not verdict.valid and "-> 9" in verdict.anomalies[0]


def test_ops_that_meet_at_an_instant_count_as_concurrent():
    assert registers(w("x", 1, 0, 1), r("x", None, 1, 2)).valid
    assert not registers(w("x", 1, 0, 1), r("x", None, 1.001, 2)).valid


def test_read_of_the_initial_value_after_a_write_completed_is_invalid():
    assert not registers(w("x", 1, 0, 1), r("x", None, 2, 3)).valid


def test_cas_swaps_from_the_current_value():
    assert registers(w("x", 1, 0, 1), cas("x", 1, 2, 2, 3), r("x", 2, 4, 5)).valid


def test_ok_cas_from_a_value_the_register_did_not_hold_is_invalid():
    assert not registers(w("x", 1, 0, 1), cas("x", 5, 2, 2, 3)).valid


def test_failed_cas_took_no_effect():
    assert not registers(w("x", 1, 0, 1), cas("x", 1, 2, 2, 3, FAIL), r("x", 2, 4, 5)).valid
    assert registers(w("x", 1, 0, 1), cas("x", 1, 2, 2, 3, FAIL), r("x", 1, 4, 5)).valid


def test_info_cas_may_swap_later_only_from_its_old_value():
    assert registers(w("x", 1, 0, 1), cas("x", 1, 2, 2, 3, INFO), r("x", 1, 4, 5), r("x", 2, 6, 7)).valid
    assert not registers(w("x", 3, 0, 1), cas("x", 1, 2, 2, 3, INFO), r("x", 2, 6, 7)).valid


def test_concurrent_cas_chain_finds_its_order():
    assert registers(w("x", 0, 0, 1), cas("x", 1, 2, 2, 9, process="a"), cas("x", 0, 1, 3, 8, process="b"),
                     r("x", 2, 10, 11)).valid


def test_keys_are_independent():
    verdict = registers(w("x", 1, 0, 1), w("y", 1, 0, 1), w("y", 2, 2, 3, process="p9"),
                        r("x", 1, 4, 5), r("y", 1, 4, 5))
    assert not verdict.valid
    (anomaly,) = verdict.anomalies
    assert anomaly.startswith("key 'y'")
    assert registers(w("x", 1, 0, 1), w("y", 2, 0, 1), r("x", 1, 2, 3), r("y", 2, 2, 3)).valid


def test_a_key_past_its_search_budget_is_unknown_not_invalid():
    history = record([w("x", 1, 0, 10), w("x", 2, 0, 10, process="p4"), r("x", 2, 0, 10), r("x", 1, 0, 10)])
    verdict = check_registers(history, budget=2)
    assert verdict.valid and verdict.checked == 4
    assert verdict.unknown == ["key 'x': unknown: search budget exhausted (2 steps, 4 ops)"]
    assert check_registers(history).unknown == []


def test_register_checker_refuses_ops_it_does_not_know():
    with pytest.raises(HistoryError, match="delete"):
        registers(Row("p1", "delete", "x", None, 0, 1))


# -- registers: a simulated linearizable register --------------------------------------------------

def simulate_registers(seed: int, *, ops: int = 100, processes: int = 5, keys=("a", "b"),
                       domain: int | None = None, info_rate: float = 0.06, fail_rate: float = 0.03) -> list[Row]:
    """simulate_registers plans ops of `processes` concurrent clients and runs them on a real
    register: each takes effect at a random instant between its invocation and completion; an
    info op takes effect (at any later time, maybe long after) or not, and its client is replaced.
    Values are unique unless drawn from range(`domain`)."""
    rng = random.Random(seed)
    free, names, fresh = [0.0] * processes, [f"p{n}" for n in range(processes)], itertools.count(1)
    recent: dict[str, list] = {key: [None] for key in keys}
    rows = []
    for _ in range(ops):
        slot = min(range(processes), key=free.__getitem__)
        start = free[slot] + rng.uniform(0, 0.2)
        end = start + rng.uniform(0.05, 1.0)
        f, key = rng.choices(["read", "write", "cas"], [5, 4, 2])[0], rng.choice(keys)
        new = next(fresh) if domain is None else rng.randrange(domain)
        value = {"read": None, "write": new,
                 "cas": (recent[key][-1] if rng.random() < 0.7 else rng.choice(recent[key]), new)}[f]
        if f != "read":
            recent[key].append(new)
        roll = rng.random()
        outcome = INFO if roll < info_rate else FAIL if f != "read" and roll < info_rate + fail_rate else OK
        effect = rng.uniform(start, end) if outcome == OK else None
        if outcome == INFO:
            names[slot] = f"p{processes + len(rows)}"
            effect = start + rng.uniform(0, 5 * (end - start)) if rng.random() < 0.5 else None
        rows.append(Row(names[slot], f, key, value, start, end, outcome, extra={"effect": effect}))
        free[slot] = end
    _apply_register_effects(rows)
    return rows


def _apply_register_effects(rows: list[Row]) -> None:
    state: dict[str, Any] = {}
    writer: dict[str, Row | None] = {}
    for row in sorted((row for row in rows if row.extra["effect"] is not None), key=lambda row: row.extra["effect"]):
        current = state.get(row.key)
        if row.f == "read":
            row.result = current
            continue
        if row.f == "cas" and row.value[0] != current:
            if row.outcome == OK:
                row.outcome = FAIL   # the client is told the swap did not happen
            continue
        row.extra.update(before=current, before_writer=writer.get(row.key))
        state[row.key] = row.value[1] if row.f == "cas" else row.value
        writer[row.key] = row


def mutate_stale_read(rows: list[Row], rng: random.Random) -> Row | None:
    """mutate_stale_read makes one ok read return the value from before the last write that
    completed before the read was invoked, where that is a violation whatever the order of
    concurrent ops: the stale value was written (by a unique value) only by an ok op that
    completed before that last write was invoked, or is the initial None. It returns the read."""
    reads = [row for row in rows if row.f == "read" and row.outcome == OK]
    rng.shuffle(reads)
    for read in reads:
        earlier = [row for row in rows if row.key == read.key and row.f != "read" and row.outcome == OK
                   and row.end < read.start]
        if not earlier:
            continue
        last = max(earlier, key=lambda row: row.end)
        source = last.extra["before_writer"]
        if last.extra["before"] == read.result:
            continue
        if source is None or (source.outcome == OK and source.end < last.start):
            read.result = last.extra["before"]
            read.extra["last"] = last
            return read
    return None


@pytest.mark.parametrize("seed", SEEDS)
def test_simulated_registers_are_valid(seed):
    verdict = check_registers(record(simulate_registers(seed)))
    assert verdict.valid and not verdict.unknown, f"seed {seed}: {verdict}"


@pytest.mark.parametrize("seed", SEEDS)
def test_simulated_registers_with_few_values_are_valid(seed):
    verdict = check_registers(record(simulate_registers(seed, domain=3)))
    assert verdict.valid and not verdict.unknown, f"seed {seed}: {verdict}"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_stale_read_in_a_simulated_history_is_found(seed):
    rows = simulate_registers(seed)
    read = mutate_stale_read(rows, random.Random(seed))
    assert read is not None, f"seed {seed}: no read can be made stale"
    verdict = check_registers(record(rows))
    assert not verdict.valid, f"seed {seed}: stale {read.op.describe()} after {read.extra['last'].op.describe()}"
    assert verdict.anomalies[0].startswith(f"key {read.key!r} is not linearizable")
    assert f"no op can take effect before {read.op.describe()} completes" in verdict.anomalies[0], verdict


def random_small_history(seed: int) -> History:
    """random_small_history is six ops on one key with random times, values and outcomes:
    about half are linearizable."""
    rng = random.Random(seed)
    rows = []
    for n in range(6):
        start = rng.uniform(0, 10)
        end, outcome = start + rng.uniform(0.1, 4), rng.choices([OK, INFO, FAIL], [7, 2, 1])[0]
        f = rng.choice(["read", "write", "cas"])
        value = {"read": None, "write": rng.choice([1, 2]), "cas": (rng.choice([None, 1, 2]), rng.choice([1, 2]))}[f]
        rows.append(Row(f"p{n}", f, "x", value, start, end, outcome, rng.choice([None, 1, 2]) if f == "read" else None))
    return record(rows)


def brute_force_linearizable(history: History) -> bool:
    """brute_force_linearizable tries every order of the ok ops with every subset of the info
    writes and cas, keeping those that respect real time and the register's rules."""
    done = [op for op in history if op.outcome == OK]
    maybe = [op for op in history if op.outcome in (INFO, None) and op.f != "read"]
    for size in range(len(maybe) + 1):
        for chosen in itertools.combinations(maybe, size):
            for order in itertools.permutations(done + list(chosen)):
                if all(not later.end < earlier.invoke_time for n, earlier in enumerate(order) for later in order[n + 1:]):
                    state, legal = None, True
                    for op in order:
                        if op.f == "read":
                            legal = op.result == state
                        elif op.f == "cas":
                            legal, state = op.value[0] == state, op.value[1]
                        else:
                            state = op.value
                        if not legal:
                            break
                    if legal:
                        return True
    return False


@pytest.mark.parametrize("seed", range(400))
def test_register_checker_agrees_with_brute_force(seed):
    history = random_small_history(seed)
    verdict = check_registers(history)
    assert verdict.valid == brute_force_linearizable(history), f"seed {seed}: {verdict}\n" + "\n".join(
        op.describe() for op in history)


def test_brute_force_comparison_sees_both_verdicts():
    verdicts = Counter(brute_force_linearizable(random_small_history(seed)) for seed in range(400))
    assert verdicts[True] > 100 and verdicts[False] > 100, verdicts


def test_a_long_key_is_checked_without_recursion():
    history = record(simulate_registers(7, ops=2000, keys=("x",)))
    verdict = check_registers(history)
    kept = [op for op in history if op.outcome == OK or (op.outcome == INFO and op.f != "read")]
    assert verdict.valid and not verdict.unknown and verdict.checked == len(kept) > 1500, verdict


def test_a_300_op_key_of_5_processes_checks_quickly():
    history = record(simulate_registers(11, ops=300, processes=5, keys=("x",)))
    began = time.perf_counter()
    verdict = check_registers(history)
    print(f"\n300-op key, 5 processes: checked in {(time.perf_counter() - began) * 1000:.1f} ms")
    assert verdict.valid and not verdict.unknown, verdict


# -- bank -------------------------------------------------------------------------------------------

ACCOUNTS, TOTAL = ("A", "B"), 20


def transfer(tid, start, end, outcome=OK, frm="A", to="B", amount=3, process="t"):
    return Row(process, "transfer", None, {"id": tid, "from": frm, "to": to, "amount": amount}, start, end, outcome)


def bank_read(balances, ids, start, end, process="r"):
    return Row(process, "read", None, None, start, end, OK, {"balances": balances, "transfers": set(ids)})


def bank(*rows: Row, **options):
    return check_bank(record(list(rows)), ACCOUNTS, TOTAL, **options)


def test_bank_reads_of_consistent_current_snapshots_are_valid():
    verdict = bank(transfer(1, 0, 1), transfer(2, 2, 6, INFO), transfer(3, 2, 3, FAIL),
                   bank_read({"A": 7, "B": 13}, [1], 4, 5), bank_read({"A": 4, "B": 16}, [1, 2], 7, 8))
    assert verdict.valid and verdict.checked == 5, verdict


def test_bank_read_concurrent_with_a_transfer_may_or_may_not_list_it():
    for listed, balances in (([], {"A": 10, "B": 10}), ([1], {"A": 7, "B": 13})):
        assert bank(transfer(1, 0, 3), bank_read(balances, listed, 1, 2), bank_read({"A": 7, "B": 13}, [1], 4, 5)).valid


def test_bank_balances_must_sum_to_the_total():
    verdict = bank(bank_read({"A": 10, "B": 9}, [], 0, 1))
    assert not verdict.valid and "balances sum to 19, not 20" in verdict.anomalies[0]


def test_bank_read_must_cover_exactly_the_accounts():
    verdict = bank(bank_read({"A": 10, "B": 5, "C": 5}, [], 0, 1))
    assert not verdict.valid and "covers accounts ['A', 'B', 'C']" in verdict.anomalies[0]


def test_bank_torn_snapshot_is_found():
    verdict = bank(transfer(1, 0, 1), transfer(2, 0, 1, amount=5),
                   bank_read({"A": 7, "B": 13}, [1, 2], 2, 3))   # sums to 20, lacks transfer 2
    assert not verdict.valid
    (anomaly,) = verdict.anomalies
    assert anomaly.startswith("torn snapshot: #2 r read") and "{'A': (7, 2), 'B': (13, 18)}" in anomaly


def test_bank_lost_commit_before_a_read_is_found():
    verdict = bank(transfer(1, 0, 1), bank_read({"A": 10, "B": 10}, [], 2, 3), bank_read({"A": 7, "B": 13}, [1], 4, 5))
    assert not verdict.valid
    (anomaly,) = verdict.anomalies
    assert anomaly.startswith("lost commit: #1 r read") and "#0 t transfer" in anomaly


def test_bank_ok_transfer_missing_from_the_final_read_is_lost():
    verdict = bank(bank_read({"A": 10, "B": 10}, [], 0, 3), transfer(1, 1, 2))
    assert not verdict.valid
    assert verdict.anomalies[0].startswith("lost commit: #0 r read") and "the final read, misses 1 ok transfer acknowledged after" in verdict.anomalies[0]
    given = bank(transfer(1, 0, 1), final={"balances": {"A": 10, "B": 10}, "transfers": []})
    assert not given.valid
    assert given.anomalies == ["lost commit: final read -> {'balances': {'A': 10, 'B': 10}, 'transfers': []} misses "
                               "1 transfer acknowledged before it was invoked: #0 t transfer {'id': 1, 'from': 'A', "
                               "'to': 'B', 'amount': 3} [0..1] ok"]


def test_bank_final_read_may_be_named():
    history = record([bank_read({"A": 10, "B": 10}, [], 0, 1), transfer(1, 2, 3), bank_read({"A": 7, "B": 13}, [1], 4, 5)])
    assert check_bank(history, ACCOUNTS, TOTAL, final=history.ops[2]).valid
    verdict = check_bank(history, ACCOUNTS, TOTAL, final=history.ops[0])
    assert not verdict.valid and "#0 r read" in verdict.anomalies[0] and "the final read, misses 1" in verdict.anomalies[0]


def test_bank_without_any_read_proves_nothing():
    verdict = bank(transfer(1, 0, 1))
    assert not verdict.valid and verdict.anomalies[0].startswith("no ok read")


def test_bank_failed_transfer_must_not_appear():
    verdict = bank(transfer(1, 0, 1, FAIL), bank_read({"A": 7, "B": 13}, [1], 2, 3))
    assert not verdict.valid and "lists failed transfers: #0 t transfer" in verdict.anomalies[0]


def test_bank_read_must_not_list_a_transfer_never_invoked():
    verdict = bank(bank_read({"A": 10, "B": 10}, [99], 0, 1))
    assert not verdict.valid and "lists transfers never invoked: [99]" in verdict.anomalies[0]


def test_bank_info_transfer_once_seen_must_stay():
    verdict = bank(transfer(1, 0, 1, INFO), bank_read({"A": 7, "B": 13}, [1], 2, 3),
                   bank_read({"A": 10, "B": 10}, [], 4, 5))
    assert not verdict.valid
    assert any(text.startswith("un-commit: transfer 1 is listed by #1 r read") for text in verdict.anomalies)
    assert bank(transfer(1, 0, 1, INFO), bank_read({"A": 10, "B": 10}, [], 2, 3),
                bank_read({"A": 7, "B": 13}, [1], 4, 5)).valid


def simulate_bank(seed: int, *, ops: int = 150, processes: int = 4, accounts="ABCD", total: int = 100) -> list[Row]:
    """simulate_bank runs transfers and snapshot reads on a correct bank: each takes effect at a
    random instant of its span; a transfer larger than the balance fails; info transfers take
    effect later or never."""
    rng = random.Random(seed)
    free = [0.0] * processes
    rows = []
    for tid in range(ops):
        slot = min(range(processes), key=free.__getitem__)
        start = free[slot] + rng.uniform(0, 0.1)
        end = start + rng.uniform(0.05, 0.5)
        if rng.random() < 0.3:
            row = Row(f"r{slot}", "read", None, None, start, end, OK)
        else:
            frm, to = rng.sample(accounts, 2)
            row = Row(f"t{slot}", "transfer", None, {"id": tid, "from": frm, "to": to, "amount": rng.randint(1, 30)},
                      start, end, INFO if rng.random() < 0.08 else OK)
        effect = rng.uniform(start, end)
        if row.outcome == INFO:
            effect = start + rng.uniform(0, 3) if rng.random() < 0.5 else None
        row.extra["effect"] = effect
        rows.append(row)
        free[slot] = end
    balances, applied = {account: total // len(accounts) for account in accounts}, set()
    for row in sorted((row for row in rows if row.extra["effect"] is not None), key=lambda row: row.extra["effect"]):
        if row.f == "read":
            row.result = {"balances": dict(balances), "transfers": set(applied)}
        elif balances[row.value["from"]] < row.value["amount"]:
            row.outcome = FAIL if row.outcome == OK else row.outcome
        else:
            balances[row.value["from"]] -= row.value["amount"]
            balances[row.value["to"]] += row.value["amount"]
            applied.add(row.value["id"])
    for row in rows:
        if row.f == "transfer" and row.outcome == OK and row.extra["effect"] is None:
            row.outcome = FAIL
    rows.append(Row("final", "read", None, None, 10_000, 10_001, OK,
                    {"balances": dict(balances), "transfers": set(applied)}))
    return rows


@pytest.mark.parametrize("seed", range(50))
def test_simulated_bank_is_valid(seed):
    verdict = check_bank(record(simulate_bank(seed)), "ABCD", 100)
    assert verdict.valid, f"seed {seed}: {verdict}"


# -- queue ------------------------------------------------------------------------------------------

def send(value, partition, offset, start, end, outcome=OK, process="producer"):
    row = Row(process, "send", None, {"partition": partition, "value": value}, start, end, outcome)
    row.result = {"offset": offset} if outcome == OK else None
    return row


def consume(records, start, end, group="g", process="consumer"):
    return Row(process, "consume", group, None, start, end, OK,
               [{"partition": p, "offset": o, "value": v} for p, o, v in records])


def queue(*rows: Row, groups=("g",)):
    return check_queue(record(list(rows)), groups)


SENT = (send("a", 0, 0, 0, 1), send("b", 0, 1, 1, 2), send("c", 1, 0, 1, 2))


def test_queue_consumed_once_in_order_is_valid():
    verdict = queue(*SENT, consume([(0, 0, "a"), (1, 0, "c")], 3, 4), consume([(0, 1, "b")], 5, 6))
    assert verdict.valid and verdict.checked == 6, verdict


def test_queue_loss_is_found():
    verdict = queue(*SENT, consume([(0, 0, "a"), (1, 0, "c")], 3, 4))
    assert not verdict.valid
    assert verdict.anomalies == ["lost: group 'g' never consumed 1 ok send: #1 producer send {'partition': 0, "
                                 "'value': 'b'} -> {'offset': 1} [1..2] ok"]


def test_queue_duplicate_is_found():
    verdict = queue(*SENT, consume([(0, 0, "a"), (0, 1, "b"), (1, 0, "c")], 3, 4), consume([(1, 0, "c")], 5, 6))
    assert not verdict.valid
    (anomaly,) = verdict.anomalies
    assert anomaly.startswith("duplicated: group 'g': #4 consumer consume 'g'") and "consumed 'c' at 1/0" in anomaly


def test_queue_reorder_within_a_partition_is_found():
    verdict = queue(*SENT, consume([(0, 1, "b")], 3, 4), consume([(0, 0, "a"), (1, 0, "c")], 5, 6))
    assert not verdict.valid
    (anomaly,) = verdict.anomalies
    assert anomaly.startswith("out of order: group 'g'") and "after offset 1" in anomaly


def test_queue_failed_send_consumed_is_found():
    verdict = queue(*SENT, send("d", 1, None, 1, 2, FAIL),
                    consume([(0, 0, "a"), (0, 1, "b"), (1, 0, "c"), (1, 1, "d")], 3, 4))
    assert not verdict.valid and verdict.anomalies[0].startswith("failed send consumed")


def test_queue_value_never_sent_consumed_is_found():
    verdict = queue(*SENT, consume([(0, 0, "a"), (0, 1, "b"), (1, 0, "c"), (1, 1, "zz")], 3, 4))
    assert not verdict.valid and verdict.anomalies[0].startswith("never sent")


def test_queue_record_at_another_offset_than_acknowledged_is_found():
    verdict = queue(*SENT, consume([(0, 0, "a"), (0, 2, "b"), (1, 0, "c")], 3, 4))
    assert not verdict.valid and verdict.anomalies[0].startswith("wrong offset")


def test_queue_info_send_at_most_once():
    maybe = send("d", 1, None, 1, 2, INFO)
    assert queue(*SENT, maybe, consume([(0, 0, "a"), (0, 1, "b"), (1, 0, "c")], 3, 4)).valid
    assert queue(*SENT, maybe, consume([(0, 0, "a"), (0, 1, "b"), (1, 0, "c"), (1, 1, "d")], 3, 4)).valid
    twice = queue(*SENT, maybe, consume([(0, 0, "a"), (0, 1, "b"), (1, 0, "c"), (1, 1, "d")], 3, 4),
                  consume([(1, 2, "d")], 5, 6))
    assert not twice.valid and twice.anomalies[0].startswith("duplicated")


def test_queue_groups_are_checked_apart():
    verdict = queue(*SENT, consume([(0, 0, "a"), (0, 1, "b"), (1, 0, "c")], 3, 4, group="g1"),
                    consume([(0, 0, "a"), (1, 0, "c")], 3, 4, group="g2"), groups=("g1", "g2"))
    assert not verdict.valid
    (anomaly,) = verdict.anomalies
    assert anomaly.startswith("lost: group 'g2'")


def test_queue_needs_unique_values():
    with pytest.raises(HistoryError, match="sent twice"):
        queue(send("a", 0, 0, 0, 1), send("a", 0, 1, 1, 2))


def simulate_queue(seed: int, *, sends: int = 80, partitions: int = 3, groups=("g1", "g2")) -> list[Row]:
    """simulate_queue appends sends to a correct log (an info send is written or not) and lets
    each group consume every partition in batches, committing in order."""
    rng = random.Random(seed)
    rows, logs = [], {p: [] for p in range(partitions)}
    for n in range(sends):
        start = n * 0.1 + rng.uniform(0, 0.05)
        outcome = rng.choices([OK, INFO, FAIL], [90, 6, 4])[0]
        row = send(f"v{n}", rng.randrange(partitions), None, start, start + rng.uniform(0.01, 0.3), outcome)
        if outcome == OK or (outcome == INFO and rng.random() < 0.5):
            log = logs[row.value["partition"]]
            if outcome == OK:
                row.result = {"offset": len(log)}
            log.append(row.value["value"])
        rows.append(row)
    for group in groups:
        at, now = {p: 0 for p in logs}, sends * 0.1 + 1
        while any(at[p] < len(logs[p]) for p in logs):
            batch = []
            for p in rng.sample(sorted(logs), rng.randint(1, partitions)):
                take = rng.randint(0, 5)
                batch += [(p, o, logs[p][o]) for o in range(at[p], min(at[p] + take, len(logs[p])))]
                at[p] = min(at[p] + take, len(logs[p]))
            rows.append(consume(batch, now, now + 0.05, group=group, process=f"{group}-c{rng.randrange(2)}"))
            now += 0.1
    return rows


@pytest.mark.parametrize("seed", range(50))
def test_simulated_queue_is_valid(seed):
    verdict = check_queue(record(simulate_queue(seed)), ("g1", "g2"))
    assert verdict.valid, f"seed {seed}: {verdict}"


# -- saved histories --------------------------------------------------------------------------------

def _same_verdict_after_reload(history: History, check, tmp_path) -> None:
    path = str(tmp_path / "history.jsonl")
    history.to_jsonl(path)
    loaded = History.from_jsonl(path)
    assert loaded.ops == history.ops
    assert check(loaded) == check(history)


@pytest.mark.parametrize("seed", range(5))
def test_register_history_reloads_to_the_same_verdict(seed, tmp_path):
    rows = simulate_registers(seed, keys=(b"a", ("tuple", 1)))
    mutate_stale_read(rows, random.Random(seed))
    history = record(rows)
    assert not check_registers(history).valid
    _same_verdict_after_reload(history, check_registers, tmp_path)


def test_bank_and_queue_histories_reload_to_the_same_verdicts(tmp_path):
    _same_verdict_after_reload(record(simulate_bank(3)), lambda h: check_bank(h, "ABCD", 100), tmp_path)
    broken = record([transfer(1, 0, 1, INFO), bank_read({"A": 7, "B": 13}, [1], 2, 3),
                     bank_read({"A": 10, "B": 10}, [], 4, 5)])
    _same_verdict_after_reload(broken, lambda h: check_bank(h, ACCOUNTS, TOTAL), tmp_path)
    _same_verdict_after_reload(record(simulate_queue(3)), lambda h: check_queue(h, ("g1", "g2")), tmp_path)


def test_bank_accounts_may_be_numbers_after_reload(tmp_path):
    history = record([transfer(1, 0, 1, frm=0, to=1), bank_read({0: 7, 1: 13}, [1], 2, 3)])
    _same_verdict_after_reload(history, lambda h: check_bank(h, (0, 1), 20), tmp_path)
    assert check_bank(history, (0, 1), 20).valid


def consume_in_doubt(offsets, start, end, group="g", process="consumer"):
    """consume_in_doubt is a batch whose commit the client was told failed, naming the offsets it asked for."""
    return Row(process, "consume", group, {"token": "t", "offsets": offsets}, start, end, INFO, None)


def test_queue_records_of_a_batch_whose_commit_is_in_doubt_are_unknown_not_lost():
    # the commit of the batch holding "b" may have taken effect: the next consumer rightly starts after it
    verdict = queue(*SENT, consume([(0, 0, "a"), (1, 0, "c")], 3, 4), consume_in_doubt({0: [1, 2]}, 5, 6))
    assert verdict.valid, verdict
    (unknown,) = verdict.unknown
    assert "1 ok send consumed only by batches whose commit's outcome is unknown" in unknown and "'b'" in unknown


def test_queue_a_record_outside_every_batch_in_doubt_is_still_lost():
    verdict = queue(*SENT, consume([(0, 0, "a"), (1, 0, "c")], 3, 4), consume_in_doubt({0: [0, 1], 1: [0, 1]}, 5, 6))
    assert not verdict.valid and verdict.anomalies[0].startswith("lost: group 'g' never consumed 1 ok send")


def test_queue_a_record_of_a_batch_in_doubt_consumed_twice_afterwards_is_duplicated():
    verdict = queue(*SENT, consume([(0, 0, "a"), (1, 0, "c")], 3, 4), consume_in_doubt({0: [1, 2]}, 5, 6),
                    consume([(0, 1, "b")], 7, 8), consume([(0, 1, "b")], 9, 10))
    assert not verdict.valid and verdict.anomalies[0].startswith("duplicated")
