"""walkit.adapters.topics.service starts a whole `walkit topics serve`: cluster, broker and server.

    run(ServeOptions(port=9092, data_dir="walkit-data"))      # until SIGTERM or Ctrl-C

Without `metadata` it runs an embedded LocalCluster (bookie processes under `data_dir`,
which exit on their own if this process dies); with a metadata URI it joins that cluster,
and every broker on one cluster shares its topics, partitions and groups. With `sasl_users`
(a file, read again when it changes) or `sasl_user` (NAME:PASSWORD pairs) every connection
must authenticate with SASL PLAIN or SCRAM (sasl.py); with `tls` the port speaks TLS only
(walkit.tls). Brokers share state only through walkit logs, never connect to each other, so
each broker needs only the users its clients log in as.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from dataclasses import dataclass, field

import walkit
from walkit.adapters.topics.broker import Broker, BrokerSettings
from walkit.advertise import advertised_address, split_host_port
from walkit.adapters.topics.catalog import BrokerInfo, Catalog
from walkit.adapters.topics.sasl import MECHANISMS, Users, UsersFile, file_is_private
from walkit.adapters.topics.server import KafkaServer

log = logging.getLogger("walkit.adapters.topics")


@dataclass
class ServeOptions:
    """ServeOptions are the settings of `walkit topics serve` (see its --help)."""

    host: str = "127.0.0.1"
    port: int = 9092
    advertise: str | None = None
    data_dir: str = "walkit-data"
    metadata: str | None = None
    bookies: int = 3
    broker_id: int | None = None
    partitions: int = 1
    auto_create: bool = True
    ensemble: int | None = None
    write_quorum: int | None = None
    ack_quorum: int | None = None
    cache_mb: float = 32
    retention_check_ms: int = 5000
    snapshot_every: int = 10_000
    rebalance_delay_ms: int = 1000
    offsets_retention_minutes: float = BrokerSettings.offsets_retention_ms / 60_000
    group_buckets: int | None = None                                # None: the cluster's (16 for a new one)
    transactional_id_expiration_ms: int = BrokerSettings.transactional_id_expiration_ms
    max_message_bytes: int = BrokerSettings.max_message_bytes
    max_request_bytes: int = BrokerSettings.max_request_bytes
    password: str = field(default="", repr=False)
    sasl_users: str | None = None                                   # a users file (sasl.Users.parse)
    sasl_user: tuple[str, ...] = field(default=(), repr=False)      # NAME:PASSWORD pairs
    tls: ssl.SSLContext | None = field(default=None, repr=False)   # walkit.tls.options_context

    def users(self) -> Users | UsersFile | None:
        """users are the SASL users, None when neither --sasl-users nor --sasl-user is given; with a
        file, a UsersFile: the broker reads it again when it changes."""
        if not self.sasl_users and not self.sasl_user:
            return None
        if not self.sasl_users:
            return Users.load(None, self.sasl_user)
        if not file_is_private(self.sasl_users):
            log.warning("the SASL users file %s is readable by other users (chmod 600 it)", self.sasl_users)
        return UsersFile(self.sasl_users, self.sasl_user)

    def settings(self) -> BrokerSettings:
        """settings are the broker's tunables derived from the options."""
        top = self.bookies if self.metadata is None else 3
        ensemble = self.ensemble or min(3, top)
        write_quorum = self.write_quorum or min(2, ensemble)
        ack_quorum = self.ack_quorum or min(2, write_quorum)
        return BrokerSettings(auto_create_topics=self.auto_create, default_partitions=self.partitions,
                              cache_bytes=int(self.cache_mb * 1024 * 1024), retention_check_ms=self.retention_check_ms,
                              snapshot_every=self.snapshot_every, max_message_bytes=self.max_message_bytes,
                              max_request_bytes=self.max_request_bytes,
                              initial_rebalance_delay_ms=self.rebalance_delay_ms,
                              offsets_retention_ms=int(self.offsets_retention_minutes * 60_000),
                              group_buckets=self.group_buckets, ensemble=ensemble,
                              transactional_id_expiration_ms=self.transactional_id_expiration_ms,
                              write_quorum=write_quorum, ack_quorum=ack_quorum)


def run(options: ServeOptions, echo=print) -> int:
    """run serves until SIGTERM/SIGINT and returns the exit status."""
    users = options.users()                         # a bad users file stops here, before any bookie starts
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
        return asyncio.run(_serve(options, metadata, where, echo, users))
    finally:
        if cluster is not None:
            cluster.close()


def _advertised(options: ServeOptions, port: int, metadata: str) -> tuple[str, int]:
    """_advertised is the (host, port) clients are told in metadata answers (walkit.advertise's rules)."""
    host, advertised_port = split_host_port(
        advertised_address(options.host, port, options.advertise, metadata, what="the topics broker"))
    return host, advertised_port


async def start_broker(options: ServeOptions, client,
                       users: Users | UsersFile | None = None) -> tuple[Broker, KafkaServer]:
    """start_broker listens, registers a broker on `client`'s cluster and starts serving (`users`: SASL/PLAIN)."""
    loop = asyncio.get_running_loop()
    settings = options.settings()
    server = KafkaServer(loop, host=options.host, port=options.port, max_request_bytes=settings.max_request_bytes,
                         users=users, tls=options.tls)
    await server.start()
    broker_id = options.broker_id
    if broker_id is None:
        broker_id = await loop.run_in_executor(None, Catalog(client.store).new_broker_id)
    host, port = _advertised(options, server.port, client.metadata_url)
    broker = Broker(loop, client, BrokerInfo(broker_id, host, port), settings, password=options.password.encode())
    await broker.start()
    server.broker = broker
    return broker, server


async def _serve(options: ServeOptions, metadata: str, where: str, echo, users: Users | UsersFile | None) -> int:
    loop = asyncio.get_running_loop()
    client = walkit.Client(metadata)
    try:
        broker, server = await start_broker(options, client, users)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        protocol = server.security_protocol
        echo(f"walkit topics: broker {broker.id} serving the Kafka protocol ({protocol}) on {options.host}:"
             f"{server.port} as {broker.info.host}:{broker.info.port} ({where})")
        tls = " -X ssl.ca.location=CA.pem" if server.tls is not None else ""
        if server.users is None:
            echo(f"try: kcat -b 127.0.0.1:{server.port} -X security.protocol={protocol}{tls} -L   "
                 f"(Ctrl-C stops the broker)")
        else:
            echo(f"SASL required (users: {', '.join(server.users.names)}; mechanisms: "
                 f"{', '.join(MECHANISMS)}); try: kcat -b 127.0.0.1:{server.port} -X security.protocol={protocol}"
                 f"{tls} -X sasl.mechanisms=SCRAM-SHA-256 -X sasl.username=NAME -X sasl.password=PASSWORD -L")
        await stop.wait()
        echo("walkit topics: stopping")
        await server.close()
        await broker.stop()
        return 0
    finally:
        await loop.run_in_executor(None, client.close)
