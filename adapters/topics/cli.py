"""walkit.adapters.topics.cli is `walkit topics`: the Kafka-compatible broker and commands that talk to it.

`serve` runs a broker (walkit.adapters.topics). The other commands are Kafka clients
(kafka-python) of a running broker, given by --bootstrap HOST:PORT (or WALKIT_BOOTSTRAP), logging
in with SASL when a user is given (WALKIT_SASL_USERNAME, WALKIT_SASL_PASSWORD, and
WALKIT_SASL_MECHANISM: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512), over TLS when asked
(WALKIT_CLIENT_TLS_CA, WALKIT_CLIENT_TLS_CERT, WALKIT_CLIENT_TLS_KEY, ...): see client_options.
"""

from __future__ import annotations

import functools
import json
import logging
import sys

import click

from walkit.adapters.topics.credentials import (
    MECHANISMS, BadCredentials, BrokerCredentials, LoginRefused, check_login, sasl_refused,
)
from walkit.tls import tls_options


#: How long a command tries to reach (and log in to) the broker before it gives up.
BOOTSTRAP_TIMEOUT_MS = 10_000


def client_options(fn):
    """client_options gives a client command --bootstrap, the SASL login and client TLS (credentials.py).

    The command gets `kafka`, kafka-python's settings, once check_login reached the broker and
    logged in (or found nothing listening, left to kafka-python's retries); errors end the command
    with one line (_kafka_errors). The TLS variables are WALKIT_CLIENT_TLS_*, never the server's
    WALKIT_TLS_*: a command run where a broker runs must not take the broker's certificate as its own.
    """
    @click.option("--bootstrap", "-b", envvar="WALKIT_BOOTSTRAP", default="127.0.0.1:9092", show_default=True,
                  metavar="HOST:PORT", help="A broker of the cluster (walkit topics serve) [env WALKIT_BOOTSTRAP].")
    @click.option("--sasl-username", envvar="WALKIT_SASL_USERNAME", default=None, metavar="NAME",
                  help="Log in with SASL as NAME, to a broker started with --sasl-users or --sasl-user "
                       "[env WALKIT_SASL_USERNAME].")
    @click.option("--sasl-password", envvar="WALKIT_SASL_PASSWORD", default=None, metavar="PASSWORD",
                  help="The SASL password [env WALKIT_SASL_PASSWORD: prefer it, command lines are visible to "
                       "other local users].")
    @click.option("--sasl-mechanism", envvar="WALKIT_SASL_MECHANISM", default=None, metavar="MECHANISM",
                  type=click.Choice(MECHANISMS, case_sensitive=False),
                  help="How to log in: PLAIN sends the password (use it over TLS), SCRAM-SHA-256 and "
                       "SCRAM-SHA-512 prove it without sending it [default: PLAIN] [env WALKIT_SASL_MECHANISM].")
    @click.option("--tls", is_flag=True, envvar="WALKIT_CLIENT_TLS",
                  help="Connect over TLS (a broker started with --tls-cert), checking its certificate against the "
                       "system's CAs; implied by --tls-ca, --tls-cert and --tls-key [env WALKIT_CLIENT_TLS=1].")
    @click.option("--tls-ca", envvar="WALKIT_CLIENT_TLS_CA", default=None, metavar="FILE",
                  help="Connect over TLS and accept only a broker certificate signed by the CA certificates of "
                       "FILE (PEM) that names the --bootstrap host [env WALKIT_CLIENT_TLS_CA].")
    @click.option("--tls-cert", envvar="WALKIT_CLIENT_TLS_CERT", default=None, metavar="FILE",
                  help="Connect over TLS and present this client certificate (PEM), for a broker started with "
                       "--tls-ca [env WALKIT_CLIENT_TLS_CERT].")
    @click.option("--tls-key", envvar="WALKIT_CLIENT_TLS_KEY", default=None, metavar="FILE",
                  help="The private key of --tls-cert (PEM) [default: in the certificate's file] "
                       "[env WALKIT_CLIENT_TLS_KEY].")
    @click.option("--tls-key-password", envvar="WALKIT_CLIENT_TLS_KEY_PASSWORD", default=None, metavar="PASSWORD",
                  help="The password of an encrypted --tls-key [env WALKIT_CLIENT_TLS_KEY_PASSWORD: prefer it].")
    @functools.wraps(fn)
    @_kafka_errors
    def wrapper(*args, bootstrap, sasl_username, sasl_password, sasl_mechanism, tls, tls_ca, tls_cert, tls_key,
                tls_key_password, **kwargs):
        try:
            credentials = BrokerCredentials.parse(bootstrap, sasl_mechanism=sasl_mechanism,
                                                  sasl_username=sasl_username, sasl_password=sasl_password,
                                                  tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                                                  tls_key_password=tls_key_password)
        except BadCredentials as exc:
            raise click.UsageError(str(exc)) from None
        try:
            check_login(credentials)
        except LoginRefused as exc:
            raise click.ClickException(str(exc)) from None
        kafka = {**credentials.kafka_settings(), "bootstrap_timeout_ms": BOOTSTRAP_TIMEOUT_MS}
        return fn(*args, kafka=kafka, **kwargs)
    return wrapper


