"""walkit.adapters.spark.credentials holds what a query needs to prove who it is to the cluster and the broker.

Two parties can ask:

- the bookies of a secured cluster (CurveZMQ keys, `walkit keys new NAME`): option `key`, the
  client's ``NAME.key_secret`` file, or the WALKIT_KEY environment variable as every walkit
  command has it. Every Spark process (driver and executors) opens its walkit Client with it,
  so the file must be readable at that path on every executor.
- a topics broker started with `--sasl-users` (writes to a topic and timestamp look-ups go
  through a broker): SASL/PLAIN with the names of Spark's Kafka source,
  `kafka.security.protocol` = SASL_PLAINTEXT, `kafka.sasl.mechanism` = PLAIN and
  `kafka.sasl.jaas.config` = ``org.apache.kafka.common.security.plain.PlainLoginModule required
  username="NAME" password="PASSWORD";``, or the WALKIT_SASL_USERNAME and WALKIT_SASL_PASSWORD
  environment variables (as `walkit topics produce` takes them).

The `kafka.ssl.*` names are accepted so a job written for Spark's Kafka source parses, but the
data source does not speak TLS to a broker yet: security.protocol SSL or SASL_SSL is an OptionError that says so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from walkit.adapters.spark.errors import OptionError

#: The credential options, read and write alike.
CREDENTIAL_OPTIONS = (
    "key", "kafka.bootstrap.servers", "kafka.security.protocol", "kafka.sasl.mechanism", "kafka.sasl.jaas.config",
    "kafka.ssl.truststore.location", "kafka.ssl.truststore.password", "kafka.ssl.truststore.type",
    "kafka.ssl.keystore.location", "kafka.ssl.keystore.password", "kafka.ssl.keystore.type", "kafka.ssl.key.password",
    "kafka.ssl.endpoint.identification.algorithm")
_JAAS_FIELD = re.compile(r'(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Credentials:
    """Credentials are a query's key file (None: an open cluster) and SASL/PLAIN user (None: no SASL)."""

    key: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    bootstrap: str | None = None

    def kafka_settings(self) -> dict:
        """kafka_settings are kafka-python's settings for the SASL login (empty without SASL)."""
        if self.sasl_username is None:
            return {}
        return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                "sasl_plain_username": self.sasl_username, "sasl_plain_password": self.sasl_password}

    def librdkafka_settings(self) -> dict:
        """librdkafka_settings are confluent-kafka's settings for the SASL login (empty without SASL)."""
        if self.sasl_username is None:
            return {}
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": self.sasl_username, "sasl.password": self.sasl_password}

    def __repr__(self) -> str:                   # the password stays out of logs and plans
        return f"Credentials(key={self.key!r}, sasl_username={self.sasl_username!r}, bootstrap={self.bootstrap!r})"


def _get(options, name: str) -> str | None:
    value = options.get(name)
    if value is None:
        value = options.get(name.lower())
    return None if value is None else str(value)


def parse_credentials(options, environ=None) -> Credentials:
    """parse_credentials reads the credential options, falling back on the environment (module doc)."""
    environ = os.environ if environ is None else environ
    key = _get(options, "key") or environ.get("WALKIT_KEY") or None
    if key is not None and not os.path.exists(key):
        raise OptionError(f"option key: no key file {key!r} (the NAME.key_secret file `walkit keys new NAME` wrote)")
    protocol = (_get(options, "kafka.security.protocol") or "").upper()
    if protocol in ("SSL", "SASL_SSL"):
        raise OptionError(f"kafka.security.protocol {protocol}: this data source does not connect to a broker over TLS yet; "
                          f"use SASL_PLAINTEXT (SASL/PLAIN) or PLAINTEXT")
    if protocol not in ("", "PLAINTEXT", "SASL_PLAINTEXT"):
        raise OptionError(f"kafka.security.protocol is PLAINTEXT or SASL_PLAINTEXT, not {protocol!r}")
    mechanism = (_get(options, "kafka.sasl.mechanism") or "PLAIN").upper()
    if mechanism != "PLAIN":
        raise OptionError(f"kafka.sasl.mechanism {mechanism}: the walkit topics broker takes PLAIN only")
    jaas = _get(options, "kafka.sasl.jaas.config")
    username = password = None
    if jaas is not None:
        fields = dict(_JAAS_FIELD.findall(jaas))
        if "PlainLoginModule" not in jaas or "username" not in fields or "password" not in fields:
            raise OptionError('kafka.sasl.jaas.config must be org.apache.kafka.common.security.plain.PlainLoginModule '
                              'required username="NAME" password="PASSWORD";')
        username, password = fields["username"], fields["password"]
    elif protocol == "SASL_PLAINTEXT" or environ.get("WALKIT_SASL_USERNAME"):
        username, password = environ.get("WALKIT_SASL_USERNAME"), environ.get("WALKIT_SASL_PASSWORD")
        if not username or not password:
            raise OptionError("SASL needs a user and a password: option kafka.sasl.jaas.config, or the environment "
                              "variables WALKIT_SASL_USERNAME and WALKIT_SASL_PASSWORD")
    if protocol == "PLAINTEXT" and jaas is not None:
        raise OptionError("kafka.sasl.jaas.config given with kafka.security.protocol PLAINTEXT: use SASL_PLAINTEXT")
    return Credentials(key=key, sasl_username=username, sasl_password=password,
                       bootstrap=_get(options, "kafka.bootstrap.servers"))
