"""Tests of walkit.testing.network: real processes in real namespaces, reached, cut, healed and slowed.

Each test builds its own Network of hosts a, b and c; the programs inside them are tests/network/peer.py.
A path expected to work is given a long timeout (a loaded machine is slow, never wrong); a path
expected to be cut is given a short one, since a dropped packet cannot arrive however long we wait.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from walkit.testing.network import Network, namespaces, network_available, sweep_stale

pytestmark = pytest.mark.network

PEER = str(Path(__file__).with_name("peer.py"))
PORT = 7000
OK_S = 10.0    # the timeout of what should work
CUT_S = 1.0    # the timeout of what should be dropped


@pytest.fixture(scope="module", autouse=True)
def _machine_can_run_networks():
    """The machine must be able to run these tests: a missing tool or privilege fails them, never skips."""
    reason = network_available()
    if reason is not None:
        pytest.fail(f"{reason}: run scripts/test.sh as root", pytrace=False)


@pytest.fixture
def net():
    with Network() as network:
        yield network


@pytest.fixture
def hosts(net):
    return net.add_host("a"), net.add_host("b"), net.add_host("c")


class Peer:
    """Peer is a running peer.py command whose output lines are read with a deadline."""

    def __init__(self, host, *args: str) -> None:
        self.process = host.popen([sys.executable, PEER, *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line.strip())

    def line(self, timeout: float = OK_S) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.process.args} printed nothing within {timeout} s") from None

    def tell(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.line(OK_S + 10)


def serve(host, *args: str) -> Peer:
    """serve starts a peer.py server on host and returns once it listens."""
    peer = Peer(host, *args)
    assert peer.line().startswith("ready")
    return peer


def reach(routes, timeout: float, port: int = PORT) -> list[str]:
    """reach is what a TCP connect gives (ok, timeout, refused) for each (host, address), tried together."""
    processes = [host.popen([sys.executable, PEER, "connect", address, str(port), str(timeout)],
                            stdout=subprocess.PIPE, text=True) for host, address in routes]
    return [p.communicate(timeout=timeout + 30)[0].strip() for p in processes]


def echo_everywhere(*hosts) -> None:
    for host in hosts:
        serve(host, "echo", str(PORT))


def test_hosts_reach_each_other_and_own_their_loopback(net, hosts):
    a, b, c = hosts
    assert [h.address for h in hosts] == ["10.251.0.1", "10.251.0.2", "10.251.0.3"]
    assert {net.prefix + "-a", net.prefix + "-b", net.prefix + "-c", net.prefix + "-br"} <= set(namespaces())
    echo_everywhere(a, b, c)
    assert reach([(a, b.address), (b, a.address), (c, a.address), (a, c.address)], OK_S) == ["ok"] * 4

    serve(a, "echo", str(PORT + 1), "127.0.0.1")
    assert reach([(a, "127.0.0.1")], OK_S, PORT + 1) == ["ok"]
    assert reach([(b, a.address), (b, "127.0.0.1")], OK_S, PORT + 1) == ["refused", "refused"]


def test_nothing_is_made_in_the_machines_own_namespace():
    before = _machine_links()
    with Network() as net:
        net.add_host("a"), net.add_host("b")
        assert _machine_links() == before


def test_cut_stops_both_ways_between_two_hosts_only_and_heal_restores(net, hosts):
    a, b, c = hosts
    echo_everywhere(a, b, c)
    net.cut(a, "b")
    assert net.cuts() == {("a", "b"), ("b", "a")}
    assert reach([(a, b.address), (b, a.address)], CUT_S) == ["timeout", "timeout"]
    assert reach([(a, c.address), (c, a.address), (b, c.address)], OK_S) == ["ok"] * 3

    net.heal("b", a)
    assert net.cuts() == set()
    assert reach([(a, b.address), (b, a.address)], OK_S) == ["ok", "ok"]


def test_one_way_cut_drops_only_from_a_to_b(net, hosts):
    a, b, _ = hosts
    at_a, at_b = serve(a, "udp-listen", str(PORT)), serve(b, "udp-listen", str(PORT))
    net.cut(a, b, one_way=True)
    assert net.cuts() == {("a", "b")}

    b.run([sys.executable, PEER, "udp-send", a.address, str(PORT), "b-to-a"])
    assert at_a.line() == "b-to-a"
    a.run([sys.executable, PEER, "udp-send", b.address, str(PORT), "a-to-b-while-cut"])
    net.heal()
    a.run([sys.executable, PEER, "udp-send", b.address, str(PORT), "a-to-b-healed"])
    assert at_b.line() == "a-to-b-healed"  # the datagram sent while cut was dropped, not delayed


def test_established_connection_goes_silent_under_a_cut_and_resumes_after_heal(net, hosts):
    a, b, _ = hosts
    echo_everywhere(b)
    client = Peer(a, "chat", b.address, str(PORT))
    assert client.line() == "connected"
    assert client.tell(f"send one {OK_S}") == "got one"

    net.cut(a, b)
    assert client.tell(f"send two {CUT_S}") == "timeout"  # dropped, not refused: no reset
    net.heal(a, b)
    assert client.tell(f"recv {OK_S + 10}") == "got two"  # TCP retransmitted it on the same connection
    assert client.tell(f"send three {OK_S}") == "got three"


def test_isolate_cuts_a_host_from_all_and_heal_of_it_leaves_other_cuts(net, hosts):
    a, b, c = hosts
    echo_everywhere(a, b, c)
    net.isolate(a)
    net.cut(b, c)
    every_route = [(a, b.address), (b, a.address), (a, c.address), (c, a.address)]
    assert reach([*every_route, (b, c.address)], CUT_S) == ["timeout"] * 5

    net.heal(a)
    assert net.cuts() == {("b", "c"), ("c", "b")}
    assert reach(every_route, OK_S) == ["ok"] * 4
    assert reach([(b, c.address)], CUT_S) == ["timeout"]
    net.heal()
    assert reach([(b, c.address), (c, b.address)], OK_S) == ["ok", "ok"]


def test_slow_limits_the_rate_toward_a_host_and_unslow_lifts_it(net, hosts):
    a, b, _ = hosts
    sink = serve(b, "sink", str(PORT), "0.5")

    def rate() -> float:
        a.run([sys.executable, PEER, "source", b.address, str(PORT)], timeout=60)
        return float(sink.line())

    fast = rate()
    net.slow(b, rate="1mbit")
    slowed = rate()
    net.unslow(b)
    restored = rate()
    assert slowed < 2 * 125_000, (fast, slowed, restored)  # 1 mbit/s is 125,000 bytes/s
    assert slowed < fast / 4 and slowed < restored / 4, (fast, slowed, restored)


def test_leaving_the_block_kills_process_groups_and_deletes_namespaces_even_on_error():
    with pytest.raises(RuntimeError, match="the test's own"):
        with Network(grace_s=0.5) as net:
            a = net.add_host("a")
            server = serve(a, "echo", str(PORT))
            stubborn = Peer(a, "stubborn")  # ignores SIGTERM, as does its child
            child = int(stubborn.line().split()[1])
            raise RuntimeError("the test's own error")
    assert not [n for n in namespaces() if n.startswith(net.prefix)]
    assert server.process.returncode == -signal.SIGTERM
    assert stubborn.process.returncode == -signal.SIGKILL
    assert not _running(child)


def test_a_network_left_open_is_cleaned_at_interpreter_exit():
    script = ("import subprocess, sys; from walkit.testing.network import Network\n"
              "net = Network().__enter__()\n"
              f"net.add_host('a').popen([sys.executable, {PEER!r}, 'echo', '{PORT}'], stdout=subprocess.DEVNULL)\n"
              "print(net.prefix)\n")
    prefix = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, check=True,
                            timeout=60).stdout.strip()
    assert prefix.startswith("wk")
    assert not [n for n in namespaces() if n.startswith(prefix)]


def test_sweep_stale_deletes_namespaces_of_dead_creators_and_spares_live_ones():
    reaped = subprocess.Popen(["true"])
    reaped.wait()
    stale = f"wk{reaped.pid}-beef-br"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    left_running = subprocess.Popen(["ip", "netns", "exec", stale, "sh", "-c", "echo inside; exec sleep 600"],
                                    stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert left_running.stdout.readline() == "inside\n"
        with Network() as net:  # entering sweeps
            assert stale not in namespaces()
            assert left_running.wait(OK_S) == -signal.SIGKILL
            assert sweep_stale() == []
            assert net.bridge_namespace in namespaces()
    finally:
        left_running.kill()
        left_running.wait()
        if stale in namespaces():
            subprocess.run(["ip", "netns", "delete", stale], check=True)


def test_network_available_here():
    assert network_available() is None


def _machine_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def _running(pid: int) -> bool:
    """_running is whether pid is a process that has not exited (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
