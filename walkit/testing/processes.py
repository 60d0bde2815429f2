"""Waiting for conditions and for processes, for tests that run walkit's servers as real processes.

One copy of each: the conformance suites in walkit.testing, the simulator's tools and walkit's own
tests all wait with `wait_until` and look at processes with `pid_alive`, `pid_state` and
`child_pids`. Stopping a process (SIGTERM, then SIGKILL) is `walkit.local.stop_process`, because
the local cluster needs it outside tests too.
"""

from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, message: str | Callable[[], str] = "",
               *, interval: float = 0.02) -> T:
    """wait_until polls `predicate` until it returns something truthy, and returns that.

    It raises AssertionError, naming `message` (a string, or a callable asked only on failure, so
    it can show a log tail) and the last exception the predicate raised, when `timeout` seconds
    pass first. An exception from the predicate counts as "not yet": a server that does not answer
    yet raises, and the wait goes on. The pause between polls only paces the loop; the condition
    is what the caller waits for.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
            last_error = None
        except Exception as exc:  # noqa: BLE001 - keep polling; report it if time runs out
            last_error = exc
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise AssertionError(f"not within {timeout:g} s: {text or predicate}{detail}")
        time.sleep(interval)


def pid_state(pid: int) -> str | None:
    """pid_state is a process's state letter from /proc (R, S, T for stopped, Z, ...); None without it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """pid_alive tells whether a process with this id exists (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid_state(pid) != "Z"      # None (no /proc): os.kill said it exists


def child_pids(pid: int) -> list[int]:
    """child_pids lists the live direct children of a process (Linux /proc)."""
    children = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(name))
    return children
