"""walkit.testing.history records a Jepsen-style history of client operations and checks it.

    history = History()
    op = history.invoke("p1", "write", key="x", value=3)
    history.ok(op)                          # or history.fail(op, err) / history.info(op, err)
    op = history.invoke("p2", "read", key="x")
    history.ok(op, 3)                       # a read's observed value is its completion value
    verdict = check_registers(history)
    assert verdict.valid and not verdict.unknown, verdict

An op's outcome is "ok", "fail" (known not to have taken effect) or "info" (unknown: it may
have taken effect at any instant after its invocation, or never); an op never completed counts
as info. Op A precedes op B in real time only when A completed strictly before B was invoked:
equal times count as concurrent, so a coarse clock can hide a violation but never invent one.

The checkers are `check_registers` (per-key linearizability of read/write/cas registers, the
KV adapter), `check_bank` (snapshot reads and no lost commit, the SQLite adapter) and
`check_queue` (exactly-once, in-order consumption per group, the topics adapter). Each returns
a `Verdict` whose anomalies name the ops involved with their times. `History.to_jsonl` saves a
failing run and `History.from_jsonl` loads it to be checked again.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from walkit.errors import WalkitError

__all__ = ["DEFAULT_BUDGET", "FAIL", "History", "HistoryError", "INFO", "OK", "Op", "Verdict",
           "check_bank", "check_queue", "check_registers"]

OK, FAIL, INFO = "ok", "fail", "info"

#: Search steps `check_registers` spends on one key before it calls the key unknown.
DEFAULT_BUDGET = 2_000_000

#: Anomalies `Verdict.__str__` prints before it says how many more there are.
PRINTED_ANOMALIES = 20


class HistoryError(WalkitError, ValueError):
    """HistoryError is raised for a misuse of a history: completing an op twice, an op a
    checker does not know, or values a checker needs unique that are not."""


@dataclass(kw_only=True)
class Op:
    """Op is one operation of a history: its invocation and, once known, its completion.

    `value` is the op's input; for an op invoked without one (a read) it is the value the op
    completed with. `result` is always the completion value given to `History.ok`.
    `complete_time` is None while pending and for info ops, whose effect has no deadline.
    """

    index: int
    process: Any
    f: str
    key: Any = None
    value: Any = None
    result: Any = None
    invoke_time: float
    complete_time: float | None = None
    outcome: str | None = None
    error: str | None = None

    @property
    def end(self) -> float:
        """end is the time by which the op took effect, if it did: +infinity when unknown."""
        return math.inf if self.complete_time is None or self.outcome not in (OK, FAIL) else self.complete_time

    def describe(self) -> str:
        """describe names the op for an anomaly: index, process, f, key, values, times, outcome."""
        what = self.f if self.key is None else f"{self.f} {self.key!r}"
        if self.value is not None and not (self.f in ("read", "consume") and self.outcome == OK):
            what += f" {_short(self.value)}"
        if self.result is not None or (self.f == "read" and self.outcome == OK):
            what += f" -> {_short(self.result)}"
        if self.index < 0:
            return f"final {what}"   # a read given to a checker, after the whole history
        end = "?" if self.complete_time is None else _t(self.complete_time)
        error = f" ({self.error})" if self.error else ""
        return f"#{self.index} {self.process} {what} [{_t(self.invoke_time)}..{end}] {self.outcome or 'pending'}{error}"


def _t(seconds: float) -> str:
    return "inf" if seconds == math.inf else f"{seconds:.6f}".rstrip("0").rstrip(".")


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass
class Verdict:
    """Verdict is what a checker found: `valid` is False when any anomaly was found; `unknown`
    lists what could not be decided (a key whose search ran out of budget) without failing."""

    valid: bool
    checked: int
    anomalies: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = f"{'valid' if self.valid else 'INVALID'}: {self.checked} ops checked"
        lines = [head + (f", {len(self.anomalies)} anomalies" if self.anomalies else "")]
        lines += [f"- {text}" for text in self.anomalies[:PRINTED_ANOMALIES]]
        if len(self.anomalies) > PRINTED_ANOMALIES:
            lines.append(f"... and {len(self.anomalies) - PRINTED_ANOMALIES} more anomalies")
        lines += [f"? {text}" for text in self.unknown]
        return "\n".join(lines)


def _verdict(checked: int, anomalies: list[str], unknown: list[str] | None = None) -> Verdict:
    return Verdict(valid=not anomalies, checked=checked, anomalies=anomalies, unknown=unknown or [])


class History:
    """History is a thread-safe record of operations, numbered in invocation order.

    `clock` gives the times (seconds, monotonic); tests pass their own to script a history.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    def invoke(self, process: Any, f: str, key: Any = None, value: Any = None) -> Op:
        """invoke records that `process` started op `f` on `key` with input `value`."""
        with self._lock:
            op = Op(index=len(self._ops), process=process, f=f, key=key, value=value, invoke_time=self._clock())
            self._ops.append(op)
        return op

    def ok(self, op: Op, value: Any = None) -> None:
        """ok records that `op` took effect and completed with `value` (a read: what it read)."""
        self._complete(op, OK, None, value)

    def fail(self, op: Op, error: Any) -> None:
        """fail records that `op` is known not to have taken effect."""
        self._complete(op, FAIL, error)

    def info(self, op: Op, error: Any) -> None:
        """info records that `op`'s outcome is unknown (a timeout, a lost connection)."""
        self._complete(op, INFO, error)

    def _complete(self, op: Op, outcome: str, error: Any, value: Any = None) -> None:
        with self._lock:
            if op.index >= len(self._ops) or self._ops[op.index] is not op:
                raise HistoryError(f"{op.describe()} is not an op of this history")
            if op.outcome is not None:
                raise HistoryError(f"{op.describe()} was already completed")
            op.complete_time = None if outcome == INFO else self._clock()
            op.outcome = outcome
            op.error = None if error is None else _error_text(error)
            if outcome == OK:
                op.result = value
                if op.value is None:
                    op.value = value

    @property
    def ops(self) -> list[Op]:
        """ops is a copy of the list of ops, in invocation order."""
        with self._lock:
            return list(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self._ops)

    def to_jsonl(self, path: str) -> None:
        """to_jsonl writes one JSON object per op; tuples, sets, bytes and dict keys survive."""
        with open(path, "w", encoding="utf-8") as out:
            for op in self.ops:
                record = {name: _encode(getattr(op, name)) for name in _FIELDS}
                out.write(json.dumps(record) + "\n")

    @classmethod
    def from_jsonl(cls, path: str) -> History:
        """from_jsonl reads a history `to_jsonl` wrote; ops keep their indexes and times."""
        history = cls()
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    history._ops.append(Op(**{name: _decode(value) for name, value in json.loads(line).items()}))
        if any(op.index != position for position, op in enumerate(history._ops)):
            raise HistoryError(f"{path}: op indexes are not 0, 1, 2, ... in order")
        return history