def _parse_configs(values: tuple[str, ...]) -> dict[str, str]:
    configs = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r}: use NAME=VALUE, e.g. retention.ms=60000", param_hint="--config")
        configs[name] = value
    return configs


class _SaslRefusal(logging.Handler):
    """_SaslRefusal remembers the broker's answer to a refused SASL login, which kafka-python only logs and retries."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "SaslAuthenticationFailedError" in text and self.message is None:
            self.message = text.rpartition("SaslAuthenticationFailedError: ")[2].partition(" (backoff")[0].rstrip(")")


def _kafka_errors(fn):
    """_kafka_errors turns Kafka client errors, and a missing kafka-python, into one-line messages.

    A refused SASL login that check_login did not meet first (client_options) is retried by
    kafka-python until its bootstrap timeout and then reported as "Unable to bootstrap"; the
    message names the refusal instead. kafka-python's own log lines (a warning per retry) are
    shown only with -v.
    """
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            from kafka.errors import KafkaError
        except ImportError:
            raise click.ClickException("walkit topics needs kafka-python: pip install 'walkit[topics]'") from None
        refusal, kafka_log = _SaslRefusal(), logging.getLogger("kafka")
        kafka_log.addHandler(refusal)
        kafka_log.propagate = logging.getLogger().level <= logging.INFO
        try:
            return fn(*args, **kwargs)
        except KafkaError as exc:
            if refusal.message:
                raise click.ClickException(sasl_refused(refusal.message)) from None
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
        finally:
            kafka_log.removeHandler(refusal)
            kafka_log.propagate = True
    return wrapper


@click.group(name="topics")
def topics() -> None:
    """Kafka-compatible topics: a broker storing partitions as walkit logs, and its tools.

    Start a broker with `walkit topics serve`; kafka-python, confluent-kafka and kcat work
    against it unchanged (e.g. `kcat -b 127.0.0.1:9092 -L`).
    """


@topics.command()
@click.option("--port", type=int, default=9092, show_default=True, help="Kafka port (0 picks a free one).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--advertise", default=None, metavar="HOST:PORT",
              help="Address clients are told to use for this broker [default: HOST:PORT].")
@click.option("--data-dir", default="walkit-data", show_default=True,
              help="Where the embedded cluster keeps its data (without --metadata).")
@click.option("--metadata", envvar="WALKIT_METADATA", default=None, metavar="URI",
              help="Join the cluster of this metadata store instead of running an embedded one; brokers "
                   "on one cluster share its topics [env WALKIT_METADATA].")
@click.option("--bookies", type=int, default=3, show_default=True, help="Bookies of the embedded cluster.")
@click.option("--broker-id", type=int, default=None, help="Kafka broker id [default: a new one from the cluster].")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Partitions of topics created automatically (on first use).")
@click.option("--auto-create/--no-auto-create", default=True, show_default=True,
              help="Create unknown topics when a client asks for them (Kafka's auto.create.topics.enable).")
@click.option("--ensemble", "-e", type=int, default=None, help="Ensemble of the partitions' ledgers [default: 3].")
@click.option("--write-quorum", "-w", type=int, default=None, help="Write quorum [default: 2].")
@click.option("--ack-quorum", "-a", type=int, default=None,
              help="Ack quorum: a produce (acks=1 or all) is answered once this many bookies hold it [default: 2].")
@click.option("--cache-mb", type=click.FloatRange(min=0), default=32, show_default=True,
              help="Recent batches kept in memory per partition this broker leads (at least one; 1 MiB at "
                   "most for those it follows), so tailing consumers skip the bookies; older offsets are "
                   "read from the log.")
@click.option("--retention-check-ms", type=click.IntRange(min=100), default=5000, show_default=True,
              help="How often retention.ms and retention.bytes are applied.")
@click.option("--snapshot-every", type=click.IntRange(min=0), default=10_000, show_default=True,
              help="Write a partition's state (offset index, producer sequences) to a snapshot ledger every "
                   "N batches, so a restarted broker replays only the log after it (0: never).")
@click.option("--rebalance-delay-ms", type=click.IntRange(min=0), default=1000, show_default=True,
              help="How long a new group waits for more members before its first rebalance "
                   "(Kafka's group.initial.rebalance.delay.ms).")
@click.option("--offsets-retention-minutes", type=click.FloatRange(min=0, min_open=True), default=10080,
              show_default=True,
              help="Committed offsets of a group expire once it has had no members for this long and they were "
                   "not committed again meanwhile (Kafka's offsets.retention.minutes: 7 days); checked every "
                   "--retention-check-ms.")
@click.option("--transactional-id-expiration-ms", type=click.IntRange(min=1), default=604_800_000,
              show_default=True,
              help="A transactional id without a transaction for this long is removed; its next producer gets a "
                   "new producer id (Kafka's transactional.id.expiration.ms: 7 days).")
@click.option("--group-buckets", type=click.IntRange(min=1, max=10_000), default=None,
              help="Buckets of consumer groups, each a replicated machine with its own coordinator (Kafka's "
                   "offsets.topic.num.partitions), recorded by a new cluster's first broker [default: the "
                   "cluster's; 16 for a new cluster]. A broker given another count than the cluster's refuses "
                   "to start: committed offsets are placed by it.")
@click.option("--max-message-bytes", type=click.IntRange(min=1), default=1048588, show_default=True,
              help="Largest record batch of topics that do not set max.message.bytes (Kafka's message.max.bytes); "
                   "at most 62914551, what one log entry holds. Larger batches get MESSAGE_TOO_LARGE: refused, "
                   "not split.")
@click.option("--max-request-bytes", type=click.IntRange(min=1024), default=100 * 1024 * 1024, show_default=True,
              help="Largest request a client may send; a connection sending more is closed "
                   "(Kafka's socket.request.max.bytes).")
@click.option("--password", default="", help="Password of the partitions' ledgers.")
@click.option("--sasl-users", envvar="WALKIT_SASL_USERS", default=None, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False),
              help="Require SASL/PLAIN with the users of FILE: USER:PASSWORD lines, or a Kafka JAAS file's "
                   "user_NAME=\"PASSWORD\" entries [env WALKIT_SASL_USERS].")
@click.option("--sasl-user", multiple=True, envvar="WALKIT_SASL_USER", metavar="NAME:PASSWORD",
              help="Require SASL/PLAIN and accept this user, repeatable (with --sasl-users: added to the file's, "
                   "winning over it) [env WALKIT_SASL_USER, space-separated]. Other local users can see command "
                   "lines: prefer the file.")
@click.option("--http-port", type=int, default=None,
              help="Serve Prometheus /metrics (the broker's appends to its logs: counts, failures, latency), "
                   "/health and /ready on this port (0: a free one) [default: off].")
@tls_options
@click.option("--http-tls", is_flag=True,
              help="Serve --http-port over HTTPS only, with --tls-cert (and --tls-ca: client certificates).")
@_kafka_errors
def serve(http_port, http_tls, tls_cert, tls_key, tls_ca, **options) -> None:
    """Serve the Kafka protocol from walkit logs until Ctrl-C.

    Each topic partition is a walkit log; record batches are stored as producers sent them,
    with dense offsets. Several brokers on one cluster (--metadata URI) each keep every
    partition's state (walkit.replicate): one leads each partition and group coordinator, the
    others follow, and a dead broker's partitions move within seconds.

    Example: walkit topics serve, then: echo hello | kcat -b 127.0.0.1:9092 -t greetings -P

    With --sasl-users or --sasl-user every client must log in with SASL (sasl.mechanism PLAIN,
    SCRAM-SHA-256 or SCRAM-SHA-512; security.protocol=SASL_PLAINTEXT). With --tls-cert the port
    speaks TLS only: security.protocol=SSL, or SASL_SSL with users.
    """
    from walkit.adapters.topics.sasl import BadUsers
    from walkit.adapters.topics.service import ServeOptions, run
    from walkit.errors import WalkitError
    from walkit.tls import BadTls, options_context
    logging.getLogger("walkit.adapters.topics").setLevel(min(logging.getLogger().level, logging.INFO))
    endpoint = None
    try:
        options["tls"] = options_context(tls_cert, tls_key, tls_ca)
        if http_tls and options["tls"] is None:
            raise BadTls("--http-tls needs --tls-cert")
    except BadTls as exc:
        raise click.UsageError(str(exc)) from None
    try:
        if http_port is not None:
            from walkit.metrics import REGISTRY, HttpEndpoint, replicas_health
            endpoint = HttpEndpoint(options["host"], http_port, [REGISTRY], health=replicas_health,
                                    tls=options["tls"] if http_tls else None)
            click.echo(f"metrics on {endpoint.scheme}://{endpoint.address}/metrics", err=True)
        status = run(ServeOptions(**options), echo=lambda line: click.echo(line, err=True))
    except BadUsers as exc:
        raise click.ClickException(str(exc)) from None
    except (WalkitError, OSError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    finally:
        if endpoint is not None:
            endpoint.close()
    sys.exit(status)


@topics.group()
def users() -> None:
    """Manage the SASL users file of `walkit topics serve --sasl-users FILE`.

    `add` stores a user's SCRAM-SHA-256 and SCRAM-SHA-512 credentials (salt, iterations,
    StoredKey, ServerKey: never the password); the user can then log in with either SCRAM
    mechanism or PLAIN. A running broker reads the file again within a second of a change: new
    connections log in as it says, connections logged in already stay.
    """


_USERS_FILE = click.option("--file", "-f", "path", envvar="WALKIT_SASL_USERS", required=True, metavar="FILE",
                           type=click.Path(dir_okay=False), help="The users file [env WALKIT_SASL_USERS].")


@users.command(name="add")
@_USERS_FILE
@click.argument("name")
@click.option("--password", envvar="WALKIT_SASL_PASSWORD", prompt=True, hide_input=True, confirmation_prompt=True,
              help="The password [default: asked for] [env WALKIT_SASL_PASSWORD].")
@click.option("--mechanism", "mechanisms", multiple=True, type=click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512"]),
              help="Store credentials for this mechanism only, repeatable [default: both].")
def users_add(path, name, password, mechanisms) -> None:
    """Add user NAME to the users FILE, or change its password (FILE is created, mode 0600)."""
    from walkit.adapters.topics.sasl import BadUsers, edit_users_file
    try:
        had = edit_users_file(path, name, password, mechanisms or ("SCRAM-SHA-256", "SCRAM-SHA-512"))
    except BadUsers as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"{'changed' if had else 'added'} user {name} in {path}")


@users.command(name="remove")
@_USERS_FILE
@click.argument("name")
def users_remove(path, name) -> None:
    """Remove user NAME (every line of it) from the users FILE."""
    from walkit.adapters.topics.sasl import BadUsers, edit_users_file
    try:
        had = edit_users_file(path, name, None)
    except BadUsers as exc:
        raise click.UsageError(str(exc)) from None
    if not had:
        raise click.ClickException(f"no user {name} in {path}")
    click.echo(f"removed user {name} from {path}")


@users.command(name="list")
@_USERS_FILE
def users_list(path) -> None:
    """List the users of the users FILE, each with the mechanisms it can log in with."""
    from walkit.adapters.topics.sasl import BadUsers, Users
    try:
        found = Users.load(path)
    except BadUsers as exc:
        raise click.ClickException(str(exc)) from None
    for name in found.names:
        mechanisms = [m for m in ("SCRAM-SHA-256", "SCRAM-SHA-512") if found.credential(name, m) is not None]
        click.echo(f"{name}\t{' '.join(['PLAIN', *mechanisms])}")


def _admin(kafka: dict):
    from kafka import KafkaAdminClient
    return KafkaAdminClient(**kafka, client_id="walkit-topics", request_timeout_ms=30000)


@topics.command()
@client_options
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(min=1), default=1, show_default=True, help="Partitions.")
@click.option("--config", "-c", "configs", multiple=True, metavar="NAME=VALUE",
              help="Topic config, repeatable: retention.ms, retention.bytes, segment.ms, segment.bytes, "
                   "max.message.bytes.")
def create(kafka, name, partitions, configs) -> None:
    """Create topic NAME (its partitions get leaders before this returns).

    Example: walkit topics create orders -p 6 -c retention.ms=86400000
    """
    from kafka.admin import NewTopic
    admin = _admin(kafka)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=_parse_configs(configs))], timeout_ms=15000)
    finally:
        admin.close()
    click.echo(f"created topic {name} with {partitions} partition{'s' if partitions != 1 else ''}")


@topics.command(name="list")
@client_options
def list_topics(kafka) -> None:
    """List the topics."""
    admin = _admin(kafka)
    try:
        for name in sorted(admin.list_topics()):
            click.echo(name)
    finally:
        admin.close()


@topics.command()
@client_options
@click.argument("name")
def describe(kafka, name) -> None:
    """Describe topic NAME: configs, and per partition its leader and offsets."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import ConfigResource
    admin = _admin(kafka)
    try:
        found = admin.describe_topics([name])[0]
        if found["error_code"]:
            raise click.ClickException(f"topic {name!r}: error {found['error_code']}")
        configs = admin.describe_configs([ConfigResource("TOPIC", name)])
    finally:
        admin.close()
    click.echo(f"topic {name}\tpartitions {len(found['partitions'])}\tid {found['topic_id']}")
    for key, value in sorted(configs.get("topic", {}).get(name, {}).items()):
        click.echo(f"  {key}={value['value']}{'' if value['config_source'] == 'DEFAULT_CONFIG' else '  (set)'}")
    consumer = KafkaConsumer(**kafka, client_id="walkit-topics", enable_auto_commit=False)
    try:
        parts = [TopicPartition(name, p["partition_index"]) for p in found["partitions"]]
        first, last = consumer.beginning_offsets(parts), consumer.end_offsets(parts)
    finally:
        consumer.close()
    for p, tp in zip(found["partitions"], parts):
        click.echo(f"  partition {tp.partition}\tleader {p['leader_id']}\toffsets {first[tp]}..{last[tp]}")


