"""Spark on a secured cluster: bookies that take CurveZMQ keys only and a broker that takes SASL over TLS only.

One LocalCluster with security=True and one `walkit topics serve --sasl-user spark:... --tls-cert ...`
on it (SASL_SSL; the broker holds the cluster's client key, WALKIT_KEY), with certificates made by
openssl (tests/support/certificates.py). A query with option `key`, `kafka.ssl.ca.location` and a
SCRAM login writes a topic through the broker and reads it back from the bookies (issue 47: "Spark
reads and writes on a cluster with CurveZMQ bookies and a SASL_SSL broker"); with a CA that did not
sign the broker's certificate, without the SASL login or without the key, the same query is refused.
"""

from __future__ import annotations

import os

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.certificates import make_certificates
from tests.support.serverprocess import TopicsProcess
from walkit.adapters.spark.credentials import parse_credentials
from walkit.adapters.spark.errors import OptionError
from walkit.local import LocalCluster

pytestmark = pytest.mark.slow

USER, PASSWORD = "spark", "s3cret-pass"
SCRAM_JAAS = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{USER}" '
              f'password="{PASSWORD}";')


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """secured is (cluster, broker, certificates): CurveZMQ bookies and a SASL_SSL broker with topic 'vault'."""
    workdir = tmp_path_factory.mktemp("spark-secured")
    certificates = make_certificates(tmp_path_factory.mktemp("spark-certificates"))
    with LocalCluster(bookies=3, data_dir=str(workdir / "cluster"), storage="memory", security=True) as cluster:
        broker = TopicsProcess(workdir, metadata=cluster.metadata_url, env={"WALKIT_KEY": cluster.client_key},
                               args=("--sasl-user", f"{USER}:{PASSWORD}", "--tls-cert", certificates.server_cert,
                                     "--tls-key", certificates.server_key))
        broker.start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap, **admin_settings(certificates)})
            broker.wait(lambda: admin.list_topics(timeout=5), 60, "answering Metadata over SASL_SSL", interval=0.1)
            admin.create_topics([NewTopic("vault", num_partitions=2, replication_factor=1)])["vault"].result(30)
            yield cluster, broker, certificates
        finally:
            broker.stop()


def admin_settings(certificates) -> dict:
    return {"security.protocol": "SASL_SSL", "ssl.ca.location": certificates.ca, "sasl.mechanism": "PLAIN",
            "sasl.username": USER, "sasl.password": PASSWORD}


def secured_write(frame, cluster, **options):
    """secured_write is `frame.write` into topic 'vault' with the cluster's key and `options`."""
    writer = (frame.write.format("walkit").option("metadata", cluster.metadata_url).option("topic", "vault")
              .option("key", cluster.client_key))
    for name, value in options.items():
        writer = writer.option(name.replace("_", "."), value)
    return writer.mode("append")


def test_a_query_with_the_key_and_a_scram_login_writes_over_sasl_ssl_and_reads_a_secured_topic(spark, secured):
    cluster, broker, certificates = secured
    rows = [(f"k{i}", f"v{i}") for i in range(50)]
    secured_write(spark.createDataFrame(rows, "key string, value string"), cluster,
                  kafka_security_protocol="SASL_SSL", kafka_ssl_ca_location=certificates.ca,
                  kafka_sasl_mechanism="SCRAM-SHA-256", kafka_sasl_jaas_config=SCRAM_JAAS).save()
    read = (spark.read.format("walkit").option("metadata", cluster.metadata_url).option("topic", "vault")
            .option("key", cluster.client_key))
    assert sorted((r.key.decode(), r.value.decode()) for r in read.load().collect()) == sorted(rows)
    by_time = (read.option("startingTimestamp", "0")             # ListOffsets through the broker (kafka-python)
               .option("kafka.security.protocol", "SASL_SSL").option("kafka.ssl.ca.location", certificates.ca)
               .option("kafka.sasl.mechanism", "SCRAM-SHA-512").option("kafka.sasl.jaas.config", SCRAM_JAAS))
    assert sorted((r.key.decode(), r.value.decode()) for r in by_time.load().collect()) == sorted(rows)


