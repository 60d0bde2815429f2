"""WriterDriver: each append's future ends once, with its own outcome (issue 12)."""

from __future__ import annotations

from concurrent.futures import Future

from walkit.client.drivers import Batch, WriterDriver
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


def batch(driver: WriterDriver, count: int) -> Future:
    """batch appends `count` entries as one append_many Batch and returns its future."""
    future: Future = Future()
    driver.futures.append(Batch(future, count))
    drive(driver, ev.AppendRequested(payloads=[b"b"] * count))
    return future


def acked(driver: WriterDriver, *entry_ids: int) -> None:
    for bookie in ("B1", "B2"):
        drive(driver, ev.AddsAcked(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=list(entry_ids)))


def test_batches_and_single_appends_complete_in_entry_order_with_their_own_ids():
    driver = WriterDriver(LedgerWriter(make_metadata(3, 3, 2), 1, master_key=MASTER_KEY, digest=DIGEST))
    single = append(driver, 1)[0]
    many = batch(driver, 4)
    after = append(driver, 1)[0]
    acked(driver, 0, 1, 2)
    assert single.result(0) == 0 and not many.done()      # entries 1 and 2 of 1..4 are not a whole batch
    acked(driver, 3, 4)
    assert many.result(0) == range(1, 5) and not after.done()
    acked(driver, 5)
    assert after.result(0) == 5 and not driver.futures


def test_a_failure_inside_a_batch_fails_it_whole_and_everything_after_it():
    writer = LedgerWriter(make_metadata(3, 3, 2), 1, master_key=MASTER_KEY, digest=DIGEST)
    driver = WriterDriver(writer)
    first = batch(driver, 3)
    later = append(driver, 2)
    acked(driver, 0)                                        # entry 0 of the batch completes
    driver.handle(ev.FailAdds(ledger_id=LEDGER_ID, first_entry_id=2, error=LedgerClosed("gone")))
    assert isinstance(first.exception(0), LedgerClosed)     # entry 2 failed: the batch fails whole
    assert all(isinstance(f.exception(0), LedgerClosed) for f in later)
    assert len(driver.futures) == 1                         # entry 1 may still complete; it has no future left
    acked(driver, 1)
    assert not driver.futures


def test_an_empty_batch_at_the_line_of_a_failure_takes_no_entries():
    writer = LedgerWriter(make_metadata(3, 3, 2), 1, master_key=MASTER_KEY, digest=DIGEST)
    driver = WriterDriver(writer)
    whole = batch(driver, 2)
    failing = batch(driver, 2)
    driver.handle(ev.FailAdds(ledger_id=LEDGER_ID, first_entry_id=2, error=LedgerClosed("gone")))
    assert isinstance(failing.exception(0), LedgerClosed) and not whole.done()
    acked(driver, 0, 1)
    assert whole.result(0) == range(0, 2) and not driver.futures
