"""Spark on a secured cluster: bookies that take CurveZMQ keys only and a broker that takes SASL/PLAIN only.

One LocalCluster with security=True and one `walkit topics serve --sasl-user spark:...` on it
(the broker holds the cluster's client key, WALKIT_KEY). A query with option `key` and
`kafka.sasl.jaas.config` writes a topic through the broker and reads it back from the
bookies; without the key or the SASL login, the same query is refused.
"""

from __future__ import annotations

import pytest

from tests.support.serverprocess import TopicsProcess
from walkit.adapters.spark.credentials import parse_credentials
from walkit.adapters.spark.errors import OptionError
from walkit.local import LocalCluster

from .kafkaclients import create_topic

pytestmark = pytest.mark.slow

USER, PASSWORD = "spark", "s3cret-pass"
JAAS = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{USER}" password="{PASSWORD}";'


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("spark-secured")
    with LocalCluster(bookies=3, data_dir=str(workdir / "cluster"), storage="memory", security=True) as cluster:
        broker = TopicsProcess(workdir, metadata=cluster.metadata_url, env={"WALKIT_KEY": cluster.client_key},
                               args=("--sasl-user", f"{USER}:{PASSWORD}"))
        broker.start().wait_ready()
        try:
            from confluent_kafka.admin import AdminClient, NewTopic     # every test of the module writes to it
            admin = AdminClient({"bootstrap.servers": broker.bootstrap, **admin_settings()})
            admin.create_topics([NewTopic("vault", num_partitions=2, replication_factor=1)])["vault"].result(30)
            yield cluster, broker
        finally:
            broker.stop()


def admin_settings() -> dict:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": USER,
            "sasl.password": PASSWORD}


def test_a_query_with_the_key_and_sasl_login_writes_and_reads_a_secured_topic(spark, secured):
    cluster, broker = secured
    rows = [(f"k{i}", f"v{i}") for i in range(50)]
    (spark.createDataFrame(rows, "key string, value string").write.format("walkit")
     .option("metadata", cluster.metadata_url).option("topic", "vault").option("key", cluster.client_key)
     .option("kafka.security.protocol", "SASL_PLAINTEXT").option("kafka.sasl.mechanism", "PLAIN")
     .option("kafka.sasl.jaas.config", JAAS).mode("append").save())
    back = (spark.read.format("walkit").option("metadata", cluster.metadata_url).option("topic", "vault")
            .option("key", cluster.client_key).load().collect())
    assert sorted((r.key.decode(), r.value.decode()) for r in back) == sorted(rows)


def test_without_the_sasl_login_a_write_is_refused_and_without_the_key_a_read(spark, secured):
    cluster, broker = secured
    frame = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception, match="producing to topic 'vault' failed"):
        (frame.write.format("walkit").option("metadata", cluster.metadata_url).option("topic", "vault")
         .option("key", cluster.client_key).option("timeout", "5").mode("append").save())
    with pytest.raises(Exception):
        (spark.read.format("walkit").option("metadata", cluster.metadata_url).option("topic", "vault")
         .option("timeout", "5").load().collect())


def test_credentials_come_from_the_environment_when_no_option_gives_them(tmp_path):
    key = tmp_path / "spark.key_secret"
    key.write_text("not read here")
    found = parse_credentials({}, {"WALKIT_KEY": str(key), "WALKIT_SASL_USERNAME": USER,
                                   "WALKIT_SASL_PASSWORD": PASSWORD})
    assert (found.key, found.sasl_username, found.sasl_password) == (str(key), USER, PASSWORD)
    assert PASSWORD not in repr(found)
    with pytest.raises(OptionError, match="SASL needs a user and a password"):
        parse_credentials({"kafka.security.protocol": "SASL_PLAINTEXT"}, {})
