"""walkit.testing.servers runs real ZooKeeper and etcd servers on 127.0.0.1 for tests and benchmarks.

    with ZooKeeperServer() as zk, EtcdServer() as etcd:
        store = open_metadata(zk.url("/walkit"))       # zk://127.0.0.1:<port>/walkit
        zk.stop(); zk.restart()                        # same port, same data
        etcd.kill()                                    # SIGKILL

They start the Debian binaries (packages ``zookeeper`` and ``etcd-server``; scripts/test.sh
installs them) in a temporary directory with a free port, wait until the server answers, and
as context managers stop the process and remove the directory. ZooKeeper runs with a 100 ms
tick so sessions may be as short as 200 ms. `EtcdCluster` runs a three-member etcd cluster on
loopback; `SecuredEtcdServer` runs one etcd with authentication enabled, and `with_user`
puts a user and password into a metadata URI.

Each server process lives in its own process group and, on Linux, is killed by the kernel if
the thread that started it dies (PR_SET_PDEATHSIG), so even a crashed test run leaves no
server behind; servers still running at interpreter exit are stopped too.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from urllib.parse import quote

from walkit.local import stop_process


ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
ETCD_BINARY = "/usr/bin/etcd"
JAVA_BINARY = "java"
INSTALL_HINT = "run scripts/test.sh, which installs the Debian packages zookeeper and etcd-server"

_running: "weakref.WeakSet[_ServerProcess]" = weakref.WeakSet()


class ServerMissing(RuntimeError):
    """ServerMissing is raised when the ZooKeeper or etcd binaries are not installed."""


def zookeeper_missing() -> str | None:
    """zookeeper_missing says why ZooKeeperServer cannot run here, or returns None if it can."""
    if not os.path.exists(ZOOKEEPER_JAR):
        return f"ZooKeeper is not installed ({ZOOKEEPER_JAR} is missing); {INSTALL_HINT}"
    if shutil.which(JAVA_BINARY) is None:
        return f"java is not installed; {INSTALL_HINT}"
    return None


def etcd_missing() -> str | None:
    """etcd_missing says why EtcdServer cannot run here, or returns None if it can."""
    if shutil.which(ETCD_BINARY) is None:
        return f"etcd is not installed ({ETCD_BINARY} is missing); {INSTALL_HINT}"
    return None


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def server_port() -> int:
    """server_port returns a free TCP port on 127.0.0.1 outside the kernel's ephemeral port range.

    A stopped server's port must stay free until restart(). Ports that bind(0) hands out (the
    usual "free port") come from the ephemeral range, which every other test's free port and
    every outgoing connection also use, so one of them could take the port meanwhile, or a
    client reconnecting to the stopped server could even connect to itself. Ports outside that
    range are only taken by someone who asks for them by number.
    """
    low, high = _ephemeral_range()
    choices = range(10000, low) if low - 10000 >= 1000 else range(high + 1, 65536)
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(choices)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {choices.start}-{choices.stop - 1} on 127.0.0.1")


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()          # loaded here: a forked child must not import anything


def _die_with_parent() -> None:
    """_die_with_parent asks Linux to SIGKILL this (child) process when the thread that forked it ends."""
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)                 # 1 = PR_SET_PDEATHSIG


def _stop_all() -> None:
    for server in list(_running):
        server.kill()


atexit.register(_stop_all)


class _ServerProcess:
    """_ServerProcess is one server process: start, wait until ready, stop, kill, restart."""

    name = "server"

    def __init__(self, data_dir: str, ready_timeout: float) -> None:
        self.data_dir = data_dir
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen | None = None
        self.log_path = os.path.join(data_dir, f"{self.name}.log")

    def command(self) -> list[str]:
        """command is the argument vector that starts the server."""
        raise NotImplementedError

    def is_ready(self) -> bool:
        """is_ready returns True once the server answers clients."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        """running is True while the server process is alive."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """start launches the process and returns once it answers, or raises RuntimeError."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """launch starts the process (unless it runs) without waiting for it to answer."""
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.data_dir,
                                            start_new_session=True, preexec_fn=_die_with_parent)
        _running.add(self)

    def wait_ready(self) -> None:
        """wait_ready returns once the server answers, or raises RuntimeError (and kills it)."""
        deadline = time.monotonic() + self.ready_timeout
        while not self.is_ready():
            if self.process is None or self.process.poll() is not None:
                status = None if self.process is None else self.process.returncode
                raise RuntimeError(f"{self.name} exited with status {status} while starting; "
                                   f"log:\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(f"{self.name} did not answer within {self.ready_timeout:g} s; "
                                   f"log:\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> None:
        """stop ends the process with SIGTERM (SIGKILL if it lingers) and waits for it."""
        if self.process is None:
            return
        stop_process(self.process, timeout)
        _running.discard(self)

    def kill(self) -> None:
        """kill ends the process with SIGKILL and waits for it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        _running.discard(self)

    def log_tail(self, lines: int = 30) -> str:
        """log_tail returns the last lines of the server's log."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"


class _Managed:
    """_Managed gives a server wrapper its temp dir, restart() and context-manager cleanup."""

    _processes: list[_ServerProcess]

    def _make_dir(self, data_dir: str | None, prefix: str) -> str:
        self._own_dir = data_dir is None
        path = tempfile.mkdtemp(prefix=prefix) if data_dir is None else os.path.abspath(data_dir)
        os.makedirs(path, exist_ok=True)
        return path

    def start(self):
        """start launches the server processes together, then waits until each one answers."""
        try:
            for process in self._processes:
                process.launch()
            for process in self._processes:
                process.wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def stop(self) -> None:
        """stop ends the server processes gracefully (SIGTERM); data stays for restart()."""
        for process in self._processes:
            process.stop()

    def kill(self) -> None:
        """kill ends the server processes abruptly (SIGKILL); data stays for restart()."""
        for process in self._processes:
            process.kill()

    def restart(self):
        """restart stops the servers if running and starts them again on the same ports and data."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """close kills the processes and removes the data directory if this object created it."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _ZooKeeperProcess(_ServerProcess):
    name = "zookeeper"

    def __init__(self, data_dir: str, port: int, tick_ms: int, max_session_s: float, ready_timeout: float) -> None:
        super().__init__(data_dir, ready_timeout)
        self.port = port
        self.config_path = os.path.join(data_dir, "zoo.cfg")
        with open(self.config_path, "w") as f:
            f.write("\n".join([
                f"tickTime={tick_ms}",
                f"dataDir={os.path.join(data_dir, 'data')}",
                f"clientPort={port}",
                "clientPortAddress=127.0.0.1",
                "admin.enableServer=false",
                f"minSessionTimeout={2 * tick_ms}",
                f"maxSessionTimeout={int(max_session_s * 1000)}",
                "4lw.commands.whitelist=srvr",
                "maxClientCnxns=0",
                "initLimit=10",
                "syncLimit=5",
            ]) + "\n")

    def command(self) -> list[str]:
        return [JAVA_BINARY, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Dzookeeper.jmx.log4j.disable=true", "-cp", ZOOKEEPER_JAR,
                "org.apache.zookeeper.server.ZooKeeperServerMain", self.config_path]

    def is_ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"srvr")
                answer = b""
                while chunk := s.recv(4096):
                    answer += chunk
        except OSError:
            return False
        return b"Mode:" in answer


