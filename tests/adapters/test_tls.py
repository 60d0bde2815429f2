"""TLS on the KV server's and the topics broker's ports, and SCRAM logins (issue 47, items 2 and 3).

The SCRAM exchange is checked without I/O against RFC 7677's example and a seeded fuzz. The
process tests start, once for the module, with certificates made by openssl:

- a `walkit kv serve` requiring client certificates (--tls-ca) and ACL users;
- a SASL_SSL broker whose users file `walkit topics users add` wrote (SCRAM credentials),
  plus a PLAIN user from --sasl-user;
- an SSL broker requiring client certificates.

redis-cli, redis-py, confluent-kafka, kafka-python and kcat work against them; a wrong
certificate, a plaintext client or a wrong password is refused and the server serves the
others; a seeded fuzz of TLS records and SCRAM exchanges leaves every server serving.
"""

from __future__ import annotations

import base64
import http.client
import os
import random
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import redis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.retry import Retry
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError
from kafka.net.sasl.scram import ScramClient
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest

from walkit.adapters.topics import errors
from walkit.adapters.topics.cli import BOOTSTRAP_TIMEOUT_MS, topics
from walkit.adapters.topics.credentials import BadCredentials, BrokerCredentials
from walkit.adapters.topics.sasl import SaslGate, Users
from walkit.adapters.topics.scram import INVALID_CREDENTIALS, Credential, ScramExchange
from walkit.local import free_port
from walkit.tls import BadTls, options_context
from tests.support.certificates import KEY_PASSWORD, client_hello, make_certificates
from tests.support.kafka_fuzz import encode, framed
from tests.support.serverprocess import KVProcess, TopicsProcess, kcat, recv_exactly, require_redis_cli

ALICE = ("alice", "scram, with = signs")        # SCRAM credentials in the users file
BOB = ("bob", "bob-plain")                      # --sasl-user: a password the broker derives credentials from
KV_USER = ("carol", "wonder")
FUZZ_SEED = int(os.environ.get("WALKIT_FUZZ_SEED", "20261129"))
SCRAM_FUZZ_MESSAGES = 20_000
WIRE_FUZZ_CONNECTIONS = 300


# -- SCRAM, without I/O ----------------------------------------------------------------------------

RFC_7677_USER = Credential.derive("SCRAM-SHA-256", b"pencil", salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))


def rfc_7677_exchange(nonce: bytes = b"%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0") -> ScramExchange:
    """rfc_7677_exchange is a server holding RFC 7677's example user ("user", "pencil") with its salt and nonce."""
    return ScramExchange(lambda user, mechanism: RFC_7677_USER if user == "user" else None, "SCRAM-SHA-256",
                         b"decoy", server_nonce=lambda: nonce)


CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")


def test_scram_sha_256_answers_rfc_7677s_example_exchange():
    exchange = rfc_7677_exchange()
    first = exchange.receive(CLIENT_FIRST)
    assert first.challenge == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = exchange.receive(CLIENT_FINAL)
    assert final.user == "user" and final.failure is None
    assert final.challenge == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_refuses_wrong_proofs_nonces_bindings_and_unknown_users_alike():
    refusals = {
        CLIENT_FINAL[:-5] + b"AAAA=": INVALID_CREDENTIALS.format("SCRAM-SHA-256"),        # a wrong proof
        CLIENT_FINAL.replace(b"k0,", b"k1,"): "Invalid SCRAM message: the nonce is not the one of this exchange",
        CLIENT_FINAL.replace(b"c=biws", b"c=eSws"): "Invalid SCRAM message: the channel binding does not repeat "
                                                    "the GS2 header",
        CLIENT_FINAL.replace(b",p=", b",x="): "Invalid SCRAM message: the client-final message is not "
                                              "c=BINDING,r=NONCE,p=PROOF",
    }
    for final, message in refusals.items():
        exchange = rfc_7677_exchange()
        exchange.receive(CLIENT_FIRST)
        step = exchange.receive(final)
        assert step.user is None and step.message == message, final
    for first in (b"p=tls-unique,,n=user,r=x", b"n,,n=user", b"n,,n=user,r=x,tokenauth=true", b"n,a=other,n=user,r=x",
                  b"n,,n=us=er,r=x", b""):
        step = rfc_7677_exchange().receive(first)
        assert step.user is None and step.failure and step.message.startswith("Invalid SCRAM message"), first
    unknown = [rfc_7677_exchange(), rfc_7677_exchange()]
    salts = [e.receive(b"n,,n=nobody,r=abc").challenge.split(b",")[1] for e in unknown]
    assert salts[0] == salts[1]                                 # an unknown user's salt does not change
    step = unknown[0].receive(b"c=biws,r=abc%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=" + base64.b64encode(bytes(32)))
    assert step.message == INVALID_CREDENTIALS.format("SCRAM-SHA-256") and step.failure == "an unknown user"


