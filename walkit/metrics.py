"""walkit.metrics exposes Prometheus metrics and health checks over HTTP (prometheus_client).

    endpoint = HttpEndpoint("127.0.0.1", 9101, [registry], health=lambda: (True, "ok"))
    endpoint.address                       # "127.0.0.1:9101"; GET /metrics, /health, /ready
    endpoint.close()

Every bookie (`walkit bookie --http-port N`) and server (`walkit kv serve --http-port N`)
runs one. Metric values live in plain attributes of the objects that count them (a bookie's
service, the auto-recovery daemon, a client) and are read only when Prometheus scrapes, through
a `Collector`: counting costs an integer add on the hot path, nothing more. `Histogram` is a
weighted histogram for the same reason (one bisect per observation, or per batch of equal
observations), exported as a Prometheus histogram.

Client metrics (`client_metrics()`) are process-wide and live in prometheus_client's default
registry, so any server built on walkit.Client exports them by serving `REGISTRY`.
The metric names are listed in docs/operations/metrics.md.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from walkit.errors import ConfigError
from walkit.futures import LightFuture

__all__ = ["Collector", "HttpEndpoint", "Histogram", "REGISTRY", "client_metrics", "replica_metrics", "LATENCY_BUCKETS"]

log = logging.getLogger(__name__)

#: Seconds: 100 µs .. 10 s, for request, sync and append latencies.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0)
#: Entries per journal sync (group commit size).
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)


class Histogram:
    """Histogram counts observations into fixed buckets; `observe(value, count)` adds `count` of them.

    It is not locked: one thread observes, and a scrape from another thread may see one
    observation half counted, which the next scrape corrects.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, buckets: Iterable[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """observe records `count` observations of `value`."""
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count

    @property
    def count(self) -> int:
        """count is the number of observations so far."""
        return sum(self.counts)

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        """family is the histogram as a Prometheus metric family (cumulative buckets)."""
        counts, cumulative, buckets = list(self.counts), 0, []
        for bound, n in zip(self.bounds, counts):
            cumulative += n
            buckets.append((repr(float(bound)), cumulative))
        buckets.append(("+Inf", cumulative + counts[-1]))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.sum)


class Collector:
    """Collector reads metric values from callables when Prometheus scrapes.

    Subclasses (or users) call `counter`, `gauge` and `histogram` once to declare each metric;
    a callable that raises or returns None leaves its metric out of that scrape.
    """

    def __init__(self) -> None:
        self._metrics: list[tuple[str, str, str, object]] = []

    def counter(self, name: str, documentation: str, value: Callable[[], float], labels: tuple[str, ...] = ()) -> None:
        """counter declares a monotonically growing value (name without the _total suffix).

        With `labels`, `value` returns {label values (a tuple): value} instead of a number.
        """
        self._metrics.append(("counter", name, documentation, (value, labels)))

    def gauge(self, name: str, documentation: str, value: Callable[[], float], labels: tuple[str, ...] = ()) -> None:
        """gauge declares a value that goes up and down.

        With `labels`, `value` returns {label values (a tuple): value} instead of a number.
        """
        self._metrics.append(("gauge", name, documentation, (value, labels)))

    def histogram(self, name: str, documentation: str, histogram: Histogram) -> None:
        """histogram declares a Histogram."""
        self._metrics.append(("histogram", name, documentation, histogram))

    def describe(self):
        return []          # families are only known at collect time; registration checks nothing

    def collect(self):
        for kind, name, documentation, source in self._metrics:
            if kind == "histogram":
                yield source.family(name, documentation)
                continue
            source, labels = source
            try:
                value = source()
            except Exception as exc:  # noqa: BLE001 - a broken metric must not break the scrape
                log.debug("metric %s unavailable: %s", name, exc)
                continue
            if value is None:
                continue
            if kind == "counter" and not labels:
                yield CounterMetricFamily(name, documentation, value=value)
            elif labels:
                family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, documentation,
                                                                                          labels=labels)
                for label_values, v in value.items():
                    family.add_metric(list(label_values), v)
                yield family
            else:
                yield GaugeMetricFamily(name, documentation, value=value)


