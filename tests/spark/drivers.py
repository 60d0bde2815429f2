"""Spark drivers run as processes of their own by the tests that SIGKILL them: started, killed at a chosen
moment, and waited for until the JVM and the Python workers they started are gone too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from walkit.testing.processes import child_pids, pid_alive, wait_until

from .conftest import spark_environment

EXITED = object()


def log_excerpt(log_path, tail: int = 3000) -> str:
    """log_excerpt is what a failed driver's log says: its Python tracebacks (a worker's error is what the JVM's
    stack traces, printed after it, are about) and its last `tail` characters."""
    with open(log_path, errors="replace") as f:
        text = f.read()
    tracebacks, lines = [], text.splitlines()
    for at, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            end = next((i for i in range(at + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")),
                       len(lines) - 1)
            tracebacks.append("\n".join(lines[at:end + 1]))
    shown = "\n...\n".join(dict.fromkeys(tracebacks))[-6000:]
    return (f"Python tracebacks:\n{shown}\n\nthe log's end:\n" if shown else "") + text[-tail:]


def start_driver(program: str, args, log_path, cwd) -> subprocess.Popen:
    """start_driver runs `program` (a Python file) with `args` as a Spark driver, its output appended to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, program, *map(str, args)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=spark_environment(), cwd=str(cwd))


def descendants(pid: int) -> set[int]:
    """descendants is every process below `pid` (the driver's JVM, its Python daemon and workers)."""
    found, queue = set(), [pid]
    while queue:
        for child in child_pids(queue.pop()):
            if child not in found:
                found.add(child)
                queue.append(child)
    return found


def kill_when(driver: subprocess.Popen, moment, log_path, timeout: float = 180.0, interval: float = 0.01):
    """kill_when SIGKILLs `driver` as soon as `moment()` returns something truthy, which it returns.

    It fails, with the driver's log, if the driver exits first or the moment does not come within
    `timeout`, and waits until the driver's JVM and Python workers exited (they follow the
    driver: the JVM exits when its parent's pipe closes, its workers with it).
    """
    def log_tail() -> str:
        return log_excerpt(log_path)
    family: set[int] = set()
    try:
        def come():
            if driver.poll() is not None:
                return EXITED
            family.update(descendants(driver.pid))
            return moment()
        seen = wait_until(come, timeout, interval=interval, message=log_tail)
        assert seen is not EXITED, f"the driver exited on its own:\n{log_tail()}"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(30)
        return seen
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(30)
        family |= descendants(driver.pid)
        wait_until(lambda: not any(pid_alive(pid) for pid in family), 60,
                   message="the killed driver's JVM and workers did not exit")


def finish(driver: subprocess.Popen, log_path, timeout: float = 240.0) -> None:
    """finish waits for `driver` to exit 0 (it fails with the driver's log otherwise, killing it if it hangs)."""
    try:
        code = driver.wait(timeout)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait(30)
        code = None
    assert code == 0, f"the driver exited with {code}:\n{log_excerpt(log_path)}"
