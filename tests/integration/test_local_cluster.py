"""LocalCluster: real bookie processes on 127.0.0.1, killed, stopped, restarted and added."""

from __future__ import annotations

import os
import signal

import pytest

import walkit
from walkit.core.messages import Status
from walkit.errors import WalkitError
from walkit.local import LocalCluster

from .helpers import RawBookie, pid_alive, wait_until

pytestmark = pytest.mark.slow


def listening_hosts(port: int) -> set[str]:
    """listening_hosts returns the local IPv4/IPv6 addresses a TCP socket listens on at `port` (Linux)."""
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state = fields[1], fields[3]
            host_hex, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:          # 0A = LISTEN
                if len(host_hex) == 8:
                    hosts.add(".".join(str(b) for b in reversed(bytes.fromhex(host_hex))))
                else:
                    hosts.add(host_hex)
    return hosts


def live(cluster: LocalCluster) -> set[str]:
    with walkit.Client(cluster.metadata_url) as client:
        return set(client.bookies())


def serves(address: str) -> bool:
    """serves tells whether a bookie answers a plain request at `address`."""
    with RawBookie(address) as raw:
        return raw.read_lac(987654321, timeout=5).status == Status.NO_SUCH_LEDGER


def test_bookies_listen_on_127_0_0_1_with_distinct_ports(local_cluster):
    addresses = local_cluster.addresses
    assert len(addresses) == 3
    hosts = [a.rsplit(":", 1)[0] for a in addresses]
    ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
    assert hosts == ["127.0.0.1"] * 3
    assert len(set(ports)) == 3
    assert live(local_cluster) == set(addresses)
    for address, port in zip(addresses, ports):
        assert serves(address)
        if os.path.exists("/proc/net/tcp"):
            assert listening_hosts(port) == {"127.0.0.1"}, f"bookie at port {port} must bind 127.0.0.1 only"
    pids = [local_cluster.pid(i) for i in range(3)]
    assert len(set(pids)) == 3 and all(pid_alive(p) for p in pids)


def test_kill_bookie_sigkills_and_the_registration_expires(local_cluster):
    address, pid = local_cluster.addresses[1], local_cluster.pid(1)
    local_cluster.kill_bookie(1)
    assert not local_cluster.is_running(1)
    assert not pid_alive(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # SIGKILL gives the bookie no chance to deregister and no chance to log its shutdown ...
    assert "stopped" not in local_cluster.log_tail(1)
    # ... so its ephemeral registration lingers until its lease (3 s by default) expires.
    wait_until(lambda: address not in live(local_cluster), timeout=15,
               message=f"the registration of killed bookie {address} did not expire")
    assert live(local_cluster) == set(local_cluster.addresses) - {address}


def test_stop_bookie_deregisters_at_once(local_cluster):
    address, pid = local_cluster.addresses[0], local_cluster.pid(0)
    local_cluster.stop_bookie(0)
    assert not local_cluster.is_running(0)
    assert not pid_alive(pid)
    assert address not in live(local_cluster)          # no waiting: a clean stop deregisters
    assert "stopped" in local_cluster.log_tail(0)


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_start_bookie_comes_back_on_the_same_address(local_cluster, how):
    address, old_pid = local_cluster.addresses[2], local_cluster.pid(2)
    getattr(local_cluster, f"{how}_bookie")(2)
    assert not pid_alive(old_pid)
    local_cluster.start_bookie(2)
    assert local_cluster.addresses[2] == address
    assert local_cluster.is_running(2)
    new_pid = local_cluster.pid(2)
    assert new_pid != old_pid and pid_alive(new_pid)
    assert address in live(local_cluster)
    assert serves(address)
    # It stays up: start_bookie returned because it registered, not because of a stale record.
    with walkit.Client(local_cluster.metadata_url) as client:
        writer = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3)
        assert address in writer.metadata.ensembles[0]
        assert writer.append(b"back") == 0
        writer.close()
    assert local_cluster.is_running(2), local_cluster.log_tail(2)


