"""One harness for the tests that run walkit's servers as real processes: `walkit kv serve` and
`walkit topics serve`, each on its own port, with an embedded cluster (`data_dir`) or against a
metadata store (`metadata`).

ServerProcess holds what both need: start (again after a kill), the log, kill and stop, and the
embedded bookies (children of the server) that must be gone before the next start reuses their
ports. KVProcess and TopicsProcess add how each is asked whether it is ready, and the client each
speaks. The helpers around them (redis_cli, kcat, api_versions) run the real clients.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

import pytest
import redis
from kafka import TopicPartition as KafkaTopicPartition
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from walkit.local import free_port, stop_process
from walkit.testing.processes import child_pids, pid_alive, wait_until


class ServerProcess:
    """ServerProcess is one `walkit <command>` server process; `start()` can be called again after a kill."""

    #: The walkit arguments before --port, e.g. ("kv", "serve"); set by each subclass.
    command: tuple[str, ...] = ()
    #: The log file's prefix, e.g. "kv" for kv-<port>.log.
    kind = "server"

    def __init__(self, workdir, *, port: int | None = None, data_dir=None, metadata: str | None = None,
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.workdir = str(workdir)
        self.env = env                          # added to this process's environment
        self.port = port or free_port()
        self._moves = 0 if port is None else None   # its port was picked here: it may move before it first serves
        self.data_dir = str(data_dir) if data_dir else None
        self.metadata = metadata
        self.args = args
        self.process: subprocess.Popen | None = None
        self.log_path = os.path.join(self.workdir, f"{self.kind}-{self.port}.log")
        self.bookies: set[int] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metadata_url(self) -> str:
        """metadata_url is the cluster's metadata URI (the embedded one's, without --metadata)."""
        return self.metadata or f"sqlite://{os.path.abspath(os.path.join(self.data_dir, 'metadata.db'))}"

    def start(self):
        """start launches the server without waiting for it (see the subclass's wait)."""
        command = [sys.executable, "-m", "walkit", *self.command, "--port", str(self.port), *self.args]
        command += ["--metadata", self.metadata] if self.metadata else ["--data-dir", self.data_dir]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.workdir,
                                            env={**os.environ, **self.env} if self.env else None)
        return self

    def log_tail(self, lines: int = 40) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def wait(self, check: Callable[[], object], timeout: float, what: str, interval: float = 0.02):
        """wait polls `check` until it returns something truthy (returned); it fails at once, with
        the log, if the server exits, and after `timeout` with the log. Once it returns, the
        server's embedded bookies are known, so stop can wait for them."""
        def alive_and_checked():
            if self.process.poll() is not None and self._port_taken():
                self.port = free_port()             # another process took the free port first: another one
                self.log_path = os.path.join(self.workdir, f"{self.kind}-{self.port}.log")
                self.start()
                return None
            assert self.process.poll() is None, f"the server exited:\n{self.log_tail()}"
            return check()
        result = wait_until(alive_and_checked, timeout, lambda: f"{self.address} {what}:\n{self.log_tail()}",
                            interval=interval)
        self._moves = None                          # it served on this port: a restart needs the same one
        if self.metadata is None:
            self.bookies |= set(child_pids(self.process.pid))
        return result

    def _port_taken(self) -> bool:
        """_port_taken tells whether the server exited, before it ever served, because its port, one picked free
        here, was bound by another process meanwhile (tests run in parallel): then it may move, a few times."""
        if self._moves is None or self._moves >= 3 or "address already in use" not in self.log_tail(5):
            return False
        self._moves += 1
        return True

    def kill(self, with_bookies: bool = False) -> None:
        """kill sends SIGKILL to the server (and, with_bookies, to its bookie processes at the same
        moment; otherwise they exit after it)."""
        running = self.process is not None and self.process.poll() is None
        victims = ([self.process.pid] if running else []) + (sorted(self.bookies) if with_bookies else [])
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if running:
            self.process.wait()

    def stop(self) -> None:
        """stop ends the server (SIGTERM, then SIGKILL) and waits until its bookies are gone too."""
        stop_process(self.process, 30)
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


