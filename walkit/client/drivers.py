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


def _future_of(item) -> Future:
    """_future_of is the Future of a queued append: the item itself, or a Batch's."""
    return item.future if type(item) is Batch else item


class Batch:
    """Batch is the one Future of an `append_many`: it resolves to the range of its entry ids.

    It stands for `size` consecutive entries in the writer driver's queue; `acked` of them are
    complete. If the writer fails, it fails as a whole, even when its first entries completed
    (the handle's last_add_confirmed says how far it got).
    """

    __slots__ = ("future", "size", "acked", "first")

    def __init__(self, future: Future, size: int) -> None:
        self.future = future
        self.size = size
        self.acked = 0
        self.first = -1


class WriterDriver(Driver):
    """WriterDriver owns the futures of a ledger writer's adds, in entry order.

    `futures` holds a Future per `append_async` and a Batch per `append_many`.
    """

    def __init__(self, machine) -> None:
        self.machine = machine
        self.futures: deque[Future] = deque()
        self.first_entry = machine.last_add_pushed + 1     # entry id of futures[0]
        self.close_futures: list[Future] = []
        self.force_futures: dict[int, Future] = {}         # force token -> its Future

    def handle(self, command) -> None:
        kind = type(command)
        futures = self.futures
        if kind is ev.CompleteAdds:
            entry_id, last = self.first_entry, command.last_entry_id
            while entry_id <= last and futures:
                head = futures[0]
                if type(head) is Batch:
                    if head.acked == 0:
                        head.first = entry_id
                    take = min(head.size - head.acked, last - entry_id + 1)
                    head.acked += take
                    entry_id += take
                    if head.acked == head.size:
                        futures.popleft()
                        if not head.future.done():
                            head.future.set_result(range(head.first, head.first + head.size))
                else:
                    futures.popleft().set_result(entry_id)
                    entry_id += 1
            self.first_entry = entry_id
        elif kind is ev.FailAdds:
            # Only entries from first_entry_id fail: adds still pending before them complete later.
            self._fail_from(max(0, command.first_entry_id - self.first_entry), command.error)
            if not futures:
                self.first_entry = self.machine.last_add_pushed + 1
        elif kind is ev.CompleteForce:
            for token in command.tokens:
                self.force_futures.pop(token).set_result(command.last_entry_id)
        elif kind is ev.FailForce:
            for token in command.tokens:
                self.force_futures.pop(token).set_exception(command.error)
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
        if self.machine.error is not None and not self.close_futures and not futures and not self.force_futures:
            self.finished = True

    def _fail_from(self, keep: int, error: Exception) -> None:
        """_fail_from fails every entry after the first `keep` pending ones (a Batch across the line fails whole)."""
        futures, kept, count = self.futures, 0, 0
        for item in futures:
            if count >= keep:
                break
            count += item.size - item.acked if type(item) is Batch else 1
            kept += 1
            if count > keep:            # a batch across the line: its first entries may still complete
                item.size -= count - keep
                item.future.set_exception(error)
        while len(futures) > kept:
            future = _future_of(futures[kept])
            del futures[kept]
            if not future.done():
                future.set_exception(error)

    def fail(self, error: Exception) -> None:
        while self.futures:
            future = _future_of(self.futures.popleft())
            if not future.done():
                future.set_exception(error)
        for future in [*self.close_futures, *self.force_futures.values()]:
            future.set_exception(error)
        self.close_futures.clear()
        self.force_futures.clear()
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