@topics.command()
@client_options
@click.argument("name")
def delete(kafka, name) -> None:
    """Delete topic NAME and its partitions' logs."""
    admin = _admin(kafka)
    try:
        admin.delete_topics([name], timeout_ms=15000)
    finally:
        admin.close()
    click.echo(f"deleted topic {name}")


@topics.command()
@client_options
@click.argument("topic")
@click.argument("values", nargs=-1)
@click.option("--key", "-k", default=None, help="Key of every record (murmur2 picks its partition, as in Kafka).")
@click.option("--key-separator", "-K", default=None, metavar="SEP",
              help="Split each value at the first SEP into key and value (like kcat -K).")
@click.option("--partition", type=int, default=None, help="Write to this partition.")
@click.option("--acks", type=click.Choice(["0", "1", "all"]), default="all", show_default=True)
def produce(kafka, topic, values, key, key_separator, partition, acks) -> None:
    """Append VALUES (or, without any, each line of stdin) to TOPIC, idempotently.

    Example: printf 'a:1\\nb:2\\n' | walkit topics produce orders -K:
    """
    from kafka import KafkaProducer
    producer = KafkaProducer(**kafka, acks=acks if acks == "all" else int(acks),
                             enable_idempotence=acks == "all", client_id="walkit-topics")
    lines = values or (line.rstrip("\n") for line in sys.stdin)
    futures = []
    try:
        for line in lines:
            record_key = key
            if key_separator is not None and key_separator in line:
                record_key, line = line.split(key_separator, 1)
            futures.append(producer.send(topic, value=line.encode(), partition=partition,
                                         key=record_key.encode() if record_key is not None else None))
        producer.flush()
        if acks != "0":
            for future in futures:
                future.get(timeout=30)
    finally:
        producer.close()
    click.echo(f"produced {len(futures)} record{'s' if len(futures) != 1 else ''} to {topic}", err=True)


