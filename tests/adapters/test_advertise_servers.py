"""The address KV servers and topics brokers publish (walkit.advertise), with real processes.

Listening on every interface registers 127.0.0.1 while the metadata store is on this machine,
an --advertise address when given, and nothing at all (the server refuses to start, before it
touches the cluster) when the store is elsewhere and no --advertise says how others dial it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from walkit.local import LocalCluster

from ..integration.helpers import wait_until
from tests.support.serverprocess import KVProcess

pytestmark = pytest.mark.slow

ELSEWHERE = "zk://192.0.2.1:2181/walkit"          # TEST-NET-1: never dialled, the check comes first


@pytest.mark.parametrize("command", [["kv", "serve"], ["topics", "serve"]])
@pytest.mark.parametrize("host, advertise, says", [
    ("0.0.0.0", None, "set --advertise"),
    ("127.0.0.1", None, "only this machine can dial"),
    ("0.0.0.0", "0.0.0.0:7000", "not a wildcard"),
])
def test_a_server_whose_address_nobody_could_dial_refuses_to_start(tmp_path, command, host, advertise, says):
    result = subprocess.run([sys.executable, "-m", "walkit", *command, "--metadata", ELSEWHERE, "--host", host,
                             "--port", "0", *(["--advertise", advertise] if advertise else [])],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode != 0
    assert says in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("args, published", [
    (("--host", "0.0.0.0"), "127.0.0.1"),                            # a local store: loopback
    (("--host", "0.0.0.0", "--advertise", "localhost:{port}"), "localhost"),
])
def test_kv_servers_tell_followers_the_address_the_leader_publishes(tmp_path, args, published):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster:
        a = KVProcess(tmp_path, metadata=cluster.metadata_url)
        a.args = tuple(arg.format(port=a.port) for arg in args)
        b = KVProcess(tmp_path, metadata=cluster.metadata_url)
        try:
            a.start().wait_role(b"master")
            b.start()
            wait_until(lambda: b.role()[0] == b"slave" and b.role()[3] == b"connected", 60,
                       message=lambda: b.log_tail())
            assert b.role()[1:3] == [published.encode(), a.port]
        finally:
            a.stop()
            b.stop()
