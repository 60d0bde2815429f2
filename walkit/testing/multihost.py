"""walkit.testing.multihost deploys a walkit cluster on the hosts of a walkit.testing.network Network.

    with Network() as net, Deployment(net, workdir) as d:
        url = d.zookeeper(net.add_host("meta"))                  # zk://10.251.0.1:2181/walkit?...
        for i in range(4):
            d.bookie(net.add_host(f"b{i}"), listen="0.0.0.0:3181")  # --advertise the host's address
        d.bookies([net.add_host(f"x{i}") for i in range(3)])      # or started at once, then waited on
        client = net.add_host("client")
        d.walkit(client, "bookies", "list", "--json")             # any walkit command, run on a host

Every process runs inside its host's namespace and logs to a file under `workdir`
(`<host>-<what>.log`); the test process itself is outside the network and reaches nothing in
it, so it waits on log lines (`wait_log`) and asks questions by running commands on a host
(`walkit`, `python`). Processes are started through the Network, which kills them when it closes;
leaving the Deployment kills its services at once (SIGKILL; stop one first where a graceful stop matters).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from walkit.local import stop_process
from walkit.testing.network import Host, Network
from walkit.testing.servers import JAVA_BINARY, ZOOKEEPER_JAR, zookeeper_missing

#: ZooKeeper's port on its host, and the session length clients ask for (short: a host cut off
#: loses its registrations and leadership quickly, yet a loaded 2-core machine keeps them).
ZK_PORT = 2181
SESSION_S = 4.0


class Service:
    """Service is one process of the deployment: where it runs, its log, how to stop it."""

    def __init__(self, deployment: "Deployment", host: Host, what: str, argv: list[str]) -> None:
        self.deployment = deployment
        self.host = host
        self.what = what
        self.argv = argv
        self.log_path = os.path.join(deployment.workdir, f"{host.name}-{what}.log")
        self.process: subprocess.Popen | None = None
        self._log_start = 0

    def start(self) -> "Service":
        """start runs the process on its host (again, after a stop or kill), appending to its log."""
        self._log_start = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        with open(self.log_path, "ab") as log:
            self.process = self.host.popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, cwd=self.deployment.workdir,
                                           env=self.deployment.env)
        return self

    def log(self) -> str:
        """log is what this run of the process wrote so far."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 60.0) -> re.Match:
        """wait_log waits until this run's log matches `pattern`; AssertionError (with the log) if it
        does not in time or the process exits first."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.log())
            if found:
                return found
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"{self.what} on {self.host.name} exited ({self.process.returncode}) "
                                     f"before logging {pattern!r}:\n{self.log()[-3000:]}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.what} on {self.host.name} did not log {pattern!r} in {timeout:g} s:\n"
                                     f"{self.log()[-3000:]}")
            time.sleep(0.05)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """stop ends the process with SIGTERM (SIGKILL after `timeout`)."""
        stop_process(self.process, timeout)

    def kill(self) -> None:
        """kill ends the process with SIGKILL."""
        if self.running():
            self.process.kill()
            self.process.wait()


class Deployment:
    """Deployment starts ZooKeeper, bookies and walkit servers on hosts of `network`."""

    def __init__(self, network: Network, workdir: str) -> None:
        self.network = network
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.services: list[Service] = []
        self.metadata_url = ""

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc) -> None:
        # No check reads anything after the deployment ends, so its processes are killed at once
        # rather than stopped one by one (SIGTERM and a wait each): a test that needs a graceful
        # stop calls Service.stop itself before.
        for service in self.services:
            if service.running():
                try:
                    service.process.kill()
                except OSError:
                    pass
        for service in self.services:
            if service.process is not None:
                service.process.wait()

    def service(self, host: Host, what: str, argv: list[str]) -> Service:
        """service starts `argv` on `host` as a tracked Service logging to `<host>-<what>.log`."""
        service = Service(self, host, what, argv).start()
        self.services.append(service)
        return service

    # -- the metadata store -------------------------------------------------------------------
    def zookeeper(self, host: Host, root: str = "/walkit") -> str:
        """zookeeper runs a standalone ZooKeeper on `host` and returns the metadata URL clients use."""
        missing = zookeeper_missing()
        if missing:
            raise AssertionError(missing)
        data = os.path.join(self.workdir, f"{host.name}-zookeeper")
        os.makedirs(os.path.join(data, "data"), exist_ok=True)
        config = os.path.join(data, "zoo.cfg")
        with open(config, "w") as f:
            f.write("\n".join([
                "tickTime=100", f"dataDir={os.path.join(data, 'data')}", f"clientPort={ZK_PORT}",
                f"clientPortAddress={host.address}", "admin.enableServer=false", "minSessionTimeout=200",
                f"maxSessionTimeout={int(SESSION_S * 1000)}", "4lw.commands.whitelist=srvr", "maxClientCnxns=0",
            ]) + "\n")
        zk = self.service(host, "zookeeper", [
            JAVA_BINARY, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.jmx.log4j.disable=true", "-cp", ZOOKEEPER_JAR,
            "org.apache.zookeeper.server.ZooKeeperServerMain", config])
        self.metadata_url = (f"zk://{host.address}:{ZK_PORT}{root}?session_timeout={SESSION_S:g}"
                             f"&timeout=10")
        done = self.python(host, "-c", _WAIT_TCP, host.address, str(ZK_PORT), "90", check=False, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"ZooKeeper on {host.name} did not start: {done.stderr}\n{zk.log()[-3000:]}")
        return self.metadata_url

    # -- walkit processes ------------------------------------------------------------------------
    def bookie(self, host: Host, *, listen: str | None = None, advertise: str | None = None,
               storage: str | None = None, args: tuple[str, ...] = (), name: str = "bookie",
               wait: bool = True) -> Service:
        """bookie starts `walkit bookie` on `host`: on its address (or `listen`, advertising the host's
        address when `listen` is a wildcard), with files storage under workdir unless told; it returns
        once the bookie serves (at once with wait=False)."""
        storage = storage or f"files://{os.path.join(self.workdir, f'{host.name}-{name}-data')}"
        listen = listen or f"{host.address}:3181"
        if advertise is None and listen.startswith("0.0.0.0"):
            advertise = host.address
        argv = [sys.executable, "-m", "walkit", "bookie", "--metadata", self.metadata_url, "--storage", storage,
                "--listen", listen, *(["--advertise", advertise] if advertise else []), *args]
        service = self.service(host, name, argv)
        if wait:
            service.wait_log(r"serving at", timeout=60)
        return service

    def bookies(self, hosts: list[Host], **options) -> list[Service]:
        """bookies starts a bookie on each of `hosts` (options as `bookie`) at once, then waits until
        every one serves: their start-ups overlap instead of running one after another."""
        started = [self.bookie(host, wait=False, **options) for host in hosts]
        for service in started:
            service.wait_log(r"serving at", timeout=60)
        return started

    def walkit(self, host: Host, *args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
        """walkit runs `python -m walkit ARGS` on `host` (with --metadata appended where it applies)."""
        return self.python(host, "-m", "walkit", *args, timeout=timeout, check=check)

    def python(self, host: Host, *args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
        """python runs `python ARGS` on `host` and returns what it printed."""
        done = host.run([sys.executable, *args], check=False, capture_output=True, text=True, timeout=timeout,
                        env=self.env, cwd=self.workdir)
        if check and done.returncode != 0:
            raise AssertionError(f"python {' '.join(args[:3])}... on {host.name} failed ({done.returncode}):\n"
                                 f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return done

    def live_bookies(self, host: Host) -> dict[str, dict]:
        """live_bookies maps each registered bookie id to its registration, as `host` reads it."""
        listed = self.walkit(host, "bookies", "list", "--json", "--metadata", self.metadata_url).stdout
        return {doc["address"]: doc for doc in json.loads(listed)}


#: A program run on a host: wait until HOST:PORT accepts a TCP connection (up to SECONDS).
_WAIT_TCP = """
import socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + seconds
while True:
    try:
        socket.create_connection((host, port), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"{host}:{port} did not accept a connection in {seconds} s")
        time.sleep(0.1)
"""