def test_a_write_trusting_another_ca_is_refused_naming_the_broker_certificate(spark, secured):
    cluster, broker, certificates = secured
    other_ca = os.path.join(os.path.dirname(certificates.ca), "rogue-ca.pem")
    with pytest.raises(Exception, match="the broker's certificate could not be verified with the CA of "
                                        "kafka.ssl.ca.location"):
        secured_write(spark.createDataFrame([("k", "v")], "key string, value string"), cluster,
                      kafka_security_protocol="SASL_SSL", kafka_ssl_ca_location=other_ca,
                      kafka_sasl_mechanism="SCRAM-SHA-256", kafka_sasl_jaas_config=SCRAM_JAAS, timeout="20").save()


def test_without_the_sasl_login_or_with_a_wrong_password_a_write_is_refused_and_without_the_key_a_read(
        spark, secured):
    cluster, broker, certificates = secured
    frame = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception, match="producing to topic 'vault' failed"):
        secured_write(frame, cluster, kafka_security_protocol="SSL", kafka_ssl_ca_location=certificates.ca,
                      timeout="5").save()
    with pytest.raises(Exception, match="producing to topic 'vault' failed: the broker refused the login"):
        secured_write(frame, cluster, kafka_security_protocol="SASL_SSL", kafka_ssl_ca_location=certificates.ca,
                      kafka_sasl_mechanism="SCRAM-SHA-256", kafka_sasl_jaas_config=SCRAM_JAAS.replace(PASSWORD, "nope"),
                      timeout="20").save()
    with pytest.raises(Exception):
        (spark.read.format("walkit").option("metadata", cluster.metadata_url).option("topic", "vault")
         .option("timeout", "5").load().collect())


def test_credentials_come_from_the_environment_when_no_option_gives_them(tmp_path):
    key, ca = tmp_path / "spark.key_secret", tmp_path / "ca.pem"
    key.write_text("not read here")
    ca.write_text("not read here")
    found = parse_credentials({}, {"WALKIT_KEY": str(key), "WALKIT_SASL_USERNAME": USER,
                                   "WALKIT_SASL_PASSWORD": PASSWORD, "WALKIT_SASL_MECHANISM": "SCRAM-SHA-512",
                                   "WALKIT_CLIENT_TLS_CA": str(ca)})
    assert (found.key, found.sasl_username, found.sasl_password) == (str(key), USER, PASSWORD)
    assert found.librdkafka_settings() == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
        "sasl.password": PASSWORD, "ssl.ca.location": str(ca), "ssl.endpoint.identification.algorithm": "https"}
    assert PASSWORD not in repr(found)
    with pytest.raises(OptionError, match="SASL needs a user and a password"):
        parse_credentials({"kafka.security.protocol": "SASL_SSL"}, {})
    with pytest.raises(OptionError, match="kafka.ssl.ca.location \\(or WALKIT_CLIENT_TLS_CA\\): no file"):
        parse_credentials({"kafka.security.protocol": "SSL"}, {"WALKIT_CLIENT_TLS_CA": str(ca) + ".missing"})


@pytest.mark.parametrize("name", ["kafka.ssl.truststore.location", "kafka.ssl.keystore.location"])
def test_java_key_stores_are_refused_naming_the_pem_options(name):
    with pytest.raises(OptionError, match=f"option {name}: .* reads PEM files, not Java key stores: give the CA "
                                          f"certificate as kafka.ssl.ca.location, a client certificate and its key "
                                          f"as kafka.ssl.certificate.location and kafka.ssl.key.location"):
        parse_credentials({"kafka.security.protocol": "SSL", name: "/etc/kafka/store.jks"}, {})