def test_kafka_pythons_scram_client_logs_in_through_the_gate_with_both_mechanisms_and_plain_too():
    users = Users({BOB[0]: BOB[1]}, {(ALICE[0], m): Credential.derive(m, ALICE[1].encode())
                                     for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")})
    assert users.check(ALICE[0], ALICE[1].encode()) and not users.check(ALICE[0], b"nope")     # PLAIN
    for user, password in (ALICE, BOB):
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            gate, client = SaslGate(users), ScramClient(user, password, mechanism)
            gate.receive(encode(SaslHandshakeRequest(version=1, mechanism=mechanism), 1))
            first = gate.receive(encode(SaslAuthenticateRequest(version=2, auth_bytes=client.first_message()), 2))
            client.process_server_first_message(decode_authenticate(first.answer).auth_bytes)
            final = gate.receive(encode(SaslAuthenticateRequest(version=2, auth_bytes=client.final_message()), 3))
            answer = decode_authenticate(final.answer)
            assert answer.error_code == errors.NONE and gate.user == user, (user, mechanism)
            client.process_server_final_message(answer.auth_bytes)      # raises if the server's signature is wrong


def decode_authenticate(answer: bytes):
    """decode_authenticate decodes a size-prefixed SaslAuthenticate v2 answer."""
    return SaslAuthenticateResponse.decode(answer[4:], version=2, header=True)


def bit_flipped(rng: random.Random, data: bytes, most: int) -> bytes:
    """bit_flipped is `data` with 1 to `most` random bits flipped."""
    flipped = bytearray(data)
    for _ in range(rng.randint(1, most)):
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
    return bytes(flipped)


def hostile_scram_message(rng: random.Random, valid: bytes) -> bytes:
    """hostile_scram_message is `valid` cut short, bit-flipped, with bytes inserted, or random bytes."""
    kind = rng.randrange(4)
    if kind == 0:
        return valid[:rng.randrange(len(valid) + 1)]
    if kind == 1:
        return bit_flipped(rng, valid, 4)
    if kind == 2:
        at = rng.randrange(len(valid) + 1)
        return valid[:at] + rng.choice([b",", b"=", b"=2C", b"\x00", b"\xff", b",p=", b",r="]) + valid[at:]
    return rng.randbytes(rng.randrange(200))


def test_a_seeded_fuzz_of_scram_messages_gets_answers_or_refusals_never_an_exception():
    rng = random.Random(FUZZ_SEED)
    outcomes = {"refused": 0, "logged in": 0}
    for _ in range(SCRAM_FUZZ_MESSAGES // 2):
        exchange = rfc_7677_exchange()
        first = hostile_scram_message(rng, CLIENT_FIRST) if rng.random() < 0.5 else CLIENT_FIRST
        step = exchange.receive(first)
        if step.failure is None:
            step = exchange.receive(hostile_scram_message(rng, CLIENT_FINAL))
        assert (step.user is None) != (step.failure is None) or step.challenge.startswith(b"r="), step
        outcomes["logged in" if step.user else "refused"] += 1
    print(f"\nscram fuzz seed {FUZZ_SEED}: {outcomes}")
    assert outcomes["refused"] > SCRAM_FUZZ_MESSAGES // 4


def test_tls_options_that_cannot_be_used_are_refused_with_the_file_named(tmp_path):
    assert options_context(None, None, None) is None
    with pytest.raises(BadTls, match="need --tls-cert"):
        options_context(None, None, str(tmp_path / "ca.pem"))
    with pytest.raises(BadTls, match="does not exist"):
        options_context(str(tmp_path / "missing.pem"), None, None)
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    with pytest.raises(BadTls, match="garbage.pem"):
        options_context(str(tmp_path / "garbage.pem"), None, None)


def test_client_credentials_pick_the_security_protocol_and_refuse_settings_that_cannot_work(certificates):
    def parse(**options) -> BrokerCredentials:
        return BrokerCredentials.parse("127.0.0.1:9093", **options)
    assert parse().kafka_settings() == {"bootstrap_servers": "127.0.0.1:9093", "security_protocol": "PLAINTEXT"}
    login = {"sasl_username": ALICE[0], "sasl_password": ALICE[1]}
    assert parse(**login).kafka_settings()["sasl_mechanism"] == "PLAIN"
    scram = parse(sasl_mechanism="scram-sha-512", tls_ca=certificates.ca, **login).kafka_settings()
    assert scram["security_protocol"] == "SASL_SSL" and scram["sasl_mechanism"] == "SCRAM-SHA-512"
    assert scram["ssl_context"].verify_mode == ssl.CERT_REQUIRED and scram["ssl_context"].check_hostname
    assert parse(tls=True).security_protocol == parse(tls_cert=certificates.client_cert,
                                                      tls_key=certificates.client_key).security_protocol == "SSL"
    encrypted = certificates.client_key_encrypted
    assert parse(tls_cert=certificates.client_cert, tls_key=encrypted, tls_key_password=KEY_PASSWORD).context
    refused = {
        "needs a user": {"sasl_mechanism": "SCRAM-SHA-256"},
        "both a user and a password": {"sasl_username": ALICE[0]},
        "is one of PLAIN": {"sasl_mechanism": "GSSAPI", **login},
        "need --tls-cert": {"tls_key": certificates.client_key},
        "does not exist": {"tls_ca": certificates.ca + ".missing"},
        "cannot use the TLS certificate": {"tls_cert": certificates.client_cert, "tls_key": certificates.rogue_key},
        "with the key .*encrypted": {"tls_cert": certificates.client_cert, "tls_key": encrypted,
                                     "tls_key_password": "wrong"},
        "need --tls-cert": {"tls_key_password": KEY_PASSWORD},
    }
    for message, options in refused.items():
        with pytest.raises(BadCredentials, match=message):
            parse(**options)
    assert ALICE[1] not in repr(parse(**login))


# -- real servers ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certificates"))


def tls_args(certificates, *, client_ca: bool) -> tuple[str, ...]:
    """tls_args are a server's --tls-* options for the test certificates (with --tls-ca if `client_ca`)."""
    args = ("--tls-cert", certificates.server_cert, "--tls-key", certificates.server_key)
    return args + (("--tls-ca", certificates.ca) if client_ca else ())


class TlsKV(KVProcess):
    """TlsKV is a `walkit kv serve` with TLS; its redis-py clients present the test client certificate."""

    certificates = None

    def redis(self, **options) -> redis.Redis:
        certs = self.certificates
        options = {"ssl": True, "ssl_ca_certs": certs.ca, "ssl_certfile": certs.client_cert,
                   "ssl_keyfile": certs.client_key, "username": KV_USER[0], "password": KV_USER[1], **options}
        return super().redis(**options)


@pytest.fixture(scope="module")
def kv(tmp_path_factory, certificates):
    """kv is a `walkit kv serve` requiring a client certificate from the test CA and user carol's password,
    with its metrics endpoint on HTTPS."""
    workdir = tmp_path_factory.mktemp("kv-tls")
    http_port = free_port()
    process = TlsKV(workdir, data_dir=workdir / "data",
                    args=("--bookies", "1", "--user", ":".join(KV_USER), *tls_args(certificates, client_ca=True),
                          "--http-port", str(http_port), "--http-tls"))
    process.certificates, process.http_port = certificates, http_port
    process.start()
    process.wait_role(b"master")
    yield process
    process.stop()


def tls_api_versions(port: int, context: ssl.SSLContext, timeout: float = 5.0) -> ApiVersionsResponse:
    """tls_api_versions sends one ApiVersions v0 over a fresh TLS connection and decodes the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(framed(encode(ApiVersionsRequest(version=0), 1)))
            size = int.from_bytes(recv_exactly(sock, 4), "big")
            return ApiVersionsResponse.decode(recv_exactly(sock, size), version=0, header=True)


class TlsTopics(TopicsProcess):
    """TlsTopics is a `walkit topics serve` with TLS, ready once ApiVersions is answered over TLS."""

    context: ssl.SSLContext | None = None

    def wait_ready(self, timeout: float = 60.0) -> "TlsTopics":
        self.wait(lambda: tls_api_versions(self.port, self.context).error_code == 0, timeout,
                  "answering ApiVersions over TLS", interval=0.1)
        return self


def walkit(*args: str, input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """walkit runs a walkit command in a process of its own."""
    return subprocess.run([sys.executable, "-m", "walkit", *args], input=input, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def sasl_ssl(tmp_path_factory, certificates):
    """sasl_ssl is a SASL_SSL broker: alice's SCRAM credentials in a users file, bob from --sasl-user."""
    workdir = tmp_path_factory.mktemp("topics-sasl-ssl")
    users_file = str(workdir / "users")
    added = walkit("topics", "users", "add", "--file", users_file, ALICE[0], input=f"{ALICE[1]}\n{ALICE[1]}\n")
    assert added.returncode == 0, added.stderr
    process = TlsTopics(workdir, data_dir=workdir / "data",
                        args=("--bookies", "1", "--rebalance-delay-ms", "0", "--sasl-users", users_file,
                              "--sasl-user", ":".join(BOB), *tls_args(certificates, client_ca=False)))
    process.context = certificates.client_context()
    process.users_file = users_file
    process.start()
    process.wait_ready()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def ssl_broker(tmp_path_factory, certificates):
    """ssl_broker is an SSL broker (no SASL) that requires a client certificate from the test CA."""
    workdir = tmp_path_factory.mktemp("topics-ssl")
    process = TlsTopics(workdir, data_dir=workdir / "data",
                        args=("--bookies", "1", "--rebalance-delay-ms", "0", *tls_args(certificates, client_ca=True)))
    process.context = certificates.client_context(cert=True)
    process.start()
    process.wait_ready()
    yield process
    process.stop()


@pytest.mark.slow
def test_redis_cli_and_redis_py_work_over_tls_with_a_client_certificate_and_an_acl_user(kv, certificates):
    require_redis_cli()
    tls = ["--tls", "--cacert", certificates.ca, "--cert", certificates.client_cert, "--key", certificates.client_key]
    done = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(kv.port), *tls, "--user", KV_USER[0],
                           "--pass", KV_USER[1], "--no-auth-warning", "SET", "over", "tls"],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr + done.stdout
    client = kv.redis()
    assert client.get("over") == b"tls" and b" user=carol " in client.execute_command("CLIENT", "INFO")
    client.close()


@pytest.mark.slow
def test_a_wrong_certificate_plaintext_or_a_wrong_password_is_refused_and_the_kv_server_serves_the_others(
        kv, certificates):
    refused = {
        "a certificate another CA signed": {"ssl_certfile": certificates.rogue_cert,
                                            "ssl_keyfile": certificates.rogue_key},
        "no certificate": {"ssl_certfile": None, "ssl_keyfile": None},
        "plaintext": {"ssl": False},
    }
    for options in refused.values():
        client = kv.redis(socket_timeout=5, retry=Retry(NoBackoff(), 0), **options)
        with pytest.raises(redis.ConnectionError):
            client.ping()
        client.close()
    wrong = kv.redis(password="not carol's", retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    wrong.close()
    client = kv.redis()
    assert client.set("after-refusals", "1") and client.get("after-refusals") == b"1"
    client.close()


@pytest.mark.slow
def test_the_metrics_endpoint_serves_https_only_with_the_ports_certificates(kv, certificates):
    url = f"https://127.0.0.1:{kv.http_port}/metrics"
    with urllib.request.urlopen(url, context=certificates.client_context(cert=True), timeout=10) as answer:
        assert answer.status == 200 and b"# TYPE" in answer.read()
    for refused in (certificates.client_context(rogue=True), certificates.client_context()):
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(url, context=refused, timeout=10).read()
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{kv.http_port}/metrics", timeout=10).read()
    with urllib.request.urlopen(url.replace("/metrics", "/health"), context=certificates.client_context(cert=True),
                                timeout=10) as answer:
        assert answer.status == 200


def confluent_config(broker: TlsTopics, certificates, mechanism: str, user: str, password: str, **extra) -> dict:
    return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": certificates.ca,
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password, **extra}


def python_config(certificates, mechanism: str, user: str, password: str) -> dict:
    return {"security_protocol": "SASL_SSL", "ssl_cafile": certificates.ca, "sasl_mechanism": mechanism,
            "sasl_plain_username": user, "sasl_plain_password": password}


def test_walkit_topics_users_stores_salted_scram_credentials_and_removes_them(tmp_path):
    path = str(tmp_path / "users")

    def users(*args: str, password: str | None = None):
        return CliRunner().invoke(topics, ["users", *args], env={"WALKIT_SASL_PASSWORD": password})
    assert users("add", "-f", path, "dave", password="d-secret").exit_code == 0
    assert users("add", "-f", path, "erin", "--mechanism", "SCRAM-SHA-512", password="e-secret").exit_code == 0
    text = open(path).read()
    assert os.stat(path).st_mode & 0o777 == 0o600 and "secret" not in text
    assert [line.split()[:3] for line in text.splitlines()] == [
        ["SCRAM-SHA-256", "dave", "4096"], ["SCRAM-SHA-512", "dave", "4096"], ["SCRAM-SHA-512", "erin", "4096"]]
    loaded = Users.load(path)
    assert loaded.check("dave", b"d-secret") and not loaded.check("dave", b"e-secret")
    assert users("list", "-f", path).output.splitlines() == ["dave\tPLAIN SCRAM-SHA-256 SCRAM-SHA-512",
                                                           "erin\tPLAIN SCRAM-SHA-512"]
    assert users("remove", "-f", path, "dave").exit_code == 0
    gone = users("remove", "-f", path, "dave")
    assert gone.exit_code != 0 and "no user dave" in gone.output
    assert Users.load(path).names == ["erin"]


@pytest.mark.slow
def test_confluent_kafka_logs_in_with_scram_sha_256_and_512_over_sasl_ssl(sasl_ssl, certificates):
    producer = Producer(confluent_config(sasl_ssl, certificates, "SCRAM-SHA-256", *ALICE, acks="all"))
    delivered = []
    for i in range(50):
        producer.produce("tls-confluent", value=b"c%d" % i, on_delivery=lambda error, _: delivered.append(error))
    assert producer.flush(30) == 0 and delivered == [None] * 50
    consumer = Consumer(confluent_config(sasl_ssl, certificates, "SCRAM-SHA-512", *BOB,
                                         **{"group.id": "tls-readers", "auto.offset.reset": "earliest"}))
    consumer.subscribe(["tls-confluent"])
    values = []
    while len(values) < 50:
        message = consumer.poll(10)
        assert message is not None and message.error() is None, f"{len(values)} of 50: {message and message.error()}"
        values.append(message.value())
    consumer.close()
    assert values == [b"c%d" % i for i in range(50)]
    log = sasl_ssl.log_tail(100_000)
    assert "authenticated as SASL user 'alice'" in log and "authenticated as SASL user 'bob'" in log


@pytest.mark.slow
def test_kafka_python_logs_in_with_scram_and_plain_over_sasl_ssl(sasl_ssl, certificates):
    producer = KafkaProducer(bootstrap_servers=sasl_ssl.bootstrap, acks="all",
                             **python_config(certificates, "SCRAM-SHA-512", *ALICE))
    for i in range(30):
        producer.send("tls-python", value=b"p%d" % i)
    producer.flush(30)
    producer.close()
    for mechanism, user in (("SCRAM-SHA-256", BOB), ("PLAIN", ALICE)):
        consumer = KafkaConsumer("tls-python", bootstrap_servers=sasl_ssl.bootstrap, auto_offset_reset="earliest",
                                 consumer_timeout_ms=10000, **python_config(certificates, mechanism, *user))
        values = []
        for record in consumer:
            values.append(record.value)
            if len(values) == 30:
                break
        consumer.close()
        assert values == [b"p%d" % i for i in range(30)], mechanism


@pytest.mark.slow
def test_kcat_logs_in_with_scram_over_sasl_ssl(sasl_ssl, certificates):
    login = ["-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={certificates.ca}",
             "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", f"sasl.username={ALICE[0]}", "-X", f"sasl.password={ALICE[1]}"]
    kcat("-b", sasl_ssl.bootstrap, *login, "-t", "tls-kcat", "-P", input="one\ntwo\n")
    consumed = kcat("-b", sasl_ssl.bootstrap, *login, "-t", "tls-kcat", "-C", "-o", "beginning", "-e", "-q")
    assert consumed.splitlines() == ["one", "two"]


@pytest.mark.slow
def test_wrong_scram_passwords_plaintext_and_untrusting_clients_are_refused_and_the_broker_keeps_serving(
        sasl_ssl, certificates):
    seen = []
    admin = AdminClient(confluent_config(sasl_ssl, certificates, "SCRAM-SHA-256", ALICE[0], "wrong",
                                         error_cb=seen.append))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)
    del admin
    assert any("invalid credentials with SASL mechanism SCRAM-SHA-256" in error.str() for error in seen), seen
    with pytest.raises(KafkaError):
        KafkaProducer(bootstrap_servers=sasl_ssl.bootstrap, bootstrap_timeout_ms=5000,
                      **python_config(certificates, "SCRAM-SHA-512", "mallory", BOB[1]))
    plaintext = subprocess.run(["kcat", "-b", sasl_ssl.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                                "-X", "sasl.mechanisms=PLAIN", "-X", f"sasl.username={BOB[0]}",
                                "-X", f"sasl.password={BOB[1]}", "-L", "-m", "5"],
                               capture_output=True, text=True, timeout=60)
    assert plaintext.returncode != 0
    with pytest.raises(ssl.SSLCertVerificationError):           # a client that does not trust the server's CA
        tls_api_versions(sasl_ssl.port, certificates.client_context(trust=False))
    log = sasl_ssl.log_tail(100_000)
    assert "authentication failed: wrong password for user 'alice'" in log
    assert "authentication failed: an unknown user" in log
    assert ALICE[1] not in log and BOB[1] not in log
    listed = kcat("-b", sasl_ssl.bootstrap, "-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={certificates.ca}",
                  "-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", f"sasl.username={BOB[0]}",
                  "-X", f"sasl.password={BOB[1]}", "-L")
    assert f"at {sasl_ssl.bootstrap}" in listed.replace("127.0.0.1:", "127.0.0.1:")


@pytest.mark.slow
def test_an_ssl_listener_serves_kcat_confluent_kafka_and_kafka_python_with_client_certificates_only(
        ssl_broker, certificates):
    tls = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={certificates.ca}",
           "-X", f"ssl.certificate.location={certificates.client_cert}",
           "-X", f"ssl.key.location={certificates.client_key}"]
    kcat("-b", ssl_broker.bootstrap, *tls, "-t", "ssl-kcat", "-P", input="a\nb\n")
    producer = Producer({"bootstrap.servers": ssl_broker.bootstrap, "security.protocol": "SSL",
                         "ssl.ca.location": certificates.ca, "ssl.certificate.location": certificates.client_cert,
                         "ssl.key.location": certificates.client_key})
    producer.produce("ssl-kcat", value=b"c")
    assert producer.flush(30) == 0
    consumer = KafkaConsumer("ssl-kcat", bootstrap_servers=ssl_broker.bootstrap, security_protocol="SSL",
                             ssl_cafile=certificates.ca, ssl_certfile=certificates.client_cert,
                             ssl_keyfile=certificates.client_key, auto_offset_reset="earliest",
                             consumer_timeout_ms=10000)
    values = []
    for record in consumer:
        values.append(record.value)
        if len(values) == 3:
            break
    consumer.close()
    assert values == [b"a", b"b", b"c"]
    for rogue in (certificates.client_context(rogue=True), certificates.client_context()):
        with pytest.raises((ssl.SSLError, ConnectionError)):       # another CA's certificate, or none
            tls_api_versions(ssl_broker.port, rogue)
    assert tls_api_versions(ssl_broker.port, ssl_broker.context).error_code == 0