def test_add_bookie_adds_a_registered_fourth_bookie(local_cluster):
    index = local_cluster.add_bookie()
    assert index == 3
    addresses = local_cluster.addresses
    assert len(addresses) == 4 and len(set(addresses)) == 4
    assert addresses[3].startswith("127.0.0.1:")
    assert local_cluster.is_running(3) and pid_alive(local_cluster.pid(3))
    assert live(local_cluster) == set(addresses)
    assert serves(addresses[3])
    with walkit.Client(local_cluster.metadata_url) as client:
        writer = client.create_ledger(ensemble=4, write_quorum=2, ack_quorum=2)
        assert set(writer.metadata.ensembles[0]) == set(addresses)
        for i in range(8):
            assert writer.append(b"%d" % i) == i
        writer.close()


def test_leaving_the_context_manager_leaves_no_bookie_process(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster:
        cluster.add_bookie()
        cluster.kill_bookie(0)
        cluster.stop_bookie(1)
        pids = [cluster.pid(i) for i in range(4)]
        assert all(p is not None for p in pids)
        assert [pid_alive(p) for p in pids] == [False, False, True, True]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_bookies_exit_with_their_parent(tmp_path):
    """A bookie whose parent dies exits by itself (--exit-with-parent), so nothing is left behind."""
    import subprocess
    import sys
    script = (
        "import sys, walkit\n"
        f"c = walkit.LocalCluster(bookies=2, data_dir={str(tmp_path / 'orphans')!r})\n"
        "print(' '.join(str(c.pid(i)) for i in range(2)), flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    bookie_pids: list[int] = []
    try:
        bookie_pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(bookie_pids) == 2 and all(pid_alive(p) for p in bookie_pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_until(lambda: not any(pid_alive(p) for p in bookie_pids), timeout=15,
                   message="bookies outlived the process that started them")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in bookie_pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_bookie_restarted_by_hand_on_a_killed_bookies_address_waits_for_the_stale_registration(local_cluster):
    """`walkit bookie` started (as a supervisor would) right after a crash registers once the lease ends."""
    import subprocess
    import sys
    address = local_cluster.addresses[0]
    port = address.rsplit(":", 1)[1]
    local_cluster.kill_bookie(0)
    assert address in live(local_cluster)          # the dead bookie's lease has not run out yet
    log_path = os.path.join(local_cluster.data_dir, "by-hand.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "walkit", "bookie", "--metadata", local_cluster.metadata_url,
                                    "--port", port, "--storage", local_cluster.storages[0], "--exit-with-parent"],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=local_cluster.data_dir)
    try:
        wait_until(lambda: process.poll() is None and serves(address), timeout=20,
                   message=lambda: f"the restarted bookie does not serve:\n{open(log_path).read()}")
        wait_until(lambda: address in live(local_cluster), timeout=10)
        assert process.poll() is None, open(log_path).read()
    finally:
        process.terminate()
        process.wait(10)


def test_a_cluster_restarted_on_the_same_data_dir_keeps_its_addresses(tmp_path):
    data_dir = str(tmp_path / "cluster")
    with LocalCluster(bookies=2, data_dir=data_dir) as first:
        addresses = first.addresses
    with LocalCluster(bookies=3, data_dir=data_dir) as second:
        assert second.addresses[:2] == addresses
        assert len(set(second.addresses)) == 3
        assert live(second) == set(second.addresses)


def _listen_on(port: int):
    """_listen_on takes 127.0.0.1:port as another process on the machine could (a listening socket)."""
    import socket
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_new_bookie_whose_chosen_port_was_taken_before_it_bound_starts_on_another(tmp_path):
    """Another process takes a chosen port between the free-port check and the bookie's bind."""
    cluster = LocalCluster(bookies=2, data_dir=str(tmp_path / "cluster"), start=False, http=True)
    taken = []
    check_ports = cluster._wait_ports_free

    def check_then_take(indexes):
        check_ports(indexes)
        if not taken:
            cluster._placement_args(1)                   # chooses bookie 1's HTTP port, as the spawn would
            taken.append(_listen_on(cluster._bookies[0].port))
            taken.append(_listen_on(cluster._bookies[1].http_port))

    cluster._wait_ports_free = check_then_take
    try:
        cluster.start()
        taken_port, taken_http = (sock.getsockname()[1] for sock in taken)
        assert cluster._bookies[0].port != taken_port
        assert cluster._bookies[1].http_port != taken_http
        assert live(cluster) == set(cluster.addresses)
        assert serves(cluster.addresses[0])
        with open(cluster._bookies[0].log_path) as log:
            assert "Address already in use" in log.read()
        with open(cluster._bookies[1].log_path) as log:
            assert "Address already in use" in log.read()
    finally:
        cluster.close()
        for sock in taken:
            sock.close()
    with LocalCluster(bookies=2, data_dir=str(tmp_path / "cluster"), http=True) as again:
        assert again.addresses == cluster.addresses                 # the ports it got are remembered
        assert again.http_address(1) == cluster.http_address(1)


def test_a_new_bookie_whose_chosen_port_is_taken_before_start_gets_another(tmp_path):
    cluster = LocalCluster(bookies=1, data_dir=str(tmp_path / "cluster"), start=False)
    try:
        with _listen_on(cluster._bookies[0].port) as taken:
            cluster.start()
            assert cluster._bookies[0].port != taken.getsockname()[1]
            assert serves(cluster.addresses[0])
    finally:
        cluster.close()


def test_a_bookie_that_served_is_not_moved_when_its_port_is_taken(tmp_path):
    data_dir = str(tmp_path / "cluster")
    with LocalCluster(bookies=1, data_dir=data_dir) as first:
        address = first.addresses[0]
    cluster = LocalCluster(bookies=1, data_dir=data_dir, start=False, ready_timeout=5)
    try:
        with _listen_on(int(address.rsplit(":", 1)[1])):
            with pytest.raises(WalkitError, match="port .* still in use|Address already in use"):
                cluster.start()
        assert cluster.addresses == [address]
    finally:
        cluster.close()


def test_a_bookie_that_served_while_another_failed_to_start_keeps_its_port(tmp_path):
    """start() fails for bookie 1; bookie 0 still serves, so a later restart must not move it."""
    root = tmp_path / "cluster"
    cluster = LocalCluster(bookies=2, data_dir=str(root), storage=f"files://{root}/b{{i}}", start=False,
                           ready_timeout=10)
    try:
        (root / "b1").write_text("not a folder")                # bookie 1 cannot open its storage: it exits
        with pytest.raises(WalkitError, match="bookie 1 exited during start-up"):
            cluster.start()
        address = cluster.addresses[0]
        wait_until(lambda: address in live(cluster), timeout=10)
        with walkit.Client(cluster.metadata_url) as client:
            ledger = client.create_ledger(1, 1, 1)
            ledger.append(b"on bookie 0")
            ledger.close()
        cluster.stop_bookie(0)
        with _listen_on(int(address.rsplit(":", 1)[1])):
            with pytest.raises(WalkitError, match="still in use|Address already in use"):
                cluster.start_bookie(0)
        assert cluster.addresses[0] == address
    finally:
        cluster.close()


def test_an_error_in_the_cluster_block_shows_the_end_of_every_bookie_log(tmp_path, capsys):
    """An exception inside `with LocalCluster(...)` writes each bookie's last log lines to stderr.

    A failed test's temporary directory (and a CI machine) may not be kept: what the bookies
    logged has to go out with the error.
    """
    with pytest.raises(RuntimeError, match="inside the block"):
        with LocalCluster(bookies=2, data_dir=str(tmp_path / "cluster")) as cluster:
            addresses = list(cluster.addresses)
            for i, address in enumerate(addresses):      # logged once serving, just after registering
                wait_until(lambda: f"bookie {address} serving" in cluster.log_tail(i))
            raise RuntimeError("inside the block")
    err = capsys.readouterr().err
    for i, address in enumerate(addresses):
        assert f"the end of bookie {i}'s log" in err
        assert f"bookie {address} serving" in err
