"""LightFuture behaves as concurrent.futures.Future does, waiting threads included."""

import asyncio
import concurrent.futures
import gc
import threading

import pytest

from walkit.futures import LightFuture
from walkit.testing.processes import wait_until


def test_is_a_concurrent_future_and_resolves_without_a_condition():
    future = LightFuture()
    seen = []
    future.add_done_callback(lambda f: seen.append(f.result()))
    assert isinstance(future, concurrent.futures.Future)
    assert not future.done() and not future.running() and not future.cancelled()
    future.set_result(7)
    assert seen == [7]
    assert future.done() and future.result() == 7 and future.exception() is None
    assert "_condition" not in vars(future)          # nobody waited: none was made


def test_a_future_nobody_waits_on_makes_no_condition_waiters_or_dict_for_the_collector():
    """No Condition, no waiters list and no materialised instance dict: the collector's work per append."""
    callbacks, futures = [], [LightFuture() for _ in range(1000)]
    gc.disable()
    try:
        before = gc.get_count()[0]
        made = [LightFuture() for _ in range(1000)]
        for future in made:
            future.add_done_callback(callbacks.append)
        for i, future in enumerate(made):
            future.set_result(i)
        tracked = (gc.get_count()[0] - before) / len(made)
    finally:
        gc.enable()
    assert tracked < 4.1, tracked                    # the future, its lock, its callbacks list, the bound append
    assert len(callbacks) == 1000 and all(f.done() for f in made)
    assert not any("_waiters" in vars(f) or "_condition" in vars(f) for f in made)
    futures[0].set_result(1)                         # a waiting method makes both, together
    assert concurrent.futures.wait([futures[0]], timeout=0).done == {futures[0]}
    assert "_waiters" in vars(futures[0]) and "_condition" in vars(futures[0])


def test_exception_is_raised_by_result_and_returned_by_exception():
    future = LightFuture()
    error = ValueError("no")
    future.set_exception(error)
    assert future.exception() is error
    with pytest.raises(ValueError, match="no"):
        future.result()


def test_callback_added_after_completion_runs_at_once_in_order():
    future = LightFuture()
    order = []
    future.add_done_callback(lambda f: order.append(1))
    future.add_done_callback(lambda f: order.append(2))
    future.set_result(None)
    future.add_done_callback(lambda f: order.append(3))
    assert order == [1, 2, 3]


def test_a_failing_callback_is_logged_and_the_others_still_run(caplog):
    future = LightFuture()
    ran = []
    future.add_done_callback(lambda f: 1 / 0)
    future.add_done_callback(lambda f: ran.append(True))
    future.set_result(1)
    assert ran == [True]
    assert "exception calling callback" in caplog.text


def test_completing_twice_raises_invalid_state():
    future = LightFuture()
    future.set_result(1)
    with pytest.raises(concurrent.futures.InvalidStateError):
        future.set_result(2)
    with pytest.raises(concurrent.futures.InvalidStateError):
        future.set_exception(ValueError())
    assert future.result() == 1


def test_result_times_out_while_pending():
    future = LightFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.01)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.exception(timeout=0.01)


def test_cancel_before_completion():
    future = LightFuture()
    seen = []
    future.add_done_callback(lambda f: seen.append(f.cancelled()))
    assert future.cancel()
    assert future.cancelled() and future.done() and seen == [True]
    with pytest.raises(concurrent.futures.CancelledError):
        future.result()
    assert "cancelled" in repr(future)


def test_a_waiting_thread_is_woken_by_set_result():
    for _ in range(200):                             # the race between waiting and completing, many times
        future = LightFuture()
        got = []
        waiter = threading.Thread(target=lambda: got.append(future.result(timeout=10)))
        waiter.start()
        future.set_result("done")
        waiter.join(10)
        assert got == ["done"]


def _blocked_in_result(future, count: int) -> tuple[list, list[threading.Thread]]:
    """_blocked_in_result starts `count` threads that call future.result() and waits until each is blocked."""
    got: list = []

    def wait() -> None:
        try:
            got.append(future.result(timeout=10))
        except BaseException as exc:  # noqa: BLE001 - what the waiter saw is the test's to check
            got.append(type(exc))
    threads = [threading.Thread(target=wait) for _ in range(count)]
    for thread in threads:
        thread.start()
    wait_until(lambda: future._gate is not None and (count == 1 or future._waited), 10)
    return got, threads


@pytest.mark.parametrize("waiters", [1, 3])
def test_threads_blocked_in_result_are_woken_by_set_result(waiters):
    future = LightFuture()
    got, threads = _blocked_in_result(future, waiters)
    future.set_result("done")
    for thread in threads:
        thread.join(10)
    assert got == ["done"] * waiters


@pytest.mark.parametrize("waiters", [1, 3])
def test_threads_blocked_in_result_are_woken_by_cancel(waiters):
    future = LightFuture()
    got, threads = _blocked_in_result(future, waiters)
    assert future.cancel()
    for thread in threads:
        thread.join(10)
    assert got == [concurrent.futures.CancelledError] * waiters


def test_a_result_that_timed_out_can_wait_again_and_gets_the_value():
    future = LightFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.01)                  # the first waiter's gate stays behind
    got, threads = _blocked_in_result(future, 1)
    future.set_result(5)
    threads[0].join(10)
    assert got == [5] and future.result(timeout=0) == 5


def test_a_waiting_thread_is_woken_by_set_exception():
    future = LightFuture()
    got = []
    started = threading.Event()

    def wait():
        started.set()
        got.append(future.exception(timeout=10))
    waiter = threading.Thread(target=wait)
    waiter.start()
    started.wait(10)
    error = KeyError("k")
    future.set_exception(error)
    waiter.join(10)
    assert got == [error]


def test_wait_and_as_completed_see_light_futures_complete():
    futures = [LightFuture() for _ in range(20)]
    completer = threading.Thread(target=lambda: [f.set_result(i) for i, f in enumerate(futures)])
    completer.start()
    done, pending = concurrent.futures.wait(futures, timeout=10)
    assert not pending and {f.result() for f in done} == set(range(20))
    completer.join(10)
    more = [LightFuture() for _ in range(5)]
    failing = threading.Thread(target=lambda: [f.set_exception(ValueError(i)) for i, f in enumerate(more)])
    failing.start()
    finished = list(concurrent.futures.as_completed(more, timeout=10))
    failing.join(10)
    assert sorted(f.exception().args[0] for f in finished) == list(range(5))
    first = [LightFuture(), LightFuture()]
    first[1].set_exception(RuntimeError())
    done, pending = concurrent.futures.wait(first, timeout=10, return_when=concurrent.futures.FIRST_EXCEPTION)
    assert done == {first[1]} and pending == {first[0]}


def test_callbacks_race_completion_without_losing_any():
    for _ in range(200):
        future = LightFuture()
        calls = []
        adder = threading.Thread(target=lambda: [future.add_done_callback(lambda f: calls.append(1))
                                                 for _ in range(50)])
        adder.start()
        future.set_result(None)
        adder.join(10)
        assert len(calls) == 50                      # each ran once: at completion or when added after it


def test_asyncio_awaits_a_light_future_completed_from_another_thread():
    async def main():
        future = LightFuture()
        threading.Timer(0.01, future.set_result, ("from a thread",)).start()
        return await asyncio.wait_for(asyncio.wrap_future(future), 10)
    assert asyncio.run(main()) == "from a thread"