def scram_login(port: int, context: ssl.SSLContext, user: str, password: str,
                mechanism: str = "SCRAM-SHA-256") -> int:
    """scram_login logs in with SCRAM over a fresh TLS connection; SaslAuthenticate's error code (-1: closed)."""
    client = ScramClient(user, password, mechanism)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        def read() -> bytes:
            return recv_exactly(sock, int.from_bytes(recv_exactly(sock, 4), "big"))
        try:
            sock.sendall(framed(encode(SaslHandshakeRequest(version=1, mechanism=mechanism), 1)))
            read()
            for correlation, message in ((2, client.first_message), (3, client.final_message)):
                sock.sendall(framed(encode(SaslAuthenticateRequest(version=2, auth_bytes=message()), correlation)))
                answer = decode_authenticate(b"\x00" * 4 + read())
                if answer.error_code or correlation == 3:
                    return answer.error_code
                client.process_server_first_message(answer.auth_bytes)
        except ConnectionError:
            return -1


@pytest.mark.slow
def test_a_user_added_to_or_removed_from_the_users_file_logs_in_or_is_refused_without_a_restart(sasl_ssl):
    def users(*args: str):
        done = CliRunner().invoke(topics, ["users", *args, "--file", sasl_ssl.users_file],
                                  env={"WALKIT_SASL_PASSWORD": "frank-secret"})
        assert done.exit_code == 0, done.output

    def login() -> int:
        return scram_login(sasl_ssl.port, sasl_ssl.context, "frank", "frank-secret")
    assert login() == errors.SASL_AUTHENTICATION_FAILED
    users("add", "frank")
    sasl_ssl.wait(lambda: login() == errors.NONE, 10, "letting the added user log in")
    users("remove", "frank")
    sasl_ssl.wait(lambda: login() == errors.SASL_AUTHENTICATION_FAILED, 10, "refusing the removed user")
    assert scram_login(sasl_ssl.port, sasl_ssl.context, *ALICE, mechanism="SCRAM-SHA-512") == errors.NONE
    assert "read the SASL users file" in sasl_ssl.log_tail(100_000)