class ZooKeeperServer(_Managed):
    """ZooKeeperServer is one standalone ZooKeeper 3.8 server on 127.0.0.1.

    `tick_ms` is ZooKeeper's tick (sessions may last from 2 ticks to `max_session_s`). The
    data directory is a new temp dir unless `data_dir` is given; the port is a free one (see
    `server_port`) unless `port` is given. It raises ServerMissing (saying to run
    scripts/test.sh) if ZooKeeper or java is not installed.
    """

    def __init__(self, data_dir: str | None = None, port: int | None = None, *, tick_ms: int = 100,
                 max_session_s: float = 60.0, ready_timeout: float = 60.0, start: bool = True) -> None:
        missing = zookeeper_missing()
        if missing:
            raise ServerMissing(missing)
        self.data_dir = self._make_dir(data_dir, "walkit-zk-")
        self.port = port or server_port()
        self._process = _ZooKeeperProcess(self.data_dir, self.port, tick_ms, max_session_s, ready_timeout)
        self._processes = [self._process]
        if start:
            self.start()

    @property
    def address(self) -> str:
        """address is ``127.0.0.1:<port>``, the client address."""
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """running is True while the server process is alive."""
        return self._process.running

    def url(self, root: str = "/walkit", **options) -> str:
        """url returns the ``zk://`` metadata URI of `root` on this server, with `options` as query."""
        return _url("zk", [self.address], root, options)


