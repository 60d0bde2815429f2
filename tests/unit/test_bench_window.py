"""The benchmark harness's Window keeps at most `size` operations in flight and loses no wake-up."""

import threading

import pytest

from walkit.bench import Window, pipelined
from walkit.futures import LightFuture


def test_window_never_exceeds_its_size_and_drains():
    window = Window(8)
    in_flight, most = [0], [0]
    lock = threading.Lock()
    pending: list[LightFuture] = []
    ready = threading.Condition()
    stop = [False]

    def completer():                                   # completes operations from another thread
        while True:
            with ready:
                while not pending and not stop[0]:
                    ready.wait()
                if not pending and stop[0]:
                    return
                pending.pop(0)
            with lock:
                in_flight[0] -= 1
            window.leave()
    threads = [threading.Thread(target=completer) for _ in range(3)]
    for thread in threads:
        thread.start()
    for _ in range(5000):
        window.enter()
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        with ready:
            pending.append(LightFuture())
            ready.notify()
    window.wait_below(1)                               # returns only once every operation left
    assert in_flight[0] == 0 and window.entered == 5000
    assert 1 <= most[0] <= 8
    with ready:
        stop[0] = True
        ready.notify_all()
    for thread in threads:
        thread.join(10)


def test_pipelined_counts_every_completion_and_raises_a_failure():
    futures = []

    def submit(i):
        future = LightFuture()
        futures.append(future)
        threading.Timer(0.001, future.set_result, (i,)).start()
        return future
    result = pipelined(submit, 200, 16)
    assert result["entries"] == 200 and all(f.done() for f in futures)
    assert len(result["latencies"]) == 200 and min(result["latencies"]) > 0

    def failing(i):
        future = LightFuture()
        threading.Timer(0.001, future.set_exception, (RuntimeError(f"op {i}"),)).start()
        return future
    with pytest.raises(RuntimeError, match="^op "):
        pipelined(failing, 10, 4)
