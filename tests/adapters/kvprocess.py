"""KVProcess runs `walkit kv serve` as a real process for the slow tests, and redis-cli against it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from walkit.local import free_port

from ..integration.helpers import child_pids, pid_alive, wait_until

import redis  # noqa: E402  (a test dependency: pip install -e '.[test]')


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


class KVProcess:
    """KVProcess is one `walkit kv serve` process; `start()` can be called again after a kill."""

    def __init__(self, workdir, *, port: int | None = None, data_dir=None, metadata: str | None = None,
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.workdir = str(workdir)
        self.env = env                          # added to this process's environment
        self.port = port or free_port()
        self.data_dir = str(data_dir) if data_dir else None
        self.metadata = metadata
        self.args = args
        self.process: subprocess.Popen | None = None
        self.log_path = os.path.join(self.workdir, f"kv-{self.port}.log")
        self.bookies: set[int] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "KVProcess":
        command = [sys.executable, "-m", "walkit", "kv", "serve", "--port", str(self.port), *self.args]
        command += ["--metadata", self.metadata] if self.metadata else ["--data-dir", self.data_dir]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.workdir,
                                            env={**os.environ, **self.env} if self.env else None)
        return self

    def log_tail(self, lines: int = 30) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def redis(self, **options) -> redis.Redis:
        options.setdefault("socket_timeout", 30)
        return redis.Redis(host="127.0.0.1", port=self.port, **options)

    def role(self) -> list:
        """role is the server's ROLE reply (raises while it does not answer)."""
        return self.redis(socket_timeout=5).execute_command("ROLE")

    def wait_role(self, role: bytes, timeout: float = 60.0) -> list:
        """wait_role waits until ROLE answers `role` (b"master" or b"slave")."""
        def check():
            assert self.process.poll() is None, f"the server exited:\n{self.log_tail()}"
            reply = self.role()
            return reply if reply[0] == role and (role == b"master" or reply[3] == b"connected") else None
        reply = wait_until(check, timeout, message=lambda: f"{self.address} as {role!r}:\n{self.log_tail()}")
        if self.metadata is None:
            self.bookies |= set(child_pids(self.process.pid))
        return reply

    def kill(self, with_bookies: bool = False) -> None:
        """kill sends SIGKILL to the server (and, with_bookies, to its bookie processes at the same moment)."""
        victims = [self.process.pid] + (sorted(self.bookies) if with_bookies else [])
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()

    def stop(self) -> None:
        """stop ends the server (SIGTERM, then SIGKILL) and waits until its bookies are gone too."""
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