class _EtcdProcess(_ServerProcess):
    name = "etcd"
    extra_args: tuple[str, ...] = ()          # more flags, e.g. --auth-token-ttl

    def __init__(self, data_dir: str, member: str, client_port: int, peer_port: int, cluster: str,
                 ready_timeout: float) -> None:
        super().__init__(os.path.join(data_dir, member), ready_timeout)
        os.makedirs(self.data_dir, exist_ok=True)
        self.member = member
        self.client_port = client_port
        self.peer_port = peer_port
        self.cluster = cluster

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [ETCD_BINARY, "--name", self.member, "--data-dir", os.path.join(self.data_dir, "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", self.cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", "walkit-test",
                "--heartbeat-interval", "50", "--election-timeout", "500",
                "--logger", "zap", "--log-outputs", "stderr", *self.extra_args]

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.client_port}/health", timeout=1.0) as r:
                return b'"true"' in r.read()
        except OSError:
            return False


class EtcdCluster(_Managed):
    """EtcdCluster is `members` etcd 3.4 members on 127.0.0.1, one process each.

    Members start together (etcd needs a quorum to answer), each with a free client port and a
    free peer port (see `server_port`), under one temp data directory unless `data_dir` is
    given. It raises ServerMissing (saying to run scripts/test.sh) if etcd is not installed.
    """

    def __init__(self, members: int = 3, data_dir: str | None = None, *, ready_timeout: float = 60.0,
                 start: bool = True) -> None:
        missing = etcd_missing()
        if missing:
            raise ServerMissing(missing)
        if members < 1:
            raise ValueError(f"an etcd cluster needs at least one member, not {members}")
        self.data_dir = self._make_dir(data_dir, "walkit-etcd-")
        names = [f"m{i}" for i in range(members)]
        ports = [(server_port(), server_port()) for _ in names]
        cluster = ",".join(f"{n}=http://127.0.0.1:{peer}" for n, (_, peer) in zip(names, ports))
        self._processes = [_EtcdProcess(self.data_dir, n, c, p, cluster, ready_timeout)
                           for n, (c, p) in zip(names, ports)]
        if start:
            self.start()

    @property
    def addresses(self) -> list[str]:
        """addresses lists the client address (``127.0.0.1:<port>``) of each member."""
        return [f"127.0.0.1:{p.client_port}" for p in self._processes]

    def url(self, root: str = "/walkit", member: int = 0, **options) -> str:
        """url returns the ``etcd://`` metadata URI of `root` through member `member`."""
        return _url("etcd", [self.addresses[member]], root, options)

    def kill_member(self, member: int) -> None:
        """kill_member SIGKILLs one member (the others keep the cluster going with a quorum)."""
        self._processes[member].kill()

    def start_member(self, member: int) -> None:
        """start_member starts a stopped member again on its ports and data."""
        self._processes[member].start()