_FIELDS = ("index", "process", "f", "key", "value", "result", "invoke_time", "complete_time", "outcome", "error")


def _error_text(error: Any) -> str:
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return str(error)


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(item) for item in value]}
    if isinstance(value, (set, frozenset)):
        tag = "__set__" if isinstance(value, set) else "__frozenset__"
        return {tag: [_encode(item) for item in sorted(value, key=repr)]}
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if isinstance(value, dict):
        return {"__dict__": [[_encode(k), _encode(v)] for k, v in value.items()]}
    raise HistoryError(f"cannot save a {type(value).__name__} in a history: {value!r}")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    (tag, inner), = value.items()
    if tag == "__dict__":
        return {_decode(k): _decode(v) for k, v in inner}
    if tag == "__bytes__":
        return bytes.fromhex(inner)
    items = [_decode(item) for item in inner]
    return {"__tuple__": tuple, "__set__": set, "__frozenset__": frozenset}[tag](items)


def _freeze(value: Any) -> Any:
    """_freeze returns a hashable stand-in for `value`, equal for equal values."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(item) for item in value)
    if isinstance(value, dict):
        return frozenset((_freeze(k), _freeze(v)) for k, v in value.items())
    if isinstance(value, set):
        return frozenset(value)
    return value


def _by_completion(ops: Iterable[Op]) -> list[Op]:
    return sorted(ops, key=lambda op: (op.end, op.index))


# -- registers: linearizability per key ----------------------------------------------------------

_READ, _WRITE, _CAS = 0, 1, 2
_REGISTER_FS = {"read": _READ, "write": _WRITE, "cas": _CAS}
_WINDOW = 12   # ops an anomaly shows around the op that could not be linearized


def check_registers(history: Iterable[Op], *, budget: int = DEFAULT_BUDGET) -> Verdict:
    """check_registers checks that each key's read/write/cas ops are linearizable.

    A register starts as None (absent). write(key, v) sets it; read(key) -> v observed it;
    cas(key, (old, new)) completed ok swapped old for new. Failed ops are dropped, info reads
    too; an info write or cas may take effect at any point after its invocation, or never.
    Keys are independent. A key whose search takes more than `budget` steps is listed in
    `unknown` and does not make the verdict invalid.
    """
    by_key: dict[Any, list[Op]] = {}
    for op in history:
        if op.f not in _REGISTER_FS:
            raise HistoryError(f"check_registers knows read, write and cas, not {op.describe()}")
        if op.f == "cas" and (not isinstance(op.value, (tuple, list)) or len(op.value) != 2):
            raise HistoryError(f"a cas takes (old, new): {op.describe()}")
        by_key.setdefault(op.key, []).append(op)
    checked, anomalies, unknown = 0, [], []
    for key, ops in by_key.items():
        checked += _check_register(key, ops, budget, anomalies, unknown)
    return _verdict(checked, anomalies, unknown)


def _written(op: Op) -> Any:
    return op.value[1] if op.f == "cas" else op.value


def _check_register(key: Any, ops: list[Op], budget: int, anomalies: list[str], unknown: list[str]) -> int:
    """_check_register checks one key's ops and returns how many it checked."""
    done = [op for op in ops if op.outcome == OK]
    maybe = [op for op in ops if op.outcome in (INFO, None) and op.f != "read"]
    writable = {_freeze(_written(op)) for op in done + maybe if op.f != "read"} | {None}
    ghosts = [op for op in done if op.f == "read" and _freeze(op.result) not in writable]
    for read in ghosts:
        anomalies.append(f"key {key!r}: {read.describe()} returned a value that no write or cas wrote, "
                         f"counting those that may have taken effect (failed ops did not)")
    if ghosts:
        return len(done) + len(maybe)
    # An unknown write nobody could observe is never needed to explain a read: leave it out.
    observed = {_freeze(op.result) for op in done if op.f == "read"}
    observed |= {_freeze(op.value[0]) for op in done + maybe if op.f == "cas"}
    needed = [op for op in maybe if _freeze(_written(op)) in observed]
    outcome = _Linearization(done, needed).search(budget)
    if outcome == "unknown":
        unknown.append(f"key {key!r}: unknown: search budget exhausted ({budget:,} steps, {len(ops)} ops)")
    elif outcome != "valid":
        anomalies.append(f"key {key!r} is not linearizable: {outcome}")
    return len(done) + len(maybe)


