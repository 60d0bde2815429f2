"""walkit.adapters.kv.service starts a whole `walkit kv serve`: cluster, RESP server and replicated node.

    run(ServeOptions(port=6380, data_dir="walkit-data"))      # until SIGTERM or Ctrl-C

Without `metadata` it runs an embedded LocalCluster (bookie processes under `data_dir`, which
exit on their own if this process dies); with a metadata URI it joins that cluster, and several
servers on one cluster elect one leader among themselves (walkit.replicate; the store `NAME` is
the replicated machine ``kv-NAME``, its log ``replicated-kv-NAME``).
"""

from __future__ import annotations

import asyncio
import signal
import ssl
from dataclasses import dataclass, field

import walkit
from walkit.adapters.kv import info
from walkit.adapters.kv.auth import Users
from walkit.adapters.kv.machine import KVMachine
from walkit.adapters.kv.server import KVServer
from walkit.advertise import advertised_address
from walkit.errors import WalkitError


#: Log entries a leader has appended and not yet seen acknowledged, at most. Fewer than
#: walkit.replicate's default make bigger entries, and on a machine short of CPU each entry costs
#: the bookies and the client far more than each record in it. Under 50 connections writing one
#: SET each (redis-benchmark -c 50): ~23 records per entry at 1, ~13 at 2, ~4 at 8; at 1, 13.1k
#: SETs/s against 9.9k at 2 (medians of 3 interleaved pairs; benchmarks/kv_bench.py, a 2-core VM).
#: With CPU to spare, more entries in flight may pay: each waits for the one before it to be
#: acknowledged here.
ENTRIES_IN_FLIGHT = 1
#: How long the next log entry may wait for the connections the last one answered (walkit.replicate's
#: `linger_ms`; the server submits with its connection as the submitter). Without it, 50
#: connections writing one SET each split into two groups that take turns, each waiting for the
#: other's entry: a SET took two round trips of the log. With it they share one entry: 15.5k,
#: 18.4k and 19.2k SETs/s against 11.8k, 11.7k and 13.2k (redis-benchmark -c 50, interleaved
#: pairs on a 2-core VM); -P 16 with 50 connections and with one not slower (41.3k against
#: 40.0k, 6.3k against 5.8k).
LINGER_MS = 2.0
#: How long start-up waits to say "serving" until the server leads (embedded) or is ready.
STARTUP_NOTICE_S = 30.0


@dataclass
class ServeOptions:
    """ServeOptions are the settings of `walkit kv serve` (see its --help)."""

    host: str = "127.0.0.1"
    port: int = 6380
    advertise: str | None = None
    data_dir: str = "walkit-data"
    metadata: str | None = None
    bookies: int = 3
    name: str = "default"
    snapshot_every: int = 100_000
    ensemble: int | None = None
    write_quorum: int | None = None
    ack_quorum: int | None = None
    roll_entries: int = 10_000
    password: str = ""
    users: Users = field(default_factory=Users, repr=False)
    tls: ssl.SSLContext | None = field(default=None, repr=False)   # walkit.tls.options_context

    def node_options(self) -> dict:
        """node_options are the walkit.replicate options of the store (the log's are used when it is created)."""
        top = self.bookies if self.metadata is None else 3
        ensemble = self.ensemble or min(3, top)
        write_quorum = self.write_quorum or min(2, ensemble)
        ack_quorum = self.ack_quorum or min(2, write_quorum)
        return {"ensemble": ensemble, "write_quorum": write_quorum, "ack_quorum": ack_quorum,
                "roll_entries": self.roll_entries, "snapshot_every_records": self.snapshot_every,
                "password": self.password, "max_entries_in_flight": ENTRIES_IN_FLIGHT,
                "linger_ms": LINGER_MS}


