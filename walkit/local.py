"""walkit.local runs a whole walkit cluster on one machine: LocalCluster.

    with walkit.LocalCluster(bookies=3, data_dir="walkit-data") as cluster:
        client = walkit.Client(cluster.metadata_url)

Bookies are real subprocesses (`python -m walkit bookie ...`) on 127.0.0.1, so `kill_bookie`
is a real SIGKILL. Each bookie keeps its port across restarts (ports are remembered in
`<data_dir>/cluster.json`), so a restarted bookie is the same bookie to the ledgers that name
it. Bookies exit on their own if the process that started them dies, so a cluster never leaves
a process behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from walkit.errors import ConfigError, WalkitError

STORAGE_KINDS = ("memory", "files", "sqlite")


_handed_out: dict[int, None] = {}      # ports free_port returned, oldest first (at most _HANDED_OUT_MAX)
_HANDED_OUT_MAX = 4096
_handed_out_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """free_port returns a TCP port nobody listens on right now and that it has not returned lately.

    The port is only free when chosen: its user binds it later. The kernel may hand the same
    ephemeral port to two binds in a row once the first socket is closed, so two services
    chosen one after the other (two bookies of one cluster) could get the same port; this
    process's last few thousand answers are therefore never given again.
    """
    with _handed_out_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _handed_out:
                break
        _handed_out[port] = None
        while len(_handed_out) > _HANDED_OUT_MAX:
            del _handed_out[next(iter(_handed_out))]
        return port


def stop_process(process: subprocess.Popen | None, timeout: float = 15.0) -> None:
    """stop_process ends a child with SIGTERM, sends SIGKILL if it still runs after `timeout`
    seconds, and reaps it. A process that already exited (or None) is left as it is."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    """_port_free tells whether a listening socket could bind host:port now (nobody listens on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)      # as ZeroMQ does: TIME_WAIT is no obstacle
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