class _Linearization:
    """_Linearization searches for a linearization of one register's ops.

    It is Lowe's just-in-time linearization as in Porcupine (Wing & Gong's search, pruned):
    the next op to take effect is one invoked before the earliest completion still pending;
    a (set of ops linearized, register state) pair already explored is not explored again.
    The search is an explicit stack of frames, so a long history cannot overflow Python's.
    Ok ops are tried first, in invocation order; unknown ops after them, and may never be taken.
    """

    def __init__(self, done: list[Op], maybe: list[Op]) -> None:
        order = lambda op: (op.invoke_time, op.index)  # noqa: E731
        self.ops = sorted(done, key=order) + sorted(maybe, key=order)
        self.n_ok = len(done)
        self.values: dict[Any, int] = {None: 0}
        self.kind, self.a, self.b = [], [], []
        for op in self.ops:
            self.kind.append(_REGISTER_FS[op.f])
            if op.f == "cas":
                first, second = op.value
            else:
                first, second = (op.result if op.f == "read" else op.value), None
            self.a.append(self._intern(first))
            self.b.append(self._intern(second))
        self.call = [op.invoke_time for op in self.ops]
        self.ret = [op.end for op in self.ops]
        self.by_ret = sorted(range(self.n_ok), key=lambda i: (self.ops[i].end, i))
        self.furthest: tuple[int, int, int, list[int]] | None = None   # (ok ops, state, blocker, path)

    def _intern(self, value: Any) -> int:
        return self.values.setdefault(_freeze(value), len(self.values))

    def search(self, budget: int) -> str:
        """search returns "valid", "unknown" (budget spent) or why the ops are not linearizable."""
        if self.n_ok == 0:
            return "valid"
        done = bytearray(len(self.ops))
        seen: set[tuple[int, int, int]] = set()
        # A frame: [candidates, next candidate, bits linearized, state, first ok op not
        # linearized (invocation order), first pending completion (by_ret), ok ops linearized, op taken].
        stack = [[self._candidates(done, 0, 0), 0, 0, 0, 0, 0, 0, -1]]
        steps = 0
        while stack:
            top = stack[-1]
            candidates, position, bits, state, lo_inv, lo_ret, taken, via = top
            if position == len(candidates):
                self._note_dead_end(stack, top)
                stack.pop()
                if via >= 0:
                    done[via] = 0
                continue
            top[1] = position + 1
            steps += 1
            if steps > budget:
                return "unknown"
            i = candidates[position]
            kind = self.kind[i]
            if kind != _WRITE and state != self.a[i]:
                continue
            after = self.a[i] if kind == _WRITE else (self.b[i] if kind == _CAS else state)
            ok_taken = taken + (i < self.n_ok)
            if ok_taken == self.n_ok:
                return "valid"
            done[i] = 1
            bits |= 1 << i
            while done[lo_inv]:
                lo_inv += 1
            memo = (lo_inv, bits >> lo_inv, after)
            if memo in seen:
                done[i] = 0
                continue
            seen.add(memo)
            while done[self.by_ret[lo_ret]]:
                lo_ret += 1
            stack.append([self._candidates(done, lo_inv, lo_ret), 0, bits, after, lo_inv, lo_ret, ok_taken, i])
        return self._explain()

    def _candidates(self, done: bytearray, lo_inv: int, lo_ret: int) -> list[int]:
        """_candidates lists the ops not linearized yet that were invoked no later than the
        earliest pending completion: ok ops first, then unknown ones. Unknown ops that do the
        same (write 2, say) can take effect at the same points, so only the first invoked of
        each kind is a candidate: the search never tries their permutations."""
        horizon = self.ret[self.by_ret[lo_ret]]
        found = []
        for i in range(lo_inv, self.n_ok):
            if self.call[i] > horizon:
                break
            if not done[i]:
                found.append(i)
        kinds = set()
        for i in range(self.n_ok, len(self.ops)):
            if self.call[i] > horizon:
                break
            if not done[i] and (self.kind[i], self.a[i], self.b[i]) not in kinds:
                kinds.add((self.kind[i], self.a[i], self.b[i]))
                found.append(i)
        return found

    def _note_dead_end(self, stack: list[list], top: list) -> None:
        taken = top[6]
        if self.furthest is None or taken > self.furthest[0]:
            self.furthest = (taken, top[3], self.by_ret[top[5]], [frame[7] for frame in stack[1:]])

    def _explain(self) -> str:
        taken, state, blocker, path = self.furthest
        names = {number: value for value, number in self.values.items()}
        stuck = self.ops[blocker]
        lines = [f"at best {taken} of {self.n_ok} ok ops linearize, leaving the register at "
                 f"{names[state]!r}" + (" after:" if path else " (its initial value)")]
        lines += [f"    {self.ops[i].describe()}" for i in path[-3:]]
        lines.append(f"  and then no op can take effect before {stuck.describe()} completes. Ops around it:")
        lines += [f"    {op.describe()}" for op in self._around(stuck)]
        return "\n".join(lines)

    def _around(self, stuck: Op) -> list[Op]:
        overlapping = [op for op in self.ops if op.invoke_time <= stuck.end and op.end >= stuck.invoke_time]
        before = [op for op in _by_completion(self.ops) if op.end < stuck.invoke_time][-3:]
        window = {op.index for op in before + overlapping}
        chosen = [op for op in self.ops if op.index in window]
        chosen.sort(key=lambda op: (op.invoke_time, op.index))
        if len(chosen) > _WINDOW:   # keep those nearest the stuck op in invocation order
            at = chosen.index(stuck)
            start = max(0, min(at - _WINDOW // 2, len(chosen) - _WINDOW))
            chosen = chosen[start:start + _WINDOW]
        return chosen


# -- bank: snapshot reads over SQLite --------------------------------------------------------------

def check_bank(history: Iterable[Op], accounts: Iterable[Any], total: int, *,
               initial: Mapping[Any, int] | None = None, final: Op | Mapping | None = None) -> Verdict:
    """check_bank checks a bank's transfers and snapshot reads.

    A transfer's value is {"id", "from", "to", "amount"} (ids unique); an ok read's completion
    value is {"balances": {account: int}, "transfers": ids its snapshot holds}. `initial` is the
    balances before any transfer (default: `total` spread evenly over `accounts`). The rules:
    (a) a read's balances cover exactly `accounts` and sum to `total`; (b) they equal `initial`
    plus exactly the transfers the read lists; (c) a read lists every transfer acknowledged ok
    before it was invoked, and the final read (`final`, an op or a read's value; by default the
    last ok read to complete) lists every ok transfer; (d) no read lists a failed transfer;
    (e) nor an id never invoked; (f) once a read lists a transfer, every read invoked after that
    read completed lists it (no un-commit).
    """
    accounts = set(accounts)
    initial = dict(initial) if initial is not None else _spread(total, accounts)
    if set(initial) != accounts or sum(initial.values()) != total:
        raise HistoryError(f"initial balances {initial} do not cover {sorted(accounts, key=repr)} with total {total}")
    transfers, reads = _transfers_and_reads(history)
    if isinstance(final, Mapping):
        final = Op(index=-1, process="final", f="read", value=final, result=final,
                   invoke_time=math.inf, complete_time=math.inf, outcome=OK)   # after every op
    if final is not None and not any(read is final for read in reads):
        reads.append(final)
    reads = _by_completion(reads)
    if final is None and reads:
        final = reads[-1]
    anomalies: list[str] = []
    acked = _by_completion(op for op in transfers.values() if op.outcome == OK)
    if acked and final is None:
        anomalies.append(f"no ok read: nothing shows that the {len(acked)} ok transfers committed")
    first_listed: dict[Any, Op] = {}
    for read in reads:
        listed = set(read.result["transfers"])
        _check_bank_read(read, listed, accounts, total, initial, transfers, anomalies)
        _check_currency(read, listed, acked, first_listed, anomalies)
        for tid in listed:
            first_listed.setdefault(tid, read)   # reads come in completion order
    if final is not None:
        listed = set(final.result["transfers"])
        lost = [op for op in acked if op.end >= final.invoke_time and op.value["id"] not in listed]
        if lost:
            anomalies.append(f"lost commit: {final.describe()}, the final read, misses {_count(lost, 'ok transfer')} "
                             f"acknowledged after it was invoked: " + _some(lost))
    return _verdict(len(transfers) + len(reads), anomalies)


def _transfers_and_reads(history: Iterable[Op]) -> tuple[dict[Any, Op], list[Op]]:
    """_transfers_and_reads returns a bank history's transfers by id and its ok reads."""
    transfers: dict[Any, Op] = {}
    reads = []
    for op in history:
        if op.f == "transfer":
            if op.value["id"] in transfers:
                raise HistoryError(f"two transfers have id {op.value['id']!r}: {op.describe()}")
            transfers[op.value["id"]] = op
        elif op.f == "read":
            if op.outcome == OK:
                reads.append(op)
        else:
            raise HistoryError(f"check_bank knows transfer and read, not {op.describe()}")
    return transfers, reads


def _spread(total: int, accounts: set) -> dict[Any, int]:
    ordered = sorted(accounts, key=repr)
    share, extra = divmod(total, len(ordered))
    return {account: share + (n < extra) for n, account in enumerate(ordered)}


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}" + ("" if len(items) == 1 else "s")


def _some(ops: list[Op], limit: int = 5) -> str:
    shown = "; ".join(op.describe() for op in ops[:limit])
    return shown + (f"; and {len(ops) - limit} more" if len(ops) > limit else "")


def _check_bank_read(read: Op, listed: set, accounts: set, total: int, initial: dict,
                     transfers: dict[Any, Op], anomalies: list[str]) -> None:
    """_check_bank_read checks rules (a), (b), (d) and (e) on one read."""
    balances = read.result["balances"]
    if set(balances) != accounts:
        anomalies.append(f"{read.describe()} covers accounts {sorted(balances, key=repr)}, "
                         f"not {sorted(accounts, key=repr)}")
    elif sum(balances.values()) != total:
        anomalies.append(f"{read.describe()}: balances sum to {sum(balances.values())}, not {total}")
    ghosts = sorted((tid for tid in listed if tid not in transfers), key=repr)
    if ghosts:
        anomalies.append(f"{read.describe()} lists transfers never invoked: {ghosts}")
        return
    failed = sorted((transfers[tid] for tid in listed if transfers[tid].outcome == FAIL), key=lambda op: op.index)
    if failed:
        anomalies.append(f"{read.describe()} lists failed transfers: " + _some(failed))
    expected = dict(initial)
    for tid in listed:
        move = transfers[tid].value
        expected[move["from"]] = expected.get(move["from"], 0) - move["amount"]
        expected[move["to"]] = expected.get(move["to"], 0) + move["amount"]
    if expected != dict(balances):
        wrong = {account: (balances.get(account), expected.get(account))
                 for account in sorted(set(expected) | set(balances), key=repr)
                 if balances.get(account) != expected.get(account)}
        anomalies.append(f"torn snapshot: {read.describe()} is not the initial balances plus the "
                         f"{len(listed)} transfers it lists; (read, expected) per account: {wrong}")


def _check_currency(read: Op, listed: set, acked: list[Op], first_listed: dict[Any, Op],
                    anomalies: list[str]) -> None:
    """_check_currency checks rules (c) and (f) on one read, given the reads completed before it."""
    lost = [op for op in acked if op.end < read.invoke_time and op.value["id"] not in listed]
    if lost:
        anomalies.append(f"lost commit: {read.describe()} misses {_count(lost, 'transfer')} acknowledged "
                         f"before it was invoked: " + _some(lost))
    gone_ids = {op.value["id"] for op in lost}
    gone = sorted(((tid, earlier) for tid, earlier in first_listed.items()
                   if earlier.end < read.invoke_time and tid not in listed and tid not in gone_ids),
                  key=lambda pair: repr(pair[0]))
    for tid, earlier in gone:
        anomalies.append(f"un-commit: transfer {tid!r} is listed by {earlier.describe()}, "
                         f"but not by {read.describe()}, invoked after that")


# -- queue: exactly-once consumption per group -----------------------------------------------------

def check_queue(history: Iterable[Op], groups: Iterable[Any]) -> Verdict:
    """check_queue checks that each consumer group consumed every sent value exactly once, in order.

    A "send" op's value is {"partition", "value"} (values unique) and its ok completion value
    {"offset"}. A "consume" op's key is its group and its ok completion value the records
    {"partition", "offset", "value"} whose offsets the consumer committed. Per group: an ok
    send is consumed exactly once (else "lost" or "duplicated"), an info send at most once, a
    failed send or a value never sent never; within a partition, offsets strictly increase in
    commit order (consume ops ordered by completion); a consumed record has the partition and
    offset its send was acknowledged with.

    An info consume is a batch whose commit's outcome is unknown: the client was told the commit
    failed, but an earlier attempt of it may have taken effect (a retried request whose first try
    was still being appended), and then the group's next consumer rightly starts after it. Its
    value may name the offsets it asked to commit ({"offsets": {partition: [first, end]}}); an ok
    send in those ranges that no ok consume holds is then not lost but `unknown` in the verdict.
    A record outside every batch is still lost, and one that two ok consumes hold still duplicated.
    """
    ops = list(history)
    sends: dict[Any, Op] = {}
    at_offset: dict[tuple, Op] = {}
    anomalies: list[str] = []
    for op in ops:
        if op.f not in ("send", "consume"):
            raise HistoryError(f"check_queue knows send and consume, not {op.describe()}")
        if op.f == "send":
            value = _freeze(op.value["value"])
            if value in sends:
                raise HistoryError(f"value {op.value['value']!r} is sent twice; check_queue needs unique values")
            sends[value] = op
            if op.outcome == OK:
                place = (op.value["partition"], op.result["offset"])
                if place in at_offset:
                    anomalies.append(f"two sends acknowledged at partition {place[0]!r} offset {place[1]}: "
                                     f"{at_offset[place].describe()}; {op.describe()}")
                at_offset[place] = op
    checked = len(sends)
    unknown: list[str] = []
    for group in groups:
        consumes = _by_completion(op for op in ops if op.f == "consume" and op.key == group and op.outcome == OK)
        checked += sum(len(op.result or ()) for op in consumes)
        in_doubt = {(partition, offset): op for op in ops
                    if op.f == "consume" and op.key == group and op.outcome == INFO and isinstance(op.value, dict)
                    for partition, (first, end) in (op.value.get("offsets") or {}).items()
                    for offset in range(first, end)}
        _check_group(group, consumes, sends, anomalies, in_doubt, unknown)
    return _verdict(checked, anomalies, unknown)


def _check_group(group: Any, consumes: list[Op], sends: dict[Any, Op], anomalies: list[str],
                 in_doubt: dict[tuple, Op], unknown: list[str]) -> None:
    first: dict[Any, Op] = {}
    times: Counter = Counter()
    last: dict[Any, tuple[int, Op]] = {}
    for consume in consumes:
        for record in consume.result or ():
            partition, offset, value = record["partition"], record["offset"], _freeze(record["value"])
            where = f"group {group!r}: {consume.describe()} consumed {record['value']!r} at {partition!r}/{offset}"
            times[value] += 1
            if value in first:   # a redelivery: its offset going back is the same fault
                if times[value] == 2:
                    anomalies.append(f"duplicated: {where}, already consumed by {first[value].describe()}")
                continue
            first[value] = consume
            if partition in last and offset <= last[partition][0]:
                anomalies.append(f"out of order: {where}, after offset {last[partition][0]} "
                                 f"in {last[partition][1].describe()}")
            last[partition] = (offset, consume)
            _check_record(where, partition, offset, sends.get(value), anomalies)
    missed = [send for value, send in sends.items() if send.outcome == OK and times[value] == 0]
    maybe = [send for send in missed if (send.value["partition"], send.result["offset"]) in in_doubt]
    lost = [send for send in missed if (send.value["partition"], send.result["offset"]) not in in_doubt]
    if lost:
        anomalies.append(f"lost: group {group!r} never consumed {_count(lost, 'ok send')}: " + _some(lost))
    if maybe:
        batches = sorted({in_doubt[(send.value["partition"], send.result["offset"])].index for send in maybe})
        unknown.append(f"group {group!r}: {_count(maybe, 'ok send')} consumed only by batches whose commit's "
                       f"outcome is unknown (ops {', '.join(f'#{i}' for i in batches)}); right if that commit took "
                       f"effect: " + _some(maybe))


def _check_record(where: str, partition: Any, offset: int, send: Op | None, anomalies: list[str]) -> None:
    """_check_record checks that a consumed record was sent, did not fail, and sits where its
    send was acknowledged."""
    if send is None:
        anomalies.append(f"never sent: {where}")
    elif send.outcome == FAIL:
        anomalies.append(f"failed send consumed: {where}; sent by {send.describe()}")
    elif send.value["partition"] != partition:
        anomalies.append(f"wrong partition: {where}, sent to {send.value['partition']!r} by {send.describe()}")
    elif send.outcome == OK and send.result["offset"] != offset:
        anomalies.append(f"wrong offset: {where}, acknowledged at {send.result['offset']} to {send.describe()}")
