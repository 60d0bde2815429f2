"""Faults for the kept-trial review (tests/adapters/test_sqlite_review_kept_trial.py): a held append, an
interrupt at a chosen line, and a node process that SIGKILLs itself while its trial is kept.

HeldAppend holds a leader's acknowledged entry before it is applied (its trial kept);
`interrupting` raises Interrupted at one line, as a KeyboardInterrupt lands between two
bytecodes. Run as a program, this module is one node process:

    python tests/adapters/sqlite_review_helpers.py METADATA NAME NODE_ID FILE

Commands on stdin, each answered by one JSON line: `state` (is_leader, position, failed);
`create` (table t); `write ID SIZE` (inserts row ID with a blob of SIZE bytes into t and commits);
`kill-before-append` (the next record this process sends to the log SIGKILLs it instead, its
trial kept); `kill-at-acked` (the next entry the log acknowledges SIGKILLs it before it is
applied, failpoint replicate.acked); `quit`.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import threading

from walkit import faults


class Interrupted(BaseException):
    """Interrupted stands for a KeyboardInterrupt landing between two bytecodes (`except Exception` lets it by)."""


def interrupting(function, text: str):
    """interrupting raises Interrupted once, in this thread, when `function` reaches the line holding `text`."""
    lines, first = inspect.getsourcelines(function)
    target = first + next(i for i, line in enumerate(lines) if text in line)
    code = getattr(function, "__code__", None) or function.__func__.__code__
    fired: list[int] = []

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == target and not fired:
            fired.append(target)
            raise Interrupted(f"interrupted at line {target} of {code.co_name}")
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is code else None

    class _Context:
        def __enter__(self):
            sys.settrace(tracer)
            return fired

        def __exit__(self, *exc):
            sys.settrace(None)
            return False
    return _Context()


def keeps_nothing(machine) -> bool:
    """keeps_nothing tells whether a SqliteMachine holds no group (no kept trial) and no open transaction."""
    return not machine.members and not machine.db.in_transaction


def file_rows(path: str, sql: str = "SELECT * FROM t ORDER BY 1") -> list:
    """file_rows reads a node's file on a plain apsw connection: what is committed there, nothing else."""
    import apsw
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


class HeldAppend:
    """HeldAppend holds the next acknowledged entry of a leader before it is applied (failpoint replicate.acked).

    While held, that leader's record is in the log and its trial is kept in the apply
    connection's open transaction. `release()` lets it go on; leaving the context releases too.
    """

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.reached = threading.Event()
        self.released = threading.Event()

    def _action(self) -> None:
        if self.armed.is_set():
            self.armed.clear()
            self.reached.set()
            self.released.wait(60)

    def release(self) -> None:
        self.released.set()

    def __enter__(self) -> "HeldAppend":
        faults.enable("replicate.acked", self._action)
        self.armed.set()
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        faults.disable("replicate.acked")
        return False


def commit_in_thread(conn, sql: str, parameters=()) -> tuple[threading.Thread, dict]:
    """commit_in_thread runs `sql` and COMMIT on `conn` in a thread; the outcome lands in the returned dict."""
    outcome: dict = {}

    def run() -> None:
        try:
            conn.execute(sql, parameters)
            conn.commit()
            outcome["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


class NodeProcess:
    """NodeProcess is one node process of this module and its command pipe."""

    def __init__(self, metadata: str, name: str, node_id: str, path: str) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, metadata, name, node_id, path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line, f"node {node_id} did not start ({self.process.wait(30)})"

    def ask(self, command: str) -> dict:
        """ask sends a command and returns its answer."""
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the node exited ({self.process.poll()})"
        return json.loads(line)

    def ask_then_die(self, command: str) -> dict | None:
        """ask_then_die sends a command and returns its answer, or None once the process died of SIGKILL on it."""
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if line:
            return json.loads(line)
        assert self.process.wait(30) == -signal.SIGKILL
        return None

    def stop(self) -> None:
        """stop kills the process if it runs, reaps it and closes its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        self.process.stdin.close()
        self.process.stdout.close()


def main() -> None:
    import walkit.adapters.sqlite as sq
    from walkit.replication.node import ReplicatedNode
    metadata, name, node_id, path = sys.argv[1:5]
    conn = sq.connect(path, name=name, metadata=metadata, node_id=node_id, check_same_thread=False)
    database = conn._database
    answer = lambda value: print(json.dumps(value), flush=True)    # noqa: E731
    answer({"started": True})
    for line in sys.stdin:
        command, *args = line.split()
        if command == "state":
            machine = database.machine
            answer({"is_leader": conn.is_leader, "position": list(machine.position[:2]) if machine.position else None,
                    "failed": str(machine.failed) if machine.failed else None})
        elif command == "create":
            conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
            answer({"ok": True})
        elif command == "write":
            ident, size = int(args[0]), int(args[1])
            with conn:
                conn.execute("INSERT INTO t VALUES (?, randomblob(?))", (ident, size))
            answer({"ok": True})
        elif command == "kill-before-append":
            original = ReplicatedNode.submit_async

            def submit_async(self, record, *rest, **options):
                if bytes(record) in database.machine.kept:
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(self, record, *rest, **options)
            ReplicatedNode.submit_async = submit_async
            answer({"ok": True})
        elif command == "kill-at-acked":
            faults.enable("replicate.acked", "kill")
            answer({"ok": True})
        elif command == "quit":
            break
    conn.close()


if __name__ == "__main__":
    main()
