"""WriterDriver: each append's future ends once, with its own outcome (issue 12)."""

from __future__ import annotations

from concurrent.futures import Future

from walkit.client.drivers import WriterDriver
from walkit.core import events as ev
from walkit.core.writer import LedgerWriter
from walkit.errors import LedgerClosed

from .helpers import DIGEST, LEDGER_ID, MASTER_KEY, make_metadata


def drive(driver: WriterDriver, event) -> None:
    for command in driver.machine.step(event):
        if type(command) in (ev.CompleteAdds, ev.FailAdds, ev.CompleteClose, ev.FailClose):
            driver.handle(command)


def append(driver: WriterDriver, count: int) -> list[Future]:
    futures = [Future() for _ in range(count)]
    driver.futures.extend(futures)
    drive(driver, ev.AppendRequested(payloads=[b"x"] * count))
    return futures


def test_an_append_refused_after_close_fails_alone_and_pending_ones_complete():
    writer = LedgerWriter(make_metadata(3, 3, 2), 1, master_key=MASTER_KEY, digest=DIGEST)
    driver = WriterDriver(writer)
    pending = append(driver, 5)
    drive(driver, ev.CloseRequested())
    late = append(driver, 2)                             # refused: the close was requested
    assert all(isinstance(f.exception(0), LedgerClosed) for f in late)
    assert not any(f.done() for f in pending)            # still pending: they may yet be acknowledged
    for bookie in ("B1", "B2"):
        drive(driver, ev.AddsAcked(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=list(range(5))))
    assert [f.result(0) for f in pending] == [0, 1, 2, 3, 4]
    again = append(driver, 1)
    assert isinstance(again[0].exception(0), LedgerClosed)
    assert not driver.futures