def run(options: ServeOptions, echo=print) -> int:
    """run serves until SIGTERM/SIGINT and returns the exit status (1 if the node failed)."""
    cluster = None
    metadata = options.metadata
    if metadata is not None:                        # an address nobody could dial stops it before anything starts
        _advertised(options, options.port or 1, metadata)
    if metadata is None:
        cluster = walkit.LocalCluster(bookies=options.bookies, data_dir=options.data_dir)
        metadata = cluster.metadata_url
        where = f"embedded cluster of {options.bookies} bookies under {cluster.data_dir}"
    else:
        from walkit.plugins.metadata.credentials import redact
        where = f"cluster {redact(metadata)}"
    try:
        return asyncio.run(_serve(options, metadata, where, echo))
    finally:
        if cluster is not None:
            cluster.close()


def _advertised(options: ServeOptions, port: int, metadata: str) -> str:
    """_advertised is the address other servers and clients are told (walkit.advertise's rules)."""
    return advertised_address(options.host, port, options.advertise, metadata, what="the KV server")


def start_node(server: KVServer, client, *, name: str, node_id: str, **options):
    """start_node replicates the server's machine as node `node_id` of store `name` and serves it.

    `options` are walkit.replicate's (ServeOptions.node_options). It returns the started node;
    until it is ready the server answers LOADING.
    """
    node = walkit.replicate(server.machine, client=client, name=f"kv-{name}", node_id=node_id,
                            on_role=server.role_changed, **options)
    server.node = node
    return node


async def _serve(options: ServeOptions, metadata: str, where: str, echo) -> int:
    loop = asyncio.get_running_loop()
    server = KVServer(KVMachine(), loop, host=options.host, port=options.port, cluster=metadata,
                      snapshot_every=options.snapshot_every, users=options.users, tls=options.tls)
    await server.start()
    address = _advertised(options, server.port, metadata)
    client = await loop.run_in_executor(None, walkit.Client, metadata)
    _warn_about_old_log(client, options.name, echo)
    node = start_node(server, client, name=options.name, node_id=address, **options.node_options())
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Say "serving" once it does: an embedded cluster has this one server, which will lead (it
    # waits for the registration of a killed predecessor to expire first); others once ready.
    serving = (lambda: node.is_leader) if options.metadata is None else (lambda: node.ready)
    deadline = loop.time() + STARTUP_NOTICE_S
    while not serving() and not stop.is_set() and node.failed is None and loop.time() < deadline:
        await asyncio.sleep(0.05)
    listening = f"{options.host}:{server.port}"
    echo(f"walkit kv: serving RESP{' over TLS' if options.tls is not None else ''} on {listening}{'' if address == listening else f' as {address}'} "
         f"(store {options.name!r}, {where}; {info.walkit_role(server)})")
    host = "" if options.host in ("127.0.0.1", "localhost") else f"-h {address.rpartition(':')[0]} "
    tls = " --tls --cacert CA.pem" if options.tls is not None else ""
    echo(f"connect with: redis-cli {host}-p {server.port}{tls}{_credentials_hint(options.users)}   "
         f"(or any Redis client; Ctrl-C stops the server)")
    while not stop.is_set() and node.failed is None:
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            pass
    echo("walkit kv: stopping")
    server.stop_listening()
    server.stopping = True
    await loop.run_in_executor(None, node.close)        # writes in flight are answered first
    await server.close()
    await loop.run_in_executor(None, client.close)
    if node.failed is not None:
        echo(f"walkit kv: the node failed: {type(node.failed).__name__}: {node.failed}")
        return 1
    return 0


def _credentials_hint(users: Users) -> str:
    """_credentials_hint is what redis-cli needs to log in (never a password: it asks for it)."""
    if not users.required:
        return ""
    return " --askpass" if users.default_enabled else " --user NAME --askpass"


def _warn_about_old_log(client, name: str, echo) -> None:
    """_warn_about_old_log says so when the cluster holds the log of a store written before walkit.replicate."""
    try:
        old = f"kv-{name}" in client.list_logs()
    except WalkitError:
        return
    if old:
        echo(f"walkit kv: note: log 'kv-{name}' was written by an earlier walkit kv (before walkit.replicate); "
             f"this version keeps store {name!r} in log 'replicated-kv-{name}' and does not read the old one")