@topics.command()
@client_options
@click.argument("topic")
@click.option("--group", "-g", default=None, help="Consume as a member of this group and commit offsets.")
@click.option("--from-beginning", is_flag=True, help="Without committed offsets, start at the earliest offset.")
@click.option("--count", "-n", type=int, default=None, help="Stop after this many records.")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Stop after this many seconds without a record [default: never].")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: partition:offset, key and value separated by tabs; json: one object per line.")
def consume(kafka, topic, group, from_beginning, count, timeout_s, fmt) -> None:
    """Print the records of TOPIC as they arrive (Ctrl-C stops)."""
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(topic, **kafka, group_id=group, client_id="walkit-topics",
                             auto_offset_reset="earliest" if from_beginning else "latest",
                             enable_auto_commit=group is not None,
                             consumer_timeout_ms=int(timeout_s * 1000) if timeout_s else float("inf"))
    seen = 0
    try:
        for message in consumer:
            key = message.key.decode("utf-8", "backslashreplace") if message.key is not None else None
            value = message.value.decode("utf-8", "backslashreplace") if message.value is not None else None
            if fmt == "json":
                click.echo(json.dumps({"partition": message.partition, "offset": message.offset, "key": key,
                                       "value": value, "timestamp": message.timestamp}))
            else:
                click.echo(f"{message.partition}:{message.offset}\t{key or ''}\t{value or ''}")
            seen += 1
            if count is not None and seen >= count:
                break
        if group is not None:
            consumer.commit()
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


@topics.command()
@client_options
@click.argument("group", required=False)
def groups(kafka, group) -> None:
    """List consumer groups, or show GROUP: state, members, committed offsets and lag."""
    from kafka import KafkaConsumer
    admin = _admin(kafka)
    try:
        if group is None:
            for found in sorted(admin.list_groups(), key=lambda g: g["group_id"]):
                click.echo(f"{found['group_id']}\t{found['group_state']}")
            return
        described = admin.describe_groups([group])[group]
        committed = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    click.echo(f"group {group}\tstate {described['group_state']}\tprotocol {described['protocol_data'] or '-'}")
    for member in described["members"]:
        click.echo(f"  member {member['member_id']}\tclient {member['client_id']}\thost {member['client_host']}")
    consumer = KafkaConsumer(**kafka, client_id="walkit-topics", enable_auto_commit=False)
    try:
        ends = consumer.end_offsets(list(committed)) if committed else {}
    finally:
        consumer.close()
    for tp, offset in sorted(committed.items()):
        end = ends.get(tp)
        lag = end - offset.offset if end is not None and offset.offset >= 0 else "?"
        click.echo(f"  {tp.topic}:{tp.partition}\tcommitted {offset.offset}\tend {end}\tlag {lag}")