# -- walkit topics commands as clients ------------------------------------------------------------

#: The settings of the `walkit topics` client commands: none is inherited from the test's environment.
CLIENT_VARIABLES = ("WALKIT_BOOTSTRAP", "WALKIT_SASL_USERNAME", "WALKIT_SASL_PASSWORD", "WALKIT_SASL_MECHANISM",
                    "WALKIT_CLIENT_TLS", "WALKIT_CLIENT_TLS_CA", "WALKIT_CLIENT_TLS_CERT", "WALKIT_CLIENT_TLS_KEY",
                    "WALKIT_TLS_CERT", "WALKIT_TLS_KEY", "WALKIT_TLS_CA")


def topics_client(*args: str, env: dict | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    """topics_client runs `walkit topics ARGS` in a process of its own with only `env`'s client settings;
    `.seconds` is how long it ran."""
    environment = {name: value for name, value in os.environ.items() if name not in CLIENT_VARIABLES}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "walkit", "topics", *args], input=input, capture_output=True,
                          text=True, timeout=120, env={**environment, **(env or {})})
    done.seconds = time.monotonic() - started
    return done


def succeeded(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_walkit_topics_commands_log_in_with_scram_sha_512_over_tls_from_options_and_from_the_environment(
        sasl_ssl, certificates):
    options = ("--bootstrap", sasl_ssl.bootstrap, "--tls-ca", certificates.ca, "--sasl-mechanism", "SCRAM-SHA-512",
               "--sasl-username", ALICE[0], "--sasl-password", ALICE[1])
    assert succeeded(topics_client("create", "cli-scram", "--partitions", "2", *options)).startswith(
        "created topic cli-scram")
    environment = {"WALKIT_BOOTSTRAP": sasl_ssl.bootstrap, "WALKIT_CLIENT_TLS_CA": certificates.ca,
                   "WALKIT_SASL_MECHANISM": "SCRAM-SHA-512", "WALKIT_SASL_USERNAME": ALICE[0],
                   "WALKIT_SASL_PASSWORD": ALICE[1],
                   # a server's own settings, where a broker runs: the client must not present them
                   "WALKIT_TLS_CERT": certificates.rogue_cert, "WALKIT_TLS_KEY": certificates.rogue_key}
    assert "cli-scram" in succeeded(topics_client("list", env=environment)).splitlines()
    succeeded(topics_client("produce", "cli-scram", "-K:", env=environment, input="a:1\nb:2\n"))
    consumed = succeeded(topics_client("consume", "cli-scram", "--from-beginning", "--count", "2", *options))
    assert sorted(line.split("\t")[1:] for line in consumed.splitlines()) == [["a", "1"], ["b", "2"]]


@pytest.mark.slow
def test_walkit_topics_commands_present_a_client_certificate_over_ssl_from_options_and_from_the_environment(
        ssl_broker, certificates):
    options = ("--bootstrap", ssl_broker.bootstrap, "--tls-ca", certificates.ca,
               "--tls-cert", certificates.client_cert, "--tls-key", certificates.client_key)
    assert succeeded(topics_client("create", "cli-mtls", *options)).startswith("created topic cli-mtls")
    environment = {"WALKIT_BOOTSTRAP": ssl_broker.bootstrap, "WALKIT_CLIENT_TLS_CA": certificates.ca,
                   "WALKIT_CLIENT_TLS_CERT": certificates.client_cert,
                   "WALKIT_CLIENT_TLS_KEY": certificates.client_key,
                   # the server's own variables, as where a broker runs: another CA's pair, which it would refuse
                   "WALKIT_TLS_CERT": certificates.rogue_cert, "WALKIT_TLS_KEY": certificates.rogue_key,
                   "WALKIT_TLS_CA": certificates.rogue_cert}
    assert "cli-mtls" in succeeded(topics_client("list", env=environment)).splitlines()
    described = succeeded(topics_client("describe", "cli-mtls", env=environment))
    assert described.startswith("topic cli-mtls\tpartitions 1")


@pytest.mark.slow
def test_walkit_topics_commands_end_with_one_line_on_a_wrong_ca_a_wrong_password_or_plaintext_to_a_tls_port(
        sasl_ssl, ssl_broker, certificates):
    scram = ("--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", ALICE[0])
    password = {"WALKIT_SASL_PASSWORD": ALICE[1]}
    failures = {
        "a wrong CA": (("--bootstrap", sasl_ssl.bootstrap, "--tls-ca", certificates.rogue_cert, *scram), password,
                       f"the TLS certificate of the broker at {sasl_ssl.bootstrap} is not accepted: "),
        "a wrong password": (("--bootstrap", sasl_ssl.bootstrap, "--tls-ca", certificates.ca, *scram),
                             {"WALKIT_SASL_PASSWORD": "not alice's"},
                             "the broker refused the SASL login: Authentication failed during authentication due "
                             "to invalid credentials with SASL mechanism SCRAM-SHA-512 (check --sasl-username, "
                             "--sasl-mechanism and WALKIT_SASL_PASSWORD)"),
        "plaintext with SASL": (("--bootstrap", sasl_ssl.bootstrap, *scram), password,
                                f"the broker at {sasl_ssl.bootstrap} serves TLS: give --tls"),
        "plaintext": (("--bootstrap", ssl_broker.bootstrap,), {},
                      f"the broker at {ssl_broker.bootstrap} serves TLS: give --tls"),
        "no client certificate": (("--bootstrap", ssl_broker.bootstrap, "--tls-ca", certificates.ca), {},
                                  f"the broker at {ssl_broker.bootstrap} closed the TLS connection without answering: "
                                  "it may require a client certificate"),
    }
    for case, (args, env, message) in failures.items():
        done = topics_client("list", *args, env=env)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"Error: {message}"), (case, done.stderr)
        assert done.seconds < BOOTSTRAP_TIMEOUT_MS / 1000, (case, done.seconds)     # no retries until the timeout
        assert ALICE[1] not in done.stderr and "not alice's" not in done.stderr
        print(f"\n{case} ({done.seconds:.1f} s): {lines[0]}")


