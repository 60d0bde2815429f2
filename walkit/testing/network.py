"""walkit.testing.network runs real processes on a private network of Linux namespaces and cuts its links.

    with Network() as net:
        a, b, c = net.add_host("a"), net.add_host("b"), net.add_host("c")
        server = b.popen([sys.executable, "-m", "walkit", "bookie", ...])   # runs inside b
        net.cut(a, b)              # a and b no longer reach each other; a and c still do
        net.cut(a, b, one_way=True)  # only a -> b is dropped
        net.isolate(a)             # a reaches no one, no one reaches a
        net.heal(a, b)             # the cuts between a and b are gone; heal(a): all of a's; heal(): all
        net.slow(b, rate="1mbit")  # traffic toward b is rate-limited; net.unslow(b) lifts it

Each host is a network namespace named `<prefix>-<name>` with its own loopback (a host's
127.0.0.1 is its own) and one interface, `eth0`, holding the next free address of the subnet
(10.251.0.0/24 unless told). Every eth0 is one end of a veth pair whose other end sits on the
bridge `br0` of one more namespace, `<prefix>-br`. Nothing is created or changed in the
machine's own namespace: both ends of each veth pair are born in the namespaces they live in.

A cut is an nftables rule (`table bridge walkit`, chain `forward`) in the bridge's namespace
that drops the IPv4 packets from one host's address to another's. Packets are dropped, never
refused: a connect times out, and a TCP connection established before the cut stays open,
carries nothing while cut, and carries its retransmitted data again after heal. ARP is not cut.

`slow` is a rate limit, not a delay: the netem qdisc, which adds delay and loss, is missing
from some kernels, while tbf (a token bucket) is in all of them; slow puts tbf on the bridge's
end of the host's veth, so it limits what the bridge sends toward that host.

It needs root and the `ip`, `tc` (iproute2) and `nft` (nftables) tools; `network_available()`
says in one line what is missing. Cleanup holds when a test fails: leaving the `with` block
kills the process group of every process a host started (SIGTERM, then SIGKILL after a grace
of 3 s) and deletes every namespace; an atexit hook does the same for networks still open at
interpreter exit; and `sweep_stale()`, called on entering a Network, deletes the namespaces
(and kills the processes inside them) left by a process that died without either, such as one
killed by SIGKILL. Errors in cleanup are logged and never hide the error that ended the block.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

from walkit.errors import WalkitError
from walkit.testing.processes import pid_alive

log = logging.getLogger(__name__)

#: STALE_NAME matches the namespaces of a Network with the default prefix, `wk<pid>-<hex>-...`.
STALE_NAME = re.compile(r"^wk(\d+)-[0-9a-f]{4}-")
_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")
_TABLE = ("bridge", "walkit")
_CHAIN = "forward"
_open_networks: set["Network"] = set()


class NetworkError(WalkitError):
    """NetworkError is raised when a command that builds or changes the test network fails."""


class NetworkUnavailable(NetworkError):
    """NetworkUnavailable is raised when the machine lacks what a network feature needs."""


def network_available() -> str | None:
    """network_available is None when this machine can run a Network, else one line saying why not."""
    if os.geteuid() != 0:
        return f"walkit.testing.network needs root (euid is {os.geteuid()})"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"walkit.testing.network needs `{tool}` (Debian package {package})"
    probe = f"{_default_prefix()}-probe"
    try:
        _run(["ip", "netns", "add", probe])
        try:
            _in(probe, ["nft", "add", "table", *_TABLE])
        finally:
            _run(["ip", "netns", "delete", probe])
    except NetworkError as e:
        return f"walkit.testing.network cannot make a namespace with an nftables bridge table: {e}"
    return None


def namespaces() -> list[str]:
    """namespaces lists the names of the machine's named network namespaces (`ip netns list`)."""
    out = _run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def sweep_stale() -> list[str]:
    """sweep_stale deletes the namespaces of default-prefixed Networks whose creating process is dead.

    The processes still running in such a namespace are killed first. It returns the deleted names.
    """
    swept = []
    for name in namespaces():
        match = STALE_NAME.match(name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        try:
            _kill_namespace_processes(name)
            _run(["ip", "netns", "delete", name])
            swept.append(name)
        except NetworkError as e:
            log.warning("walkit.testing.network: could not sweep stale namespace %s: %s", name, e)
    return swept


@dataclass(eq=False)
class Host:
    """Host is one machine of a Network: a namespace with loopback and eth0 at `address`."""

    name: str
    address: str
    namespace: str
    bridge_port: str  # the veth end on the bridge, in the bridge's namespace
    network: "Network" = field(repr=False)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """popen starts argv inside this host's namespace in a process group of its own.

        The keyword arguments go to subprocess.Popen; the Network kills the process's group on exit.
        """
        process = subprocess.Popen(_exec_in(self.namespace, argv), start_new_session=True, **kwargs)
        self.network._processes.append(process)
        return process

    def run(self, argv: list[str], *, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """run runs a short command inside this host's namespace (subprocess.run, check=True unless told)."""
        return subprocess.run(_exec_in(self.namespace, argv), check=check, **kwargs)


class Network:
    """Network is a bridge of hosts in their own namespaces whose links can be cut (see the module doc)."""

    def __init__(self, prefix: str | None = None, subnet: str = "10.251.0.0/24", *,
                 grace_s: float = 3.0) -> None:
        self.prefix = prefix or _default_prefix()
        if not _NAME.match(self.prefix):
            raise ValueError(f"a network prefix is letters, digits, '_', '.', '-': {self.prefix!r}")
        self.bridge_namespace = f"{self.prefix}-br"
        self.hosts: dict[str, Host] = {}
        self.grace_s = grace_s
        self._addresses = ipaddress.ip_network(subnet).hosts()
        self._prefix_len = ipaddress.ip_network(subnet).prefixlen
        self._namespaces: list[str] = []
        self._processes: list[subprocess.Popen] = []
        self._cuts: dict[tuple[str, str], int] = {}  # (from, to) host names -> nft rule handle

    def __enter__(self) -> "Network":
        sweep_stale()
        _open_networks.add(self)
        try:
            self._add_namespace(self.bridge_namespace)
            _run(["ip", "-n", self.bridge_namespace, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.bridge_namespace, "link", "set", "br0", "up"])
            _in(self.bridge_namespace, ["nft", "add", "table", *_TABLE])
            _in(self.bridge_namespace, ["nft", "add", "chain", *_TABLE, _CHAIN,
                                        "{ type filter hook forward priority 0; policy accept; }"])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        errors = self.close()
        if errors and exc is None:
            raise NetworkError("walkit.testing.network cleanup failed: " + "; ".join(errors))

    def add_host(self, name: str) -> Host:
        """add_host makes host `name`: namespace `<prefix>-<name>`, lo up, eth0 on the bridge with the next address."""
        if not _NAME.match(name) or name == "br" or name in self.hosts:
            raise ValueError(f"host name {name!r} is taken or not letters, digits, '_', '.', '-'")
        address = str(next(self._addresses))
        namespace, port = f"{self.prefix}-{name}", f"veth{len(self.hosts)}"
        self._add_namespace(namespace)
        br = ["ip", "-n", self.bridge_namespace, "link"]
        _run([*br, "add", port, "type", "veth", "peer", "name", "eth0", "netns", namespace])
        _run([*br, "set", port, "master", "br0"])
        _run([*br, "set", port, "up"])
        _run(["ip", "-n", namespace, "addr", "add", f"{address}/{self._prefix_len}", "dev", "eth0"])
        _run(["ip", "-n", namespace, "link", "set", "eth0", "up"])
        host = Host(name, address, namespace, port, self)
        self.hosts[name] = host
        return host

    def host(self, host: Host | str) -> Host:
        """host is the Host of this network given as itself or by name."""
        name = host.name if isinstance(host, Host) else host
        if name not in self.hosts or (isinstance(host, Host) and self.hosts[name] is not host):
            raise ValueError(f"no host {name!r} in network {self.prefix}")
        return self.hosts[name]

    def cut(self, a: Host | str, b: Host | str, one_way: bool = False) -> None:
        """cut drops the packets from a to b and, unless one_way, from b to a."""
        a, b = self.host(a), self.host(b)
        if a is b:
            raise ValueError(f"cannot cut host {a.name} from itself")
        self._drop(a, b)
        if not one_way:
            self._drop(b, a)

    def isolate(self, a: Host | str) -> None:
        """isolate cuts host a from every other host of the network, both ways."""
        a = self.host(a)
        for other in list(self.hosts.values()):
            if other is not a:
                self.cut(a, other)

    def heal(self, a: Host | str | None = None, b: Host | str | None = None) -> None:
        """heal removes the cuts between a and b, or every cut of a (or b) alone, or every cut."""
        names = {self.host(h).name for h in (a, b) if h is not None}
        for pair in list(self._cuts):
            if names <= set(pair):
                _in(self.bridge_namespace, ["nft", "delete", "rule", *_TABLE, _CHAIN, "handle", str(self._cuts[pair])])
                del self._cuts[pair]

    def cuts(self) -> set[tuple[str, str]]:
        """cuts is the set of (from, to) host names whose packets are dropped now."""
        return set(self._cuts)

    def slow(self, host: Host | str, rate: str = "1mbit", burst: str = "32kbit", latency: str = "400ms") -> None:
        """slow limits the traffic toward host to `rate` with a tbf qdisc (tc's units: 1mbit, 500kbit)."""
        port = self.host(host).bridge_port
        try:
            _in(self.bridge_namespace, ["tc", "qdisc", "replace", "dev", port, "root", "tbf",
                                        "rate", rate, "burst", burst, "latency", latency])
        except NetworkError as e:
            raise NetworkUnavailable(f"cannot rate-limit with tbf on this kernel or with these values: {e}") from e

    def unslow(self, host: Host | str) -> None:
        """unslow lifts the rate limit that slow put on the traffic toward host."""
        port = self.host(host).bridge_port
        _in(self.bridge_namespace, ["tc", "qdisc", "delete", "dev", port, "root"])

    def close(self) -> list[str]:
        """close kills every process the hosts started and deletes every namespace; it returns the errors, logged."""
        _open_networks.discard(self)
        errors = _stop_all(self._processes, self.grace_s)
        self._processes.clear()
        for namespace in reversed(self._namespaces):  # hosts first, the bridge last
            try:
                _run(["ip", "netns", "delete", namespace])
            except NetworkError as e:
                errors.append(str(e))
        self._namespaces.clear()
        self._cuts.clear()
        for error in errors:
            log.warning("walkit.testing.network %s: cleanup: %s", self.prefix, error)
        return errors

    def _add_namespace(self, namespace: str) -> None:
        _run(["ip", "netns", "add", namespace])
        self._namespaces.append(namespace)
        _run(["ip", "-n", namespace, "link", "set", "lo", "up"])

    def _drop(self, src: Host, dst: Host) -> None:
        if (src.name, dst.name) in self._cuts:
            return
        out = _in(self.bridge_namespace, [
            "nft", "--echo", "--handle", "add", "rule", *_TABLE, _CHAIN, "ip", "saddr", src.address,
            "ip", "daddr", dst.address, "drop", "comment", f'"walkit cut {src.name} {dst.name}"'])
        match = re.search(r"# handle (\d+)", out)
        if match is None:
            raise NetworkError(f"nft did not echo the handle of the cut rule: {out!r}")
        self._cuts[(src.name, dst.name)] = int(match.group(1))


def _stop_all(processes: list[subprocess.Popen], grace_s: float) -> list[str]:
    """_stop_all sends SIGTERM to each process group, SIGKILL to those alive after grace_s, and reaps them."""
    errors = []
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for process in processes:
        _signal_group(process, signal.SIGKILL)  # also the group's children when the leader is gone
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            errors.append(f"process {process.pid} ({process.args!r}) survived SIGKILL")
    return errors


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def _kill_namespace_processes(namespace: str) -> None:
    for pid in _run(["ip", "netns", "pids", namespace]).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _default_prefix() -> str:
    return f"wk{os.getpid()}-{secrets.token_hex(2)}"


def _exec_in(namespace: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", namespace, *argv]


def _in(namespace: str, argv: list[str]) -> str:
    return _run(_exec_in(namespace, argv))


def _run(argv: list[str]) -> str:
    """_run runs a network command and returns its output, or raises NetworkError with its stderr."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetworkError(f"{' '.join(argv)}: {e}") from e
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {done.stderr.strip() or f'exit status {done.returncode}'}")
    return done.stdout


@atexit.register
def _close_open_networks() -> None:
    for network in list(_open_networks):
        network.close()
