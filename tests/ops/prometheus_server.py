"""A real Prometheus server for tests (Debian package `prometheus`, /usr/bin/prometheus).

It listens on 127.0.0.1 on a free port, with its own configuration and data directory, scrapes
the given jobs every `interval` seconds and is stopped (and waited for) by `close()`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

from walkit.local import free_port, stop_process

BINARY = "prometheus"


def prometheus_missing() -> str | None:
    """prometheus_missing says how to install Prometheus when its binary is not on PATH."""
    if shutil.which(BINARY) is None:
        return "the prometheus binary is missing: run scripts/test.sh (apt-get install prometheus)"
    return None


class PrometheusServer:
    """PrometheusServer runs `prometheus` scraping `jobs` ({job name: ["host:port", ...]})."""

    def __init__(self, directory: str, jobs: dict[str, list[str]], *, interval: float = 0.5,
                 ready_timeout: float = 60.0) -> None:
        os.makedirs(directory, exist_ok=True)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        config = os.path.join(directory, "prometheus.yml")
        scrape_configs = "".join(
            f"  - job_name: {json.dumps(job)}\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
            for job, targets in jobs.items())
        every = f"{int(interval * 1000)}ms"              # Prometheus durations take no fractions
        with open(config, "w") as f:
            f.write(f"global:\n  scrape_interval: {every}\n  scrape_timeout: {every}\n"
                    f"scrape_configs:\n{scrape_configs}")
        self.log_path = os.path.join(directory, "prometheus.log")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [BINARY, f"--config.file={config}", f"--storage.tsdb.path={os.path.join(directory, 'data')}",
                 f"--web.listen-address={self.address}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + ready_timeout
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"prometheus did not become ready: {self.log_tail()}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict]:
        """query runs an instant PromQL query and returns its result vector."""
        url = f"http://{self.address}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, promql: str) -> float | None:
        """value is the single number a query returns (None for an empty result)."""
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """close stops the server and waits for it."""
        stop_process(self.process, 20)

    def __enter__(self) -> "PrometheusServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
