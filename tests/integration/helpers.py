"""Helpers shared by the integration tests: condition waits and a raw ZeroMQ bookie client."""

from __future__ import annotations

import itertools
import os
import time
from typing import Callable, TypeVar

import zmq

from walkit.core.messages import AddRequest, Entry, ReadLacRequest, ReadRequest
from walkit.wire.codec import decode_responses, encode_requests
from walkit.testing.processes import child_pids, pid_alive, pid_state, wait_until  # noqa: F401 - re-exported

T = TypeVar("T")

#: A 32-byte master key for raw requests (bookies only compare keys, they never derive them).
MASTER_KEY = b"k" * 32


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



def read_within(client, ledger_id: int, seconds: float = 10.0) -> list[bytes] | None:
    """read_within reads ledger `ledger_id` through `client` until it succeeds, for up to `seconds`; None if it
    was refused all along (bookies may take a moment to see a change of owner, so a refusal counts only at the
    end)."""
    try:
        return wait_until(lambda: [bytes(e.payload) for e in client.open_ledger(ledger_id).read()],
                          timeout=seconds, interval=0.25)
    except AssertionError:
        return None
