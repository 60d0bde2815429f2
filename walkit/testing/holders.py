"""walkit.testing.holders runs a child process that holds a registration or a leadership, for tests.

    with Holder("register", url, "bookies/b1", "value") as holder:   # returns once registered
        ...
        holder.kill()                                                # SIGKILL: no goodbye
    with Holder("lead", url, "auditor", "candidate-1") as holder:    # returns once leading
        holder.info                                                  # the epoch, as text

The child (``python -m walkit.testing.holders``) opens the store named by `url`, registers or
campaigns, prints ``ready <info>`` and holds on until its stdin closes (then it closes the
store and exits) or it is killed. Tests use it to check that what a dead process held expires.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time


class Holder:
    """Holder is a child process holding a registration ("register") or a leadership ("lead")."""

    def __init__(self, action: str, url: str, *args: str, ready_timeout: float = 30.0) -> None:
        if action not in ("register", "lead"):
            raise ValueError(f"unknown holder action {action!r}")
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-m", "walkit.testing.holders", action, url, *args],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        self.info = self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    self.kill()
                    raise AssertionError(f"the holder was not ready within {timeout:g} s:\n{self.stderr()}")
                line = self.process.stdout.readline().decode().strip()
                if line.startswith("ready"):
                    return line[len("ready"):].strip()
                if not line and self.process.poll() is not None:
                    raise AssertionError(f"the holder exited with status {self.process.returncode}:\n{self.stderr()}")

    def stderr(self) -> str:
        """stderr returns what the child wrote to its standard error so far."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def kill(self) -> None:
        """kill ends the child with SIGKILL, so it closes nothing, and waits for it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def close(self, timeout: float = 10.0) -> None:
        """close asks the child to close its store and exit (SIGKILL after `timeout` s)."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        for stream in (self.process.stdin, self.process.stdout, self._stderr):
            stream.close()

    def __enter__(self) -> "Holder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _main(argv: list[str]) -> int:
    from walkit.plugins import open_metadata
    action, url, *args = argv
    store = open_metadata(url)
    if action == "register":
        key, value = args
        store.register(key, value.encode())
        info = key
    else:
        from walkit.election import LeaderElection
        name, candidate = args
        election = LeaderElection(store, name, candidate)
        election.campaign(timeout=60)
        info = str(election.epoch)
    print("ready", info, flush=True)
    sys.stdin.read()                     # hold on until the parent closes our stdin
    store.close()
    return 0


if __name__ == "__main__":
    os.setpgrp()                         # a Ctrl-C meant for the test run is not ours to handle
    sys.exit(_main(sys.argv[1:]))
