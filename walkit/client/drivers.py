"""walkit.client.drivers connects each core machine's completion commands to user-facing objects.

A driver lives on the client's I/O thread. It turns CompleteAdds into resolved futures,
DeliverEntries into batches on a queue a reading thread consumes, and so on.
"""

from __future__ import annotations

import queue
from collections import deque
from concurrent.futures import Future

from walkit.client.loop import Driver
from walkit.core import events as ev


class WriterDriver(Driver):
    """WriterDriver owns the futures of a ledger writer's adds, in entry order."""

    def __init__(self, machine) -> None:
        self.machine = machine
        self.futures: deque[Future] = deque()
        self.first_entry = machine.last_add_pushed + 1     # entry id of futures[0]
        self.close_futures: list[Future] = []

    def handle(self, command) -> None:
        kind = type(command)
        futures = self.futures
        if kind is ev.CompleteAdds:
            entry_id = self.first_entry
            while entry_id <= command.last_entry_id and futures:
                futures.popleft().set_result(entry_id)
                entry_id += 1
            self.first_entry = entry_id
        elif kind is ev.FailAdds:
            # Only entries from first_entry_id fail: adds still pending before them complete later.
            keep = max(0, command.first_entry_id - self.first_entry)
            failed = [futures.pop() for _ in range(len(futures) - keep)]
            for future in reversed(failed):
                future.set_exception(command.error)
            if not futures:
                self.first_entry = self.machine.last_add_pushed + 1
        elif kind is ev.CompleteClose:
            for future in self.close_futures:
                future.set_result(command.metadata)
            self.close_futures.clear()
            self.finished = True
        elif kind is ev.FailClose:
            for future in self.close_futures:
                future.set_exception(command.error)
            self.close_futures.clear()
        else:
            raise TypeError(f"writer cannot handle {command!r}")
        if self.machine.error is not None and not self.close_futures and not futures:
            self.finished = True

    def fail(self, error: Exception) -> None:
        while self.futures:
            self.futures.popleft().set_exception(error)
        for future in self.close_futures:
            future.set_exception(error)
        self.close_futures.clear()
        self.finished = True


class ReaderDriver(Driver):
    """ReaderDriver hands a range reader's entries to a consuming thread through a queue.

    Items on `queue` are lists of entries, then None at the end, or an exception.
    """

    def __init__(self, machine) -> None:
        self.machine = machine
        self.queue: queue.Queue = queue.Queue()

    def handle(self, command) -> None:
        kind = type(command)
        if kind is ev.DeliverEntries:
            self.queue.put(command.entries)
        elif kind is ev.CompleteRead:
            self.queue.put(None)
            self.finished = True
        elif kind is ev.FailRead:
            self.queue.put(command.error)
            self.finished = True
        else:
            raise TypeError(f"reader cannot handle {command!r}")

    def fail(self, error: Exception) -> None:
        self.queue.put(error)
        self.finished = True


class OutcomeDriver(Driver):
    """OutcomeDriver resolves one future from a machine's single final command.

    It serves recovery (CompleteRecovery / FailRecovery: (metadata, version), or the
    CompleteRecovery itself with `whole`) and LAC reads (CompleteRead / FailRead: the LAC, or the
    CompleteRead itself with `whole`).
    """

    def __init__(self, machine, future: Future, whole: bool = False) -> None:
        self.machine = machine
        self.future = future
        self.whole = whole

    def handle(self, command) -> None:
        kind = type(command)
        if kind is ev.CompleteRecovery:
            self.future.set_result(command if self.whole else (command.metadata, command.version))
        elif kind is ev.CompleteRead:
            self.future.set_result(command if self.whole else command.lac)
        elif kind in (ev.FailRecovery, ev.FailRead):
            self.future.set_exception(command.error)
        else:
            raise TypeError(f"cannot handle {command!r}")
        self.finished = True

    def fail(self, error: Exception) -> None:
        if not self.future.done():
            self.future.set_exception(error)
        self.finished = True
