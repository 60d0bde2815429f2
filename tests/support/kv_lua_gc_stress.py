"""Runs scripts whose errors are raised inside coroutines while another thread collects garbage.

    python -m tests.support.kv_lua_gc_stress SECONDS

The KV server's Lua bridge once kept Lua objects made during a call from a coroutine in the
error it raised (lupa ties such an object to the coroutine's state, and keeps the last error past
the call); releasing one after Lua had collected the coroutine wrote into freed memory, and the
process died in the collector, within 2-3 seconds of this loop. It exits 0 if it survives.
"""

from __future__ import annotations

import gc
import sys
import threading
import time

from walkit.adapters.kv import commands  # noqa: F401 - registers every command
from walkit.adapters.kv.execute import run
from walkit.adapters.kv.machine import KVMachine
from walkit.adapters.kv.table import Context

SCRIPTS = [
    b"local co = coroutine.create(function() redis.call('nope') end) local ok, e = coroutine.resume(co) return e",
    b"local ok, e = pcall(coroutine.wrap(function() redis.call('nope') end)) return e",
    b"local co = coroutine.wrap(function() redis.log(redis.LOG_WARNING, {1, 2}) end) pcall(co) return 1",
    b"local co = coroutine.create(function() error({err = 'x'}) end) local ok, e = coroutine.resume(co) return e",
    b"local co = coroutine.create(function() return redis.pcall('set', 'k') end) return {coroutine.resume(co)}",
    b"local co = coroutine.wrap(function() redis.error_reply({}) end) pcall(co) return 1",
    b"local co = coroutine.wrap(function() redis.sha1hex({}) end) pcall(co) return 1",
    b"collectgarbage() return 1",
]


def main(seconds: float) -> None:
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            gc.collect()
            stop.wait(0.001)
    collector = threading.Thread(target=collect)
    collector.start()
    ran, deadline = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            machine = KVMachine()
            for index in range(1, 51):
                for body in SCRIPTS:
                    machine.state.applying = index
                    run(Context(machine.state, 1_700_000_000_000, machine, writing=True), [b"EVAL", body, b"0"])
                    ran += 1
    finally:
        stop.set()
        collector.join()
    print(f"ran {ran} scripts and survived")


if __name__ == "__main__":
    main(float(sys.argv[1]))
