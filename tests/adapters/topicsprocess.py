"""TopicsProcess runs `walkit topics serve` as a real process for the topics tests, and kcat against it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from walkit.local import free_port

from ..integration.helpers import child_pids, pid_alive, wait_until


def kcat(*args: str, input: str | None = None, timeout: float = 60) -> str:
    """kcat runs kcat (Debian package kcat; never skipped) and returns its stdout; it must succeed."""
    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed; run scripts/test.sh, which installs it", pytrace=False)
    done = subprocess.run(["kcat", *args], input=input, capture_output=True, text=True, timeout=timeout,
                          stdin=None if input is not None else subprocess.DEVNULL)
    assert done.returncode == 0, f"kcat {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


def api_versions(port: int, timeout: float = 5.0) -> ApiVersionsResponse:
    """api_versions sends one ApiVersions v0 request over a fresh connection and decodes the answer."""
    request = ApiVersionsRequest(version=0)
    request.with_header(correlation_id=1, client_id="test")
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        size = int.from_bytes(recv_exactly(sock, 4), "big")
        return ApiVersionsResponse.decode(recv_exactly(sock, size), version=0, header=True)


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    """recv_exactly reads `count` bytes (ConnectionError if the peer closes first)."""
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return data


class TopicsProcess:
    """TopicsProcess is one `walkit topics serve` process; `start()` can be called again after a kill."""

    def __init__(self, workdir, *, port: int | None = None, data_dir=None, metadata: str | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.workdir = str(workdir)
        self.port = port or free_port()
        self.data_dir = str(data_dir) if data_dir else None
        self.metadata = metadata
        self.args = args
        self.process: subprocess.Popen | None = None
        self.log_path = os.path.join(self.workdir, f"topics-{self.port}.log")
        self.bookies: set[int] = set()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metadata_url(self) -> str:
        """metadata_url is the cluster's metadata URI (the embedded one's, without --metadata)."""
        return self.metadata or f"sqlite://{os.path.abspath(os.path.join(self.data_dir, 'metadata.db'))}"

    def start(self) -> "TopicsProcess":
        command = [sys.executable, "-m", "walkit", "-v", "topics", "serve", "--port", str(self.port), *self.args]
        command += ["--metadata", self.metadata] if self.metadata else ["--data-dir", self.data_dir]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.workdir)
        return self

    def log_tail(self, lines: int = 40) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def wait_ready(self, timeout: float = 60.0) -> "TopicsProcess":
        """wait_ready waits until the broker answers ApiVersions and leads its group buckets (one broker)."""
        def ready():
            assert self.process.poll() is None, f"the broker exited:\n{self.log_tail()}"
            return api_versions(self.port).error_code == 0
        wait_until(ready, timeout, interval=0.1, message=lambda: f"broker {self.bootstrap}:\n{self.log_tail()}")
        if self.metadata is None:
            self.bookies |= set(child_pids(self.process.pid))
        return self

    def kill(self) -> None:
        """kill sends SIGKILL to the broker (its embedded bookies, if any, exit after it)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """stop ends the broker (SIGTERM, then SIGKILL) and waits until its bookies are gone too."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.wait_bookies_gone()

    def wait_bookies_gone(self, timeout: float = 20.0) -> None:
        """wait_bookies_gone waits until the bookies of earlier runs exited (they follow their parent)."""
        deadline = time.monotonic() + timeout
        for pid in sorted(self.bookies):
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.bookies.clear()
