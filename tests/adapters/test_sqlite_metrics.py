"""`walkit sqlite replica --http-port`: the replica process serves /metrics, /health and /ready (issue 18)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest

import walkit.adapters.sqlite as sq
from walkit.local import LocalCluster

from walkit.testing.processes import wait_until

pytestmark = pytest.mark.slow


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_replica_process_serves_metrics_health_and_readiness(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        url = cluster.metadata_url
        leader = sq.connect(str(tmp_path / "leader.db"), name="metered", metadata=url, node_id="leader")
        try:
            leader.execute("CREATE TABLE t (x)")
            leader.execute("INSERT INTO t VALUES (1)")
            leader.commit()
            replica = subprocess.Popen([sys.executable, "-m", "walkit", "sqlite", "replica", "metered",
                                        str(tmp_path / "replica.db"), "--metadata", url, "--http-port", "0"],
                                       stderr=subprocess.PIPE, text=True)
            try:
                lines: list[str] = []
                while not any(line.startswith("metrics on http://") for line in lines):
                    line = replica.stderr.readline()
                    assert line, f"the replica ended: {''.join(lines)}"
                    lines.append(line)
                base = next(l for l in lines if l.startswith("metrics on")).split()[2].rsplit("/", 1)[0]
                assert base.startswith("http://127.0.0.1:")
                assert get(base + "/health") == (200, "replica of metered\n")
                wait_until(lambda: get(base + "/ready")[0] == 200, 60, "the replica never became ready")
                status, body = get(base + "/metrics")
                assert status == 200 and "# TYPE" in body
                assert get(base + "/nothing")[0] == 404
            finally:
                replica.terminate()
                replica.wait(timeout=30)
        finally:
            leader.close()