# -- the handshake fuzz ------------------------------------------------------------------------------

def hostile_tls_bytes(rng: random.Random, hello: bytes) -> bytes:
    """hostile_tls_bytes is a first flight a TLS server must refuse: a ClientHello cut short, bit-flipped
    or claiming an oversized record, a record of garbage, or plain garbage."""
    kind = rng.randrange(5)
    if kind == 0:
        return hello[:rng.randrange(1, len(hello))]
    if kind == 1:
        return bit_flipped(rng, hello, 8)
    if kind == 2:
        return b"\x16\x03\x03" + rng.choice([b"\xff\xff", b"\x48\x01", b"\x40\x00"]) + hello[5:]
    if kind == 3:
        return bytes([rng.choice([0x14, 0x15, 0x16, 0x17])]) + b"\x03\x03" + (300).to_bytes(2, "big") + rng.randbytes(300)
    return rng.randbytes(rng.randrange(1, 2000))


def send_and_wait_for_close(port: int, data: bytes, timeout: float = 5.0) -> str:
    """send_and_wait_for_close sends `data` and the end of the stream on a new connection; "closed" if the
    server then closes it, else "open"."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        except socket.timeout:
            return "open"
    return "closed"


def hostile_scram_over_tls(port: int, context: ssl.SSLContext, rng: random.Random) -> str:
    """hostile_scram_over_tls runs one SCRAM exchange with a hostile message over TLS; how it ended."""
    mechanism = rng.choice(["SCRAM-SHA-256", "SCRAM-SHA-512"])
    client = ScramClient(ALICE[0], ALICE[1], mechanism)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(framed(encode(SaslHandshakeRequest(version=1, mechanism=mechanism), 1)))
        recv_exactly(sock, int.from_bytes(recv_exactly(sock, 4), "big"))
        first = client.first_message()
        if rng.random() < 0.5:
            first = hostile_scram_message(rng, first)
        sock.sendall(framed(encode(SaslAuthenticateRequest(version=2, auth_bytes=first), 2)))
        try:
            answer = decode_authenticate(b"\x00" * 4 + recv_exactly(sock, int.from_bytes(recv_exactly(sock, 4), "big")))
            if answer.error_code:
                return "refused"
            try:
                client.process_server_first_message(answer.auth_bytes)
            except (ValueError, KeyError):
                return "answered"                               # a hostile client-first the server took as valid

            final = hostile_scram_message(rng, client.final_message())
            sock.sendall(framed(encode(SaslAuthenticateRequest(version=2, auth_bytes=final), 3)))
            answer = decode_authenticate(b"\x00" * 4 + recv_exactly(sock, int.from_bytes(recv_exactly(sock, 4), "big")))
            return "refused" if answer.error_code else "logged in"
        except (ConnectionError, ssl.SSLError):
            return "closed"


@pytest.mark.slow
def test_a_seeded_fuzz_of_tls_records_and_scram_exchanges_leaves_every_server_serving(
        kv, sasl_ssl, ssl_broker, certificates):
    rng = random.Random(FUZZ_SEED)
    hello = client_hello()
    outcomes = {}
    for server in (kv, sasl_ssl, ssl_broker):
        for _ in range(WIRE_FUZZ_CONNECTIONS):
            outcome = send_and_wait_for_close(server.port, hostile_tls_bytes(rng, hello))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            assert server.process.poll() is None, f"seed {FUZZ_SEED}: {server.kind} died"
    for _ in range(WIRE_FUZZ_CONNECTIONS):
        outcome = hostile_scram_over_tls(sasl_ssl.port, sasl_ssl.context, rng)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"\ntls fuzz seed {FUZZ_SEED}: {outcomes}")
    assert outcomes.get("open", 0) <= 5, outcomes
    assert outcomes.get("refused", 0) + outcomes.get("closed", 0) > WIRE_FUZZ_CONNECTIONS
    client = kv.redis()
    assert client.set("after-fuzz", "1") and client.get("after-fuzz") == b"1"
    client.close()
    login = ["-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={certificates.ca}",
             "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", f"sasl.username={ALICE[0]}", "-X", f"sasl.password={ALICE[1]}"]
    kcat("-b", sasl_ssl.bootstrap, *login, "-t", "after-fuzz", "-P", input="still serving\n")
    assert tls_api_versions(ssl_broker.port, ssl_broker.context).error_code == 0
