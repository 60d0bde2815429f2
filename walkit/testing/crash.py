"""walkit.testing.crash runs storage work in a forked child that stops abruptly, for durability tests.

    reports, how = run_in_child(work, kill_after=20)

The child calls ``work(report)``; `report(n)` sends an integer to the parent (for example "group
n is synced"). The child then ends without any cleanup: ``os._exit(0)`` when `work` returns, or
``SIGKILL`` if `work` sends it to itself. With `kill_after`, the parent SIGKILLs the child as soon
as that many reports arrived, wherever it is (mid-put, mid-write, mid-fsync). The parent gets
every report in order and how the child ended ("exit 0", "killed"). A failure inside the child
is reported as a ChildFailed error carrying the child's traceback.

It forks the test process (POSIX only): the child inherits `work` as is, closures included, so
a backend's storage factory needs no pickling. Open the storage inside `work`, never before.
"""

from __future__ import annotations

import os
import signal
import struct
import traceback
from typing import Callable

_REPORT = struct.Struct("<q")
_FAILED = -(1 << 62)                    # marks the start of a traceback on the pipe


class ChildFailed(AssertionError):
    """ChildFailed is raised in the parent when `work` raised in the child; it carries the traceback."""


def run_in_child(work: Callable[[Callable[[int], None]], None], *, kill_after: int | None = None
                 ) -> tuple[list[int], str]:
    """run_in_child runs `work(report)` in a forked child and returns (reports, how the child ended)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                                 # the child: never returns
        os.close(read_end)
        code = 0
        try:
            work(lambda n: _write_all(write_end, _REPORT.pack(n)))
        except BaseException:                                    # noqa: BLE001 - reported to the parent
            _write_all(write_end, _REPORT.pack(_FAILED) + traceback.format_exc().encode())
            code = 70
        os._exit(code)
    os.close(write_end)
    reports: list[int] = []
    failure = b""
    try:
        with os.fdopen(read_end, "rb") as pipe:
            while True:
                chunk = pipe.read(_REPORT.size)
                if len(chunk) < _REPORT.size:
                    break
                (value,) = _REPORT.unpack(chunk)
                if value == _FAILED:
                    failure = pipe.read()
                    break
                reports.append(value)
                if kill_after is not None and len(reports) == kill_after:
                    os.kill(pid, signal.SIGKILL)
    finally:
        _, status = os.waitpid(pid, 0)
    if failure:
        raise ChildFailed("the child process failed:\n" + failure.decode(errors="replace"))
    if os.WIFSIGNALED(status):
        how = "killed" if os.WTERMSIG(status) == signal.SIGKILL else f"signal {os.WTERMSIG(status)}"
    else:
        how = f"exit {os.WEXITSTATUS(status)}"
    return reports, how


def kill_self() -> None:
    """kill_self ends the calling process at once with SIGKILL (no cleanup, no buffered writes)."""
    os.kill(os.getpid(), signal.SIGKILL)


def _write_all(fd: int, data: bytes) -> None:
    """_write_all writes every byte of `data` to `fd`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