class ClientMetrics(Collector):
    """ClientMetrics counts what this process's walkit clients append (ledgers and logs)."""

    def __init__(self) -> None:
        super().__init__()
        self.appends = 0
        self.failures = 0
        self.append_latency = Histogram()
        self.counter("walkit_client_appends", "Entries and records appended and acknowledged", lambda: self.appends)
        self.counter("walkit_client_append_failures", "Appends that failed", lambda: self.failures)
        self.histogram("walkit_client_append_latency_seconds",
                       "Time from append to acknowledgement, as the client saw it", self.append_latency)

    def future(self) -> "TimedFuture":
        """future is a new Future for an append that records its latency and outcome (the cheap way)."""
        return TimedFuture(self)

    def timed(self, future, count: int = 1) -> None:
        """timed records the latency and outcome of a future made elsewhere for `count` appends, when it completes.

        It costs a done-callback per future; appends whose Future this client makes use `future()`.
        """
        started = time.perf_counter()

        def done(f) -> None:
            if f.cancelled() or f.exception() is not None:
                self.failures += count
            else:
                self.appends += count
                self.append_latency.observe(time.perf_counter() - started)
        future.add_done_callback(done)


class TimedFuture(LightFuture):
    """TimedFuture is an append's Future that counts itself in ClientMetrics when it is resolved."""

    def __init__(self, metrics: ClientMetrics) -> None:
        super().__init__()
        self._metrics = metrics
        self._sent = time.perf_counter()

    def set_result(self, result) -> None:
        super().set_result(result)
        metrics = self._metrics
        metrics.appends += 1
        metrics.append_latency.observe(time.perf_counter() - self._sent)

    def set_exception(self, exception) -> None:
        super().set_exception(exception)
        self._metrics.failures += 1


class ReplicaMetrics(Collector):
    """ReplicaMetrics reports every walkit.replicate node of this process, labelled by machine name and node id."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: weakref.WeakSet = weakref.WeakSet()
        labels = ("name", "node")

        def each(value: Callable) -> Callable[[], dict]:
            return lambda: {(node.name, node.node_id): value(node) for node in list(self.nodes)}
        self.gauge("walkit_replicate_healthy", "1 while the node can go on (0: see its status for why)",
                   each(lambda node: int(node.health[0])), labels)
        self.gauge("walkit_replicate_leading", "1 while the node leads and takes submits",
                   each(lambda node: int(node.is_leader)), labels)
        self.gauge("walkit_replicate_in_trouble", "1 while the node retries a failure (its status says which)",
                   each(lambda node: int(node.trouble is not None)), labels)
        self.counter("walkit_replicate_troubles", "Failures the node retried (reading the log, appending)",
                     each(lambda node: node.troubles), labels)
        self.counter("walkit_replicate_records_applied", "Records applied to the state machine",
                     each(lambda node: node.records_applied), labels)


_replica_metrics: ReplicaMetrics | None = None


def replica_metrics() -> ReplicaMetrics:
    """replica_metrics returns the process's ReplicaMetrics, registered in the default REGISTRY."""
    global _replica_metrics
    if _replica_metrics is None:
        with _client_lock:
            if _replica_metrics is None:
                metrics = ReplicaMetrics()
                REGISTRY.register(metrics)
                _replica_metrics = metrics
    return _replica_metrics


def replicas_health() -> tuple[bool, str]:
    """replicas_health is an HttpEndpoint check: (False, why) if a walkit.replicate node of this process cannot go on."""
    for node in list(replica_metrics().nodes):
        healthy, why = node.health
        if not healthy:
            return False, f"replicated machine {node.name!r} (node {node.node_id}): {why}"
    return True, "ok"


_client_metrics: ClientMetrics | None = None
_client_lock = threading.Lock()


def client_metrics() -> ClientMetrics:
    """client_metrics returns the process's ClientMetrics, registered in the default REGISTRY."""
    global _client_metrics
    if _client_metrics is None:
        with _client_lock:
            if _client_metrics is None:
                metrics = ClientMetrics()
                REGISTRY.register(metrics)
                _client_metrics = metrics
    return _client_metrics


Check = Callable[[], tuple[bool, str]]


