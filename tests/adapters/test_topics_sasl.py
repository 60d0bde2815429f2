"""SASL/PLAIN on `walkit topics serve` (issue 17): the real clients log in, nothing else gets in.

The unit tests drive `SaslGate` and `Users` without I/O. The process tests start one broker
with a users file (mode 0600) plus one `--sasl-user`, and log in with confluent-kafka
(librdkafka), kafka-python and kcat; wrong passwords, unknown users and clients that do not
log in are refused, and the broker keeps serving. The seeded fuzz sends hostile SASL
exchanges (and, on logged-in connections, hostile requests) and then checks a real client
still works.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest

from walkit.adapters.topics import errors
from walkit.adapters.topics.sasl import (
    INVALID_CREDENTIALS, MAX_UNAUTHENTICATED_FRAME, BadUsers, Reply, SaslGate, Users, check_plain,
)
from tests.support.kafka_fuzz import HostileClient, HostileRequests, KafkaWire, encode, framed, plain_token

from tests.support.serverprocess import TopicsProcess, kcat, read_to_end

ALICE = ("alice", "alice:has a colon")
BOB = ("bob", "bob-secret")
FUZZ_SEED = int(os.environ.get("WALKIT_FUZZ_SEED", "20261122"))
SASL_FUZZ_REQUESTS = 20_000


# -- the gate, without I/O -----------------------------------------------------------------------

def users() -> Users:
    return Users({"alice": ALICE[1], "bob": BOB[1]})


def test_users_read_lines_and_jaas_files_and_refuse_bad_ones_without_echoing_passwords(tmp_path):
    assert Users.parse("# users\nalice:pa:ss\n\n bob :x\n") == {"alice": "pa:ss", "bob": "x"}
    jaas = ('KafkaServer { org.apache.kafka.common.security.plain.PlainLoginModule required\n'
            'username="admin" password="admin-secret" user_admin="admin-secret" user_carol="c\\"q";\n};')
    assert Users.parse(jaas) == {"admin": "admin-secret", "carol": 'c"q'}
    for text in ("alice", "alice:", ":pw", "PlainLoginModule required;"):
        with pytest.raises(BadUsers) as caught:
            Users.parse(text)
        assert "pw" not in str(caught.value)
    path = tmp_path / "users"
    path.write_text("alice:from-file\nbob:b\n")
    loaded = Users.load(str(path), ("alice:from-flag",))
    assert loaded.names == ["alice", "bob"] and loaded.check("alice", b"from-flag")
    assert not loaded.check("alice", b"from-file") and "from" not in repr(loaded)
    with pytest.raises(BadUsers, match="cannot read the users file"):
        Users.load(str(tmp_path / "missing"))
    with pytest.raises(BadUsers, match="no user"):
        Users.load(None, ())


def test_plain_tokens_are_checked_as_kafkas_plain_server_does():
    accepted = users()
    assert check_plain(accepted, plain_token(*ALICE))[0] == "alice"
    assert check_plain(accepted, b"alice" + plain_token(*ALICE))[0] == "alice"
    refusals = {
        plain_token("alice", "Hunter2!"): INVALID_CREDENTIALS,
        plain_token("nobody", ALICE[1]): INVALID_CREDENTIALS,
        plain_token("", "x"): "Authentication failed: username not specified",
        plain_token("alice", ""): "Authentication failed: password not specified",
        b"only one token": "Invalid SASL/PLAIN response: expected 3 tokens, got 1",
        b"\x00\xff\xfe\x00pw": "Invalid SASL/PLAIN response: not UTF-8",
        b"bob" + plain_token(*ALICE): "Authentication failed: Client requested an authorization id that is "
                                          "different from username",
    }
    for token, message in refusals.items():
        user, told, reason = check_plain(accepted, token)
        assert user is None and told == message
        assert ALICE[1] not in reason and "Hunter2" not in reason


def test_the_gate_serves_api_versions_then_logs_in_and_refuses_anything_else():
    gate = SaslGate(users())
    served = gate.receive(encode(ApiVersionsRequest(version=0), 1))
    assert not isinstance(served, Reply) and served.api_key == ApiVersionsRequest.API_KEY
    handshake = gate.receive(encode(SaslHandshakeRequest(version=1, mechanism="PLAIN"), 2))
    assert isinstance(handshake, Reply) and handshake.close is None and gate.state == "authenticate"
    done = gate.receive(encode(SaslAuthenticateRequest(version=2, auth_bytes=plain_token(*BOB)), 3))
    assert done.close is None and gate.user == "bob"
    answer = SaslAuthenticateResponse.decode(done.answer[4:], version=2, header=True)
    assert answer.error_code == errors.NONE

    before = SaslGate(users())
    refused = before.receive(encode(MetadataRequest(version=1, topics=None), 1))
    assert refused.answer is None and "before authentication" in refused.close and before.user is None

    wrong = SaslGate(users())
    wrong.receive(encode(SaslHandshakeRequest(version=1, mechanism="PLAIN"), 1))
    failed = wrong.receive(encode(SaslAuthenticateRequest(version=1, auth_bytes=plain_token("bob", "x")), 2))
    assert failed.close and failed.delay > 0 and wrong.user is None
    told = SaslAuthenticateResponse.decode(failed.answer[4:], version=1, header=True)
    assert told.error_code == errors.SASL_AUTHENTICATION_FAILED and told.error_message == INVALID_CREDENTIALS

    kerberos = SaslGate(users())
    unsupported = kerberos.receive(encode(SaslHandshakeRequest(version=1, mechanism="GSSAPI"), 1))
    assert unsupported.close and unsupported.answer is not None

    bare = SaslGate(users())
    bare.receive(encode(SaslHandshakeRequest(version=0, mechanism="PLAIN"), 1))
    assert bare.state == "token"
    assert bare.receive(plain_token(*ALICE)).answer == b"\x00\x00\x00\x00" and bare.user == "alice"


# -- a real broker ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """broker is one `walkit topics serve` requiring SASL/PLAIN: alice from a 0600 file, bob from --sasl-user."""
    workdir = tmp_path_factory.mktemp("topics-sasl")
    users_file = workdir / "users"
    users_file.write_text(f"# walkit topics users\n{ALICE[0]}:{ALICE[1]}\n")
    users_file.chmod(0o600)
    process = TopicsProcess(workdir, data_dir=workdir / "data",
                            args=("--sasl-users", str(users_file), "--sasl-user", ":".join(BOB),
                                  "--rebalance-delay-ms", "0"))
    process.start()
    wait_logged_in(process)
    yield process
    process.stop()


def wait_logged_in(process: TopicsProcess) -> None:
    """wait_logged_in waits until the broker serves a logged-in Metadata request (its catalog is loaded)."""
    process.wait_ready()
    with KafkaWire(process.port) as wire:
        assert wire.login(*BOB) == errors.NONE
        wire.send(framed(encode(MetadataRequest(version=1, topics=None), 3)))
        assert wire.read_frame() is not None


def confluent_config(broker: TopicsProcess, user: str, password: str, **extra) -> dict:
    return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": password, **extra}


def python_config(user: str, password: str) -> dict:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
            "sasl_plain_username": user, "sasl_plain_password": password}


@pytest.mark.slow
def test_confluent_kafka_logs_in_with_plain_and_produces_and_consumes(broker):
    producer = Producer(confluent_config(broker, *ALICE, **{"acks": "all", "enable.idempotence": True}))
    delivered = []
    for i in range(100):
        producer.produce("secure-confluent", value=b"c%d" % i,
                         on_delivery=lambda error, message: delivered.append(error))
    assert producer.flush(30) == 0 and delivered == [None] * 100
    consumer = Consumer(confluent_config(broker, *BOB, **{"group.id": "secure-readers",
                                                          "auto.offset.reset": "earliest"}))
    consumer.subscribe(["secure-confluent"])
    values = []
    while len(values) < 100:
        message = consumer.poll(10)
        assert message is not None, f"only {len(values)} of 100 records arrived"
        assert message.error() is None, message.error()
        values.append(message.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert values == [b"c%d" % i for i in range(100)]
    assert "authenticated as SASL user 'alice'" in broker.log_tail(100_000)


@pytest.mark.slow
def test_kafka_python_logs_in_with_plain_and_produces_and_consumes(broker):
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", **python_config(*BOB))
    for i in range(50):
        producer.send("secure-python", value=b"p%d" % i)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer("secure-python", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             **python_config(*ALICE))
    values = [record.value for record in read_to_end(consumer)]
    consumer.close()
    assert values == [b"p%d" % i for i in range(50)]


@pytest.mark.slow
def test_kcat_logs_in_with_plain_and_produces_and_consumes(broker):
    login = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=PLAIN",
             "-X", f"sasl.username={ALICE[0]}", "-X", f"sasl.password={ALICE[1]}"]
    kcat("-b", broker.bootstrap, *login, "-t", "secure-kcat", "-P", input="one\ntwo\nthree\n")
    consumed = kcat("-b", broker.bootstrap, *login, "-t", "secure-kcat", "-C", "-o", "beginning", "-e", "-q")
    assert consumed.splitlines() == ["one", "two", "three"]
    assert "secure-kcat" in kcat("-b", broker.bootstrap, *login, "-L")


@pytest.mark.slow
def test_wrong_passwords_and_unknown_users_are_refused_by_every_client_and_the_broker_keeps_serving(broker):
    seen = []
    admin = AdminClient(confluent_config(broker, "alice", "not her password", error_cb=seen.append))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)                                               # error_cb runs from poll
    del admin
    assert any(error.code() == ConfluentError._AUTHENTICATION for error in seen), seen
    assert any("Invalid username or password" in error.str() for error in seen), seen

    with pytest.raises(KafkaError):
        KafkaAdminClient(bootstrap_servers=broker.bootstrap, bootstrap_timeout_ms=5000,
                         **python_config("mallory", BOB[1])).list_topics()

    refused = subprocess.run(["kcat", "-b", broker.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                              "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=bob", "-X", "sasl.password=nope",
                              "-L", "-m", "5"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "Authentication failed" in refused.stderr, refused.stderr

    log = broker.log_tail(100_000)
    assert "authentication failed: wrong password for user 'alice'" in log
    assert "authentication failed: an unknown user" in log
    assert "not her password" not in log and "nope" not in log and BOB[1] not in log and ALICE[1] not in log
    wait_logged_in(broker)


@pytest.mark.slow
def test_a_client_that_does_not_log_in_gets_nothing_but_api_versions(broker):
    with KafkaWire(broker.port, timeout=10) as wire:
        wire.send(framed(encode(ApiVersionsRequest(version=0), 1)))
        assert wire.read_frame() is not None                    # served before a login, as Kafka does
        wire.send(framed(encode(MetadataRequest(version=1, topics=None), 2)))
        assert wire.closed()                                    # closed, unanswered
    with KafkaWire(broker.port, timeout=10) as wire:            # above the unauthenticated frame limit
        wire.send((MAX_UNAUTHENTICATED_FRAME + 1).to_bytes(4, "big") + b"\x00" * 64)
        assert wire.closed()
    plain = subprocess.run(["kcat", "-b", broker.bootstrap, "-L", "-m", "5"], capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode != 0
    wait_logged_in(broker)


@pytest.mark.slow
def test_the_command_line_tools_log_in_from_the_environment(broker):
    env = {**os.environ, "WALKIT_SASL_USERNAME": BOB[0], "WALKIT_SASL_PASSWORD": BOB[1]}

    def walkit(*args: str, input: str | None = None, environment=env) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "walkit", "topics", *args, "--bootstrap", broker.bootstrap],
                              input=input, capture_output=True, text=True, timeout=120, env=environment)

    created = walkit("create", "secure-cli", "--partitions", "2")
    assert created.returncode == 0, created.stderr
    produced = walkit("produce", "secure-cli", input="x\ny\n")
    assert produced.returncode == 0, produced.stderr
    consumed = walkit("consume", "secure-cli", "--from-beginning", "--count", "2")
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(line.split()[-1] for line in consumed.stdout.splitlines()) == ["x", "y"]   # PARTITION:OFFSET VALUE
    wrong = walkit("list", environment={**env, "WALKIT_SASL_PASSWORD": "wrong"})
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
    last = wrong.stderr.strip().splitlines()[-1]
    assert last == ("Error: the broker refused the SASL login: Authentication failed: Invalid username or password "
                    "(check --sasl-username, --sasl-mechanism and WALKIT_SASL_PASSWORD)"), wrong.stderr


@pytest.mark.processes
def test_bad_sasl_options_stop_the_broker_with_a_clear_message(tmp_path):
    def serve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "walkit", "topics", "serve", "--port", "0",
                               "--data-dir", str(tmp_path / "data"), *args],
                              capture_output=True, text=True, timeout=60)
    no_password = serve("--sasl-user", "alice")
    assert no_password.returncode != 0 and "NAME:PASSWORD" in no_password.stderr, no_password.stderr
    (tmp_path / "empty").write_text("# nobody\n")
    empty = serve("--sasl-users", str(tmp_path / "empty"))
    assert empty.returncode != 0 and "no user" in empty.stderr, empty.stderr
    (tmp_path / "broken").write_text("alice\n")
    broken = serve("--sasl-users", str(tmp_path / "broken"))
    assert broken.returncode != 0 and "line 1" in broken.stderr, broken.stderr
    for result in (no_password, empty, broken):
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()                     # refused before any bookie started


@pytest.mark.slow
def test_hostile_sasl_exchanges_and_logged_in_hostile_requests_leave_the_broker_serving(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, **python_config(*ALICE))
    if "fuzz" not in admin.list_topics():
        admin.create_topics([NewTopic("fuzz", 1, 1)], timeout_ms=15000)
    admin.close()
    requests = iter(HostileRequests(FUZZ_SEED, kinds=("sasl", "bit-flips", "truncated"),
                                    user=ALICE[0], password=ALICE[1]))
    client = HostileClient(broker.port, timeout=5.0, login=ALICE)
    outcomes: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    try:
        for sent in range(SASL_FUZZ_REQUESTS):
            message = next(requests)
            kinds[message.kind] += 1
            outcomes[client.send(message)] += 1
            assert broker.process.poll() is None, f"seed {FUZZ_SEED}: the broker died after {sent} ({message.kind})"
    finally:
        client.close()
    print(f"\nsasl fuzz seed {FUZZ_SEED}: {dict(kinds)} {dict(outcomes)}")
    assert kinds["sasl"] > SASL_FUZZ_REQUESTS // 10 and outcomes["closed"] > SASL_FUZZ_REQUESTS // 10
    assert outcomes["slow"] <= 5, outcomes
    wait_logged_in(broker)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", **python_config(*BOB))
    producer.send("after-fuzz", value=b"still serving").get(timeout=30)
    producer.close()
