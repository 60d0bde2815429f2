"""Helpers shared by the integration tests: condition waits and a raw ZeroMQ bookie client."""

from __future__ import annotations

import itertools
import os
import time
from typing import Callable, TypeVar

import zmq

from walkit.core.messages import AddRequest, Entry, ReadLacRequest, ReadRequest
from walkit.wire.codec import decode_responses, encode_requests
from tests.support.pause import pid_state

T = TypeVar("T")

#: A 32-byte master key for raw requests (bookies only compare keys, they never derive them).
MASTER_KEY = b"k" * 32


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
               message: str | Callable[[], str] = "") -> T:
    """wait_until polls `predicate` until it returns something truthy, and returns that.

    It raises AssertionError (with `message`, and the last exception the predicate raised, if
    any) when `timeout` seconds pass first. The pause between polls only paces the loop; the
    condition itself is what the caller waits for.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
            last_error = None
        except Exception as exc:  # noqa: BLE001 - keep polling; report it if time runs out
            last_error = exc
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise AssertionError(f"condition not met within {timeout:g} s: {text or predicate}{detail}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """pid_alive tells whether a process with this id exists (zombies count as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid_state(pid) != "Z"      # None (no /proc): os.kill said it exists


class RawBookie:
    """RawBookie is a bare ZeroMQ DEALER connected to one bookie, for hand-made frames.

    Use as a context manager. `send(*parts)` sends one (multi-part) message as is;
    `recv_responses()` waits for one reply frame and decodes it with the real codec.
    With `curve=(public, secret, server public)` (z85 bytes) it is a CurveZMQ client.
    """

    _txns = itertools.count(1000)

    def __init__(self, address: str, context: zmq.Context | None = None, *,
                 curve: tuple[bytes, bytes, bytes] | None = None) -> None:
        self.address = address
        self.context = context or zmq.Context.instance()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            self.socket.curve_publickey, self.socket.curve_secretkey, self.socket.curve_serverkey = curve
        self.socket.connect(f"tcp://{address}")

    def __enter__(self) -> "RawBookie":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.socket.close(linger=0)

    @classmethod
    def next_txn(cls) -> int:
        return next(cls._txns)

    def send(self, *parts: bytes) -> None:
        if len(parts) == 1:
            self.socket.send(parts[0])
        else:
            self.socket.send_multipart(list(parts))

    def send_requests(self, requests: list) -> None:
        self.send(encode_requests(requests))

    def recv_frame(self, timeout: float = 5.0) -> bytes:
        """recv_frame returns the next reply frame; AssertionError if none comes in time."""
        if not self.socket.poll(int(timeout * 1000), zmq.POLLIN):
            raise AssertionError(f"bookie {self.address} did not answer within {timeout:g} s")
        parts = self.socket.recv_multipart()
        assert len(parts) == 1, f"a reply is one frame, got {len(parts)}"
        return parts[0]

    def recv_responses(self, timeout: float = 5.0) -> list:
        return decode_responses(self.recv_frame(timeout))

    def no_reply_within(self, timeout: float) -> bool:
        """no_reply_within tells whether nothing arrived for `timeout` seconds."""
        return not self.socket.poll(int(timeout * 1000), zmq.POLLIN)

    def request(self, request, timeout: float = 5.0):
        """request sends one request and returns the response carrying its txn."""
        self.send_requests([request])
        deadline = time.monotonic() + timeout
        while True:
            for response in self.recv_responses(max(0.01, deadline - time.monotonic())):
                if response.txn == request.txn:
                    return response

    # -- ready-made requests ------------------------------------------------------------------
    def add(self, ledger_id: int, entry_id: int, payload: bytes = b"payload", *,
            master_key: bytes = MASTER_KEY, timeout: float = 5.0):
        """add stores one entry (digest not checked by bookies) and returns the AddResponse."""
        entry = Entry(ledger_id, entry_id, -1, b"", payload)
        return self.request(AddRequest(txn=self.next_txn(), ledger_id=ledger_id, master_key=master_key,
                                       entries=[entry]), timeout)

    def read(self, ledger_id: int, entry_ids: list[int], timeout: float = 5.0):
        return self.request(ReadRequest(txn=self.next_txn(), ledger_id=ledger_id, entry_ids=entry_ids), timeout)

    def read_lac(self, ledger_id: int, timeout: float = 5.0):
        return self.request(ReadLacRequest(txn=self.next_txn(), ledger_id=ledger_id), timeout)


def child_pids(pid: int) -> list[int]:
    """child_pids lists the live direct children of a process (Linux /proc)."""
    children = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(name))
    return children
