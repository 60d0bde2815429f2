"""walkit.core is the BookKeeper protocol as sans-IO state machines (docs/internals/sans-io.md).

It contains no networking, threads, clocks, randomness or file access: machines take events
through `step(event)` and return commands; the shell (walkit.client, walkit.bookie) performs
the I/O. A test fails the build if anything here imports zmq, capnp, socket, threading,
asyncio, time, random or os.
"""