class EtcdServer(EtcdCluster):
    """EtcdServer is a single-member etcd 3.4 server on 127.0.0.1 (see EtcdCluster)."""

    def __init__(self, data_dir: str | None = None, *, ready_timeout: float = 60.0, start: bool = True) -> None:
        super().__init__(1, data_dir, ready_timeout=ready_timeout, start=start)

    @property
    def address(self) -> str:
        """address is ``127.0.0.1:<port>``, the client address."""
        return self.addresses[0]

    @property
    def port(self) -> int:
        """port is the client port."""
        return self._processes[0].client_port

    @property
    def running(self) -> bool:
        """running is True while the server process is alive."""
        return self._processes[0].running


class SecuredEtcdServer(EtcdServer):
    """SecuredEtcdServer is an EtcdServer with authentication enabled, and users limited to a key prefix.

        with SecuredEtcdServer(token_ttl_s=2) as etcd:
            etcd.add_user("walkit", "secret", prefix="/walkit/")     # readwrite on /walkit/...
            store = open_metadata(with_user(etcd.url("/walkit"), "walkit", "secret"))

    It creates user ``root`` (password `root_password`, role root) and enables authentication
    through the v3 JSON gateway (no etcdctl needed). `token_ttl_s` is etcd's
    ``--auth-token-ttl``: how long an idle token stays valid.
    """

    def __init__(self, root_password: str = "root-secret", *, token_ttl_s: int | None = None,
                 data_dir: str | None = None, ready_timeout: float = 60.0) -> None:
        super().__init__(data_dir, ready_timeout=ready_timeout, start=False)
        if token_ttl_s is not None:
            self._processes[0].extra_args = ("--auth-token-ttl", str(int(token_ttl_s)))
        self.root_password = root_password
        self.start()
        try:
            self.api("/auth/user/add", {"name": "root", "password": root_password})
            self.api("/auth/role/add", {"name": "root"})
            self.api("/auth/user/grant", {"user": "root", "role": "root"})
            self.api("/auth/enable", {})
        except BaseException:
            self.close()
            raise

    def api(self, path: str, body: dict, token: str | None = None) -> dict:
        """api posts `body` to the v3 JSON gateway at `path` (with `token` if given) and returns the answer."""
        request = urllib.request.Request(f"http://{self.address}/v3{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": token} if token else {})})
        with urllib.request.urlopen(request, timeout=10.0) as answer:
            return json.load(answer)

    def root_token(self) -> str:
        """root_token authenticates user root and returns its token."""
        return self.api("/auth/authenticate", {"name": "root", "password": self.root_password})["token"]

    def add_user(self, name: str, password: str, prefix: str) -> None:
        """add_user creates user `name` with a role of its own granting readwrite on keys starting with `prefix`."""
        token = self.root_token()
        keys = {"key": base64.b64encode(prefix.encode()).decode(),
                "range_end": base64.b64encode((prefix[:-1] + chr(ord(prefix[-1]) + 1)).encode()).decode()}
        self.api("/auth/user/add", {"name": name, "password": password}, token)
        self.api("/auth/role/add", {"name": f"{name}-rw"}, token)
        self.api("/auth/role/grant", {"name": f"{name}-rw", "perm": {**keys, "permType": "READWRITE"}}, token)
        self.api("/auth/user/grant", {"user": name, "role": f"{name}-rw"}, token)

    def change_password(self, name: str, password: str) -> None:
        """change_password sets the password of user `name`; etcd drops every token the user had."""
        self.api("/auth/user/changepw", {"name": name, "password": password}, self.root_token())



def with_user(url: str, user: str, password: str | None = None) -> str:
    """with_user returns metadata URI `url` with ``user[:password]@`` (percent-encoded) before its hosts."""
    scheme, _, rest = url.partition("://")
    userinfo = quote(user, safe="") + (f":{quote(password, safe='')}" if password is not None else "")
    return f"{scheme}://{userinfo}@{rest}"


def _url(scheme: str, addresses: list[str], root: str, options: dict) -> str:
    root = "/" + root.strip("/")
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{scheme}://{','.join(addresses)}{root}" + (f"?{query}" if query else "")