# -- the KV server -----------------------------------------------------------------------------

def require_redis_cli() -> None:
    """require_redis_cli fails the test (never skips it) when redis-cli is not installed."""
    if shutil.which("redis-cli") is None:
        pytest.fail("redis-cli is not installed; run scripts/test.sh, which installs redis-tools", pytrace=False)


def redis_cli(port: int, *args: str) -> str:
    """redis_cli runs one redis-cli command and returns what it printed, stripped."""
    require_redis_cli()
    done = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class KVProcess(ServerProcess):
    """KVProcess is one `walkit kv serve` process."""

    command = ("kv", "serve")
    kind = "kv"

    def redis(self, **options) -> redis.Redis:
        options.setdefault("socket_timeout", 30)
        return redis.Redis(host="127.0.0.1", port=self.port, **options)

    def role(self) -> list:
        """role is the server's ROLE reply (raises while it does not answer)."""
        return self.redis(socket_timeout=5).execute_command("ROLE")

    def wait_role(self, role: bytes, timeout: float = 60.0) -> list:
        """wait_role waits until ROLE answers `role` (b"master", or b"slave" connected to a master)."""
        def check():
            reply = self.role()
            return reply if reply[0] == role and (role == b"master" or reply[3] == b"connected") else None
        return self.wait(check, timeout, f"as {role!r}")


# -- the topics broker -------------------------------------------------------------------------

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


def read_to_end(consumer, timeout: float = 30.0) -> list:
    """read_to_end returns the records a subscribed kafka-python KafkaConsumer reads until its position is
    at the end offset that every partition of its topics had when it was called.

    Every record stored by then is read (what a consumer_timeout_ms idle stop gave, without waiting out
    the idle time); records stored later may be missed. It fails after `timeout` seconds short of the end.
    """
    deadline = time.monotonic() + timeout
    topics = sorted(consumer.subscription() or ())
    assert topics, "read_to_end needs a consumer subscribed to topics"

    def known() -> dict | None:       # every topic's partitions: an unknown topic would make an empty, met end
        partitions = {topic: consumer.partitions_for_topic(topic) for topic in topics}
        return partitions if all(partitions.values()) else None
    known_partitions = wait_until(known, timeout, f"the partitions of the topics {topics}")
    partitions = [KafkaTopicPartition(topic, p) for topic in topics for p in sorted(known_partitions[topic])]
    ends = consumer.end_offsets(partitions)
    got = []
    while True:
        for batch in consumer.poll(timeout_ms=200).values():
            got.extend(batch)
        assigned = consumer.assignment()
        if all(tp in assigned and consumer.position(tp) >= end for tp, end in ends.items()):
            return got
        assert time.monotonic() < deadline, f"short of the end offsets {ends} after {timeout} s ({len(got)} records)"


class TopicsProcess(ServerProcess):
    """TopicsProcess is one `walkit topics serve` process (logging at -v, for the failure messages)."""

    command = ("-v", "topics", "serve")
    kind = "topics"

    @property
    def bootstrap(self) -> str:
        return self.address

    def wait_ready(self, timeout: float = 60.0) -> "TopicsProcess":
        """wait_ready waits until the broker answers ApiVersions."""
        self.wait(lambda: api_versions(self.port).error_code == 0, timeout, "answering ApiVersions", interval=0.1)
        return self


@contextlib.contextmanager
def topics_brokers(workdir, metadata: str, count: int, args: tuple[str, ...] = ()):
    """topics_brokers starts `count` TopicsProcess brokers of the cluster at `metadata`, yields them
    once all are ready, and stops every one started, also when a start fails."""
    started: list[TopicsProcess] = []
    try:
        for _ in range(count):
            started.append(TopicsProcess(workdir, metadata=metadata, args=args).start())
        for broker in started:
            broker.wait_ready()
        yield started
    finally:
        for broker in started:
            broker.stop()