class HttpEndpoint:
    """HttpEndpoint serves GET /metrics (Prometheus text), /health and /ready on host:port.

    `registries` are exported one after the other. `health` and `ready` return (ok, text):
    200 with the text when ok, else 503. Port 0 picks a free port (see `address`). The server
    runs on daemon threads until `close()`; a bad request gets a 4xx and nothing else. With
    `tls` (an SSLContext, walkit.tls) it serves HTTPS only: each connection's handshake runs on
    its own thread, and one that fails or takes longer than HTTPS_TIMEOUT_S closes that
    connection only.
    """

    #: How long an HTTPS connection may stay silent (its handshake included) before it is closed.
    HTTPS_TIMEOUT_S = 10.0

    def __init__(self, host: str, port: int, registries: list, *, health: Check | None = None,
                 ready: Check | None = None, tls=None) -> None:
        checks = {"/health": health or (lambda: (True, "ok")), "/ready": ready or (lambda: (True, "ready"))}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body = b"".join(generate_latest(r) for r in registries)
                    self._reply(200, body, CONTENT_TYPE_LATEST)
                elif path in checks:
                    try:
                        ok, text = checks[path]()
                    except Exception as exc:  # noqa: BLE001 - report, never crash the server
                        ok, text = False, f"check failed: {exc}"
                    self._reply(200 if ok else 503, (text + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._reply(404, b"not found: try /metrics, /health or /ready\n", "text/plain; charset=utf-8")

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:
                pass                            # a failed handshake or a client gone: that connection only

        if tls is not None:
            Handler.timeout = self.HTTPS_TIMEOUT_S
        try:
            self._server = (ThreadingHTTPServer if tls is None else Server)((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True,
                                                  do_handshake_on_connect=False)
        self.scheme = "http" if tls is None else "https"
        self._server.daemon_threads = True
        self.address = f"{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="walkit-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """close stops serving and releases the port."""
        self._server.shutdown()
        self._server.server_close()


def new_registry(*collectors, process: bool = True) -> CollectorRegistry:
    """new_registry is a registry holding `collectors` (and the process's CPU/memory metrics)."""
    from prometheus_client import ProcessCollector
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    if process:
        ProcessCollector(registry=registry)
    return registry


def _disk_bytes(path: str | None) -> int | None:
    """_disk_bytes is the size of a storage's files: a file, a directory tree, or None without a path."""
    import os
    if not path:
        return None
    if os.path.isfile(path):
        return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except OSError:
                continue                     # removed by compaction meanwhile
    return total


class BookieMetrics(Collector):
    """BookieMetrics is a bookie's metrics: its service's counters and the serving loop's timings.

    The serving loop calls `round()` once per group-commit round; everything else is read from
    the server (`service` counters, `storage.path`, the read-only flag) at scrape time.
    `registry` holds this collector and the process's metrics; auto-recovery adds its own.
    """

    def __init__(self, server) -> None:
        super().__init__()
        service = server.service
        self.ledgers: int | None = None
        self.add_latency = Histogram()
        self.read_latency = Histogram()
        self.sync_latency = Histogram()
        self.sync_batch = Histogram(BATCH_BUCKETS)
        self.counter("walkit_bookie_adds", "Entries stored by adds", lambda: service.entries_stored)
        self.counter("walkit_bookie_add_requests", "Add requests answered", lambda: service.add_replies)
        self.counter("walkit_bookie_reads", "Entries returned by reads", lambda: service.entries_read)
        self.counter("walkit_bookie_read_requests", "Read and LAC read requests answered", lambda: service.read_replies)
        self.counter("walkit_bookie_written_bytes", "Bytes of entries written to storage", lambda: service.bytes_stored)
        self.counter("walkit_bookie_journal_syncs", "Storage syncs (group commits)", lambda: service.syncs)
        self.histogram("walkit_bookie_add_latency_seconds",
                       "Add request latency: from its round's start to the reply, sync included", self.add_latency)
        self.histogram("walkit_bookie_read_latency_seconds", "Read request latency in the bookie", self.read_latency)
        self.histogram("walkit_bookie_journal_sync_latency_seconds", "Time of one storage sync with its replies",
                       self.sync_latency)
        self.histogram("walkit_bookie_journal_sync_entries", "Entries made durable by one sync (group commit size)",
                       self.sync_batch)
        self.gauge("walkit_bookie_storage_bytes", "Bytes of the storage's files on disk",
                   lambda: _disk_bytes(getattr(server.storage, "path", None)))
        self.gauge("walkit_bookie_ledgers", "Ledgers stored on this bookie", lambda: self.ledgers)
        self.gauge("walkit_bookie_read_only", "1 while the bookie refuses adds (disk full or draining)",
                   lambda: int(service.read_only))
        self.gauge("walkit_bookie_draining", "1 while the bookie is being decommissioned",
                   lambda: int(server._draining))
        self.gauge("walkit_bookie_info", "Always 1; labels name the bookie",
                   lambda: {(server.address, server.config.rack): 1}, labels=("address", "rack"))
        self.registry = new_registry(self)

    def round(self, started: float, flushing: float, batch: int, adds: int, reads: int) -> None:
        """round records one serving round: it started at `started`, flushed from `flushing` until now."""
        if not (batch or adds or reads):
            return
        now = time.perf_counter()
        if batch:
            self.sync_latency.observe(now - flushing)
            self.sync_batch.observe(batch)
        if adds:
            self.add_latency.observe(now - started, adds)
        if reads:
            self.read_latency.observe(now - started, reads)