@dataclass
class _Bookie:
    port: int
    storage: str
    process: subprocess.Popen | None = None
    log_path: str = ""
    http_port: int = 0
    fresh: bool = False       # its port was chosen here and never served: another may be chosen
    log_start: int = 0        # where this process's lines begin in log_path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class LocalCluster:
    """LocalCluster starts `bookies` bookie processes and a metadata store under `data_dir`.

    `storage` is a storage kind ("files", "sqlite", "memory"; each bookie gets its own folder)
    or a storage URI used as is with ``{i}`` replaced by the bookie index. `metadata` is
    "sqlite" (a file in data_dir) or any metadata URI. `bookie_args` are extra `walkit bookie`
    options for every bookie. As a context manager it stops every process on exit.

    With `security`, bookies run CurveZMQ with key pairs under ``<data_dir>/keys`` and the
    cluster makes one allowed client key, `client_key`: pass it as `walkit.Client(url,
    key=cluster.client_key)`.

    `racks` gives bookie i the rack racks[i] (`walkit bookie --rack`; placement spreads write
    sets over racks). With `http`, every bookie serves /metrics, /health and /ready on a port
    of its own (`http_address(i)`), kept across restarts like its bookie port.

    Ports are chosen free but bound later by the bookie process, so another process on the
    machine can take one in between. A new bookie (one that never served) then gets another
    port, and an HTTP port is chosen again whenever it is taken; a bookie that served keeps its
    port, which ledgers name, and `start` fails with the bookie's error instead.
    """

    def __init__(self, bookies: int = 3, data_dir: str = "walkit-data", storage: str = "files",
                 metadata: str = "sqlite", *, bookie_args: tuple[str, ...] = (), ready_timeout: float = 30.0,
                 security: bool = False, start: bool = True, racks=None, http: bool = False) -> None:
        if bookies < 0:
            raise ConfigError(f"bookies must be >= 0, got {bookies}")
        if storage not in STORAGE_KINDS and "://" not in storage:
            raise ConfigError(f"storage must be one of {', '.join(STORAGE_KINDS)} or a storage URI, got {storage!r}")
        self.data_dir = os.path.abspath(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self.storage = storage
        self.metadata_url = (f"sqlite://{os.path.join(self.data_dir, 'metadata.db')}" if metadata == "sqlite"
                             else metadata)
        if "://" not in self.metadata_url:
            raise ConfigError(f"metadata must be 'sqlite' or a metadata URI, got {metadata!r}")
        self.bookie_args = tuple(bookie_args)
        self.racks = list(racks or [])
        self.http = http
        self.ready_timeout = ready_timeout
        self.security = security
        self.client_key: str | None = None
        if security:
            self._prepare_keys()
        self._bookies: list[_Bookie] = self._load_layout()
        while len(self._bookies) < bookies:
            self._bookies.append(self._new_bookie(len(self._bookies)))
        self._save_layout()
        self._count = bookies
        if start:
            self.start()

    # -- security ---------------------------------------------------------------------------
    @property
    def keys_dir(self) -> str:
        """keys_dir holds the cluster's key pairs when it runs secured."""
        return os.path.join(self.data_dir, "keys")

    def _prepare_keys(self) -> None:
        """_prepare_keys makes the admin client's key pair (once) and puts it on the allow-list."""
        from walkit.plugins import open_metadata
        from walkit.security import allow, new_keys, principal_of
        secret = os.path.join(self.keys_dir, "client.key_secret")
        if not os.path.exists(secret):
            new_keys(self.keys_dir, "client")
        self.client_key = secret
        store = open_metadata(self.metadata_url)
        try:
            allow(store, principal_of(secret), "local cluster client")
        finally:
            store.close()

    def _bookie_key(self, i: int) -> list[str]:
        """_bookie_key is the --curve-key argument of bookie `i` (its key pair is made once)."""
        if not self.security:
            return []
        from walkit.security import new_keys
        secret = os.path.join(self.keys_dir, f"bookie-{i}.key_secret")
        if not os.path.exists(secret):
            new_keys(self.keys_dir, f"bookie-{i}")
        return ["--curve-key", secret]

    # -- layout -----------------------------------------------------------------------------
    def _layout_path(self) -> str:
        return os.path.join(self.data_dir, "cluster.json")

    def _load_layout(self) -> list[_Bookie]:
        try:
            with open(self._layout_path()) as f:
                saved = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {self._layout_path()}: {exc}") from exc
        if saved.get("storage") != self.storage:
            return []                 # a different storage kind: start a fresh layout
        return [_Bookie(port=b["port"], storage=b["storage"], http_port=b.get("http_port", 0)) for b in saved["bookies"]]

    def _save_layout(self) -> None:
        with open(self._layout_path(), "w") as f:
            json.dump({"storage": self.storage,
                       "bookies": [{"port": b.port, "storage": b.storage, "http_port": b.http_port}
                                   for b in self._bookies]}, f, indent=1)

    def _new_bookie(self, index: int) -> _Bookie:
        if "://" in self.storage:
            uri = self.storage.replace("{i}", str(index))
        elif self.storage == "memory":
            uri = "memory://"
        else:
            folder = os.path.join(self.data_dir, f"bookie-{index}")
            uri = f"files://{folder}" if self.storage == "files" else f"sqlite://{folder}/entries.db"
        return _Bookie(port=self._unused_port(), storage=uri, fresh=True)

    def _unused_port(self) -> int:
        """_unused_port is a free port that no bookie of this cluster names (its own or its HTTP port).

        A port remembered in cluster.json from an earlier run is free while that bookie is down,
        and a second bookie given it would pass for the first in the registry.
        """
        taken = {p for b in self._bookies for p in (b.port, b.http_port)}
        while True:
            port = free_port()
            if port not in taken:
                return port

    # -- processes --------------------------------------------------------------------------
    @property
    def addresses(self) -> list[str]:
        """addresses lists every bookie's address (running or not), by index."""
        return [b.address for b in self._bookies[:self._count]]

    @property
    def storages(self) -> list[str]:
        """storages lists every bookie's storage URI, by index."""
        return [b.storage for b in self._bookies[:self._count]]

    def start(self) -> "LocalCluster":
        """start starts every bookie that is not running and waits until all are registered."""
        stopped = [i for i in range(self._count) if not self.is_running(i)]
        self._wait_deregistered(stopped)
        self._wait_ports_free(stopped)
        for i in stopped:
            self._spawn(i)
        self._wait_registered([i for i in range(self._count)])
        return self

    def is_running(self, i: int) -> bool:
        """is_running tells whether bookie `i`'s process is alive."""
        process = self._bookies[i].process
        return process is not None and process.poll() is None

    def _spawn(self, i: int) -> None:
        bookie = self._bookies[i]
        bookie.log_path = os.path.join(self.data_dir, f"bookie-{i}.log")
        try:
            bookie.log_start = os.path.getsize(bookie.log_path)
        except FileNotFoundError:
            bookie.log_start = 0
        command = [sys.executable, "-m", "walkit", "bookie", "--metadata", self.metadata_url,
                   "--storage", bookie.storage, "--port", str(bookie.port), "--exit-with-parent",
                   *self._bookie_key(i), *self._placement_args(i), *self.bookie_args]
        with open(bookie.log_path, "ab") as log:
            bookie.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, cwd=self.data_dir)

    def _placement_args(self, i: int) -> list[str]:
        """_placement_args are bookie `i`'s --rack and --http-port options (its HTTP port is chosen once)."""
        args = []
        if i < len(self.racks) and self.racks[i]:
            args += ["--rack", self.racks[i]]
        if self.http:
            bookie = self._bookies[i]
            if not bookie.http_port:
                bookie.http_port = self._unused_port()
                self._save_layout()
            args += ["--http-port", str(bookie.http_port)]
        return args

    def http_address(self, i: int) -> str | None:
        """http_address is host:port of bookie `i`'s /metrics, /health and /ready (None without `http`)."""
        port = self._bookies[i].http_port
        return f"127.0.0.1:{port}" if self.http and port else None

    def _wait_deregistered(self, indexes: list[int]) -> None:
        """_wait_deregistered waits until bookies that are not running are no longer registered.

        A killed bookie's registration lingers until its lease expires. A new process cannot
        register before that, and a registration seen meanwhile is the dead one's, so
        `_wait_registered` could only trust the registry once it is gone.
        """
        if not indexes:
            return
        from walkit.plugins import open_metadata
        from walkit.registry import BookieRegistry
        deadline = time.monotonic() + self.ready_timeout
        store = open_metadata(self.metadata_url)
        try:
            registry = BookieRegistry(store)
            while True:
                live = registry.live()
                stale = [self._bookies[i].address for i in indexes if self._bookies[i].address in live]
                if not stale:
                    return
                if time.monotonic() > deadline:
                    raise WalkitError(f"the registrations of stopped bookies {', '.join(stale)} did not "
                                      f"expire within {self.ready_timeout:g} s")
                time.sleep(0.05)
        finally:
            store.close()

    def _wait_ports_free(self, indexes: list[int]) -> None:
        """_wait_ports_free waits until no process listens on the ports of bookies about to start.

        A bookie of an earlier run whose parent was killed exits on its own within a moment, but
        it deregisters first and closes its storage and then its socket last: until then a new
        bookie on the same port and folder would fail to start.
        """
        deadline = time.monotonic() + self.ready_timeout
        for i in indexes:
            if self._bookies[i].fresh and not _port_free(self._bookies[i].port):
                self._bookies[i].port = self._unused_port()      # taken since it was chosen, never served: choose again
                self._save_layout()
            while not _port_free(self._bookies[i].port):
                if time.monotonic() > deadline:
                    raise WalkitError(f"port {self._bookies[i].port} of bookie {i} is still in use after "
                                      f"{self.ready_timeout:g} s (another cluster on {self.data_dir}?)")
                time.sleep(0.05)

    def _wait_registered(self, indexes: list[int]) -> None:
        from walkit.plugins import open_metadata
        from walkit.registry import BookieRegistry
        deadline = time.monotonic() + self.ready_timeout
        rebinds = {i: 0 for i in indexes}
        store = open_metadata(self.metadata_url)
        try:
            registry = BookieRegistry(store)
            while True:
                for i in indexes:
                    if not self.is_running(i):
                        if rebinds[i] < 5 and self._choose_taken_ports_again(i):
                            rebinds[i] += 1
                            self._spawn(i)
                            continue
                        raise WalkitError(f"bookie {i} exited during start-up:\n{self.log_tail(i)}")
                live = registry.live()
                for i in indexes:
                    if self._bookies[i].address in live:
                        self._bookies[i].fresh = False     # it serves: ledgers may name its address from now on
                if all(self._bookies[i].address in live for i in indexes):
                    return
                if time.monotonic() > deadline:
                    missing = [self._bookies[i].address for i in indexes if self._bookies[i].address not in live]
                    raise WalkitError(f"bookies {', '.join(missing)} did not register within "
                                      f"{self.ready_timeout:g} s")
                time.sleep(0.05)
        except BaseException:
            for i in indexes:
                if self.is_running(i):
                    self._bookies[i].fresh = False      # it may register, and serve, after this gives up
            raise
        finally:
            store.close()

    def _choose_taken_ports_again(self, i: int) -> bool:
        """_choose_taken_ports_again gives bookie `i` new ports if it exited because another process took one.

        Ports are chosen free (`free_port`) but bound later by the bookie process, so anything
        else on the machine can take one in between. The HTTP port can always be chosen again;
        the bookie port only while it was never served, since it is the bookie's identity in
        ledger metadata afterwards. Returns whether a port was chosen again.
        """
        bookie = self._bookies[i]
        try:
            with open(bookie.log_path, "rb") as f:
                f.seek(bookie.log_start)
                log = f.read().decode(errors="replace")
        except OSError:
            return False
        chosen = False
        if self.http and re.search(r"cannot serve metrics on \S+: Address already in use", log):
            bookie.http_port = self._unused_port()
            chosen = True
        if bookie.fresh and re.search(r"cannot listen on \S+: Address already in use", log):
            bookie.port = self._unused_port()
            chosen = True
        if chosen:
            self._save_layout()
        return chosen

    def log_tail(self, i: int, lines: int = 20) -> str:
        """log_tail returns the end of bookie `i`'s log file."""
        try:
            with open(self._bookies[i].log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill_bookie(self, i: int) -> None:
        """kill_bookie sends SIGKILL to bookie `i` and waits for it to die."""
        process = self._bookies[i].process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def stop_bookie(self, i: int, timeout: float = 10.0) -> None:
        """stop_bookie stops bookie `i` cleanly (SIGTERM: it deregisters at once)."""
        stop_process(self._bookies[i].process, timeout)

    def start_bookie(self, i: int) -> None:
        """start_bookie (re)starts bookie `i` on its port and data, and waits until it registered."""
        if not self.is_running(i):
            self._wait_deregistered([i])
            self._wait_ports_free([i])
            self._spawn(i)
        self._wait_registered([i])

    def add_bookie(self, rack: str | None = None) -> int:
        """add_bookie starts one more bookie (on `rack`, if given) and returns its index."""
        if rack is not None:
            self.racks += [""] * (self._count + 1 - len(self.racks))
            self.racks[self._count] = rack
        if self._count == len(self._bookies):
            self._bookies.append(self._new_bookie(self._count))
            self._save_layout()
        self._count += 1
        self.start_bookie(self._count - 1)
        return self._count - 1

    def pid(self, i: int) -> int | None:
        """pid returns the process id of bookie `i` (None if never started)."""
        process = self._bookies[i].process
        return None if process is None else process.pid

    def close(self) -> None:
        """close stops every bookie process (SIGTERM, then SIGKILL after 10 s)."""
        for i in range(len(self._bookies)):
            process = self._bookies[i].process
            if process is not None and process.poll() is None:
                process.terminate()
        for bookie in self._bookies:
            process = bookie.process
            if process is not None:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None and issubclass(exc_type, Exception):
                # What the bookies saw goes with the error: their logs are under data_dir, which
                # a test's temporary directory (or a CI machine) may not keep.
                for i in range(self._count):
                    sys.stderr.write(f"--- the end of bookie {i}'s log ({self._bookies[i].log_path}):\n"
                                     f"{self.log_tail(i)}\n")
        finally:
            self.close()
