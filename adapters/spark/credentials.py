"""walkit.adapters.spark.credentials holds what a query needs to prove who it is to the cluster and the broker.

Two parties can ask:

- the bookies of a secured cluster (CurveZMQ keys, `walkit keys new NAME`): option `key`, the
  client's ``NAME.key_secret`` file, or the WALKIT_KEY environment variable as every walkit
  command has it. Every Spark process (driver and executors) opens its walkit Client with it,
  so the file must be readable at that path on every executor.
- a topics broker (writes to a topic and timestamp look-ups go through a broker), with the names
  of Spark's Kafka source:

  - SASL, when the broker was started with `--sasl-users`: `kafka.security.protocol` =
    SASL_PLAINTEXT or SASL_SSL, `kafka.sasl.mechanism` = PLAIN (default), SCRAM-SHA-256 or
    SCRAM-SHA-512, and `kafka.sasl.jaas.config` = ``org.apache.kafka.common.security.plain.PlainLoginModule
    required username="NAME" password="PASSWORD";`` (``...scram.ScramLoginModule`` for SCRAM);
    or the environment variables of the `walkit topics` commands, WALKIT_SASL_USERNAME,
    WALKIT_SASL_PASSWORD and WALKIT_SASL_MECHANISM, which turn SASL on by themselves.
  - TLS, when the broker was started with `--tls-cert`: `kafka.security.protocol` = SSL or
    SASL_SSL and PEM files under librdkafka's names (the producer is librdkafka's),
    `kafka.ssl.ca.location` (the CA that signed the broker's certificate; default: the system's),
    `kafka.ssl.certificate.location`, `kafka.ssl.key.location` and `kafka.ssl.key.password` (a
    client certificate, for a broker started with `--tls-ca`); or the environment variables of
    the `walkit topics` commands, WALKIT_CLIENT_TLS_CA, WALKIT_CLIENT_TLS_CERT,
    WALKIT_CLIENT_TLS_KEY (and WALKIT_CLIENT_TLS_KEY_PASSWORD), which, like WALKIT_CLIENT_TLS=1,
    turn TLS on by themselves when no kafka.security.protocol is given.
    `kafka.ssl.endpoint.identification.algorithm` = "" (or none) stops the check that the
    broker's certificate names the address dialled (https, the default).

Spark's Java key store options (`kafka.ssl.truststore.*`, `kafka.ssl.keystore.*`) are refused
with a message naming the PEM options: librdkafka cannot read a JKS or PKCS#12 store.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from walkit.adapters.spark.errors import OptionError

#: Java key store options of Spark's Kafka source: recognised, so they are refused with the PEM options named.
KEY_STORE_OPTIONS = (
    "kafka.ssl.truststore.location", "kafka.ssl.truststore.password", "kafka.ssl.truststore.type",
    "kafka.ssl.keystore.location", "kafka.ssl.keystore.password", "kafka.ssl.keystore.type")
#: TLS options as librdkafka names them (after `kafka.`), with the environment variable each falls back on.
TLS_OPTIONS = {
    "kafka.ssl.ca.location": "WALKIT_CLIENT_TLS_CA",
    "kafka.ssl.certificate.location": "WALKIT_CLIENT_TLS_CERT",
    "kafka.ssl.key.location": "WALKIT_CLIENT_TLS_KEY",
    "kafka.ssl.key.password": "WALKIT_CLIENT_TLS_KEY_PASSWORD",
}
_FILES = ("kafka.ssl.ca.location", "kafka.ssl.certificate.location", "kafka.ssl.key.location")
#: The credential options, read and write alike.
CREDENTIAL_OPTIONS = (
    "key", "kafka.bootstrap.servers", "kafka.security.protocol", "kafka.sasl.mechanism", "kafka.sasl.jaas.config",
    *TLS_OPTIONS, "kafka.ssl.endpoint.identification.algorithm", *KEY_STORE_OPTIONS)
PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
MECHANISMS = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
              "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
              "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
_JAAS_FIELD = re.compile(r'(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Tls:
    """Tls is how the producer checks the broker and shows itself over TLS: PEM files (None: not given)."""

    ca: str | None = None
    certificate: str | None = None
    key: str | None = None
    key_password: str | None = None
    check_hostname: bool = True


@dataclass(frozen=True)
class Credentials:
    """Credentials are a query's key file (None: an open cluster), SASL user (None: no SASL) and TLS (None: none)."""

    key: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    bootstrap: str | None = None
    sasl_mechanism: str = "PLAIN"
    tls: Tls | None = None

    @property
    def protocol(self) -> str:
        """protocol is Kafka's security.protocol for these credentials."""
        sasl = self.sasl_username is not None
        if self.tls is None:
            return "SASL_PLAINTEXT" if sasl else "PLAINTEXT"
        return "SASL_SSL" if sasl else "SSL"

    def kafka_settings(self) -> dict:
        """kafka_settings are kafka-python's settings for the SASL login and TLS (empty without either)."""
        settings: dict = {}
        if self.protocol != "PLAINTEXT":
            settings["security_protocol"] = self.protocol
        if self.sasl_username is not None:
            settings.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                            sasl_plain_password=self.sasl_password)
        if self.tls is not None:
            settings.update(ssl_cafile=self.tls.ca, ssl_certfile=self.tls.certificate, ssl_keyfile=self.tls.key,
                            ssl_password=self.tls.key_password, ssl_check_hostname=self.tls.check_hostname)
        return settings

    def librdkafka_settings(self) -> dict:
        """librdkafka_settings are confluent-kafka's settings for the SASL login and TLS (empty without either)."""
        settings: dict = {}
        if self.protocol != "PLAINTEXT":
            settings["security.protocol"] = self.protocol
        if self.sasl_username is not None:
            settings.update({"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.sasl_username,
                             "sasl.password": self.sasl_password})
        if self.tls is not None:
            given = {"ssl.ca.location": self.tls.ca, "ssl.certificate.location": self.tls.certificate,
                     "ssl.key.location": self.tls.key, "ssl.key.password": self.tls.key_password}
            settings.update({name: value for name, value in given.items() if value is not None})
            settings["ssl.endpoint.identification.algorithm"] = "https" if self.tls.check_hostname else "none"
        return settings

    def __repr__(self) -> str:                   # the passwords stay out of logs and plans
        return (f"Credentials(key={self.key!r}, sasl_username={self.sasl_username!r}, "
                f"sasl_mechanism={self.sasl_mechanism!r}, bootstrap={self.bootstrap!r}, protocol={self.protocol!r})")


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
    for name in KEY_STORE_OPTIONS:
        if _get(options, name) is not None:
            raise OptionError(f"option {name}: this data source's producer (librdkafka) reads PEM files, not Java "
                              f"key stores: give the CA certificate as kafka.ssl.ca.location, a client certificate "
                              f"and its key as kafka.ssl.certificate.location and kafka.ssl.key.location "
                              f"(keytool -exportcert -rfc and openssl pkcs12 turn a store into PEM files)")
    protocol = (_get(options, "kafka.security.protocol") or "").upper()
    if protocol and protocol not in PROTOCOLS:
        raise OptionError(f"kafka.security.protocol is one of {', '.join(PROTOCOLS)}, not {protocol!r}")
    mechanism = (_get(options, "kafka.sasl.mechanism") or environ.get("WALKIT_SASL_MECHANISM") or "PLAIN").upper()
    if mechanism not in MECHANISMS:
        raise OptionError(f"kafka.sasl.mechanism {mechanism}: the walkit topics broker takes "
                          f"{', '.join(MECHANISMS)}")
    jaas = _get(options, "kafka.sasl.jaas.config")
    username = password = None
    if jaas is not None:
        fields = dict(_JAAS_FIELD.findall(jaas))
        module = MECHANISMS[mechanism]
        if module.rsplit(".", 1)[1] not in jaas or "username" not in fields or "password" not in fields:
            raise OptionError(f'kafka.sasl.jaas.config for {mechanism} must be {module} required '
                              f'username="NAME" password="PASSWORD";')
        username, password = fields["username"], fields["password"]
    elif protocol.startswith("SASL_") or environ.get("WALKIT_SASL_USERNAME"):
        username, password = environ.get("WALKIT_SASL_USERNAME"), environ.get("WALKIT_SASL_PASSWORD")
        if not username or not password:
            raise OptionError("SASL needs a user and a password: option kafka.sasl.jaas.config, or the environment "
                              "variables WALKIT_SASL_USERNAME and WALKIT_SASL_PASSWORD")
    if protocol in ("PLAINTEXT", "SSL") and jaas is not None:
        raise OptionError(f"kafka.sasl.jaas.config given with kafka.security.protocol {protocol}: "
                          f"use SASL_{'PLAINTEXT' if protocol == 'PLAINTEXT' else 'SSL'}")
    return Credentials(key=key, sasl_username=username, sasl_password=password,
                       bootstrap=_get(options, "kafka.bootstrap.servers"), sasl_mechanism=mechanism,
                       tls=_parse_tls(options, environ, protocol))


def _parse_tls(options, environ, protocol: str) -> Tls | None:
    """_parse_tls is the TLS settings: None unless the protocol is SSL or SASL_SSL, or, without a protocol,
    the environment asks for TLS (module doc)."""
    given = {name: _get(options, name) for name in TLS_OPTIONS}
    if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        named = [name for name, value in given.items() if value is not None]
        if named:
            raise OptionError(f"{', '.join(named)} given with kafka.security.protocol {protocol}: use "
                              f"{'SSL' if protocol == 'PLAINTEXT' else 'SASL_SSL'} to connect over TLS")
        return None
    if not protocol:                            # the environment may ask for TLS, not the options alone
        if any(value is not None for value in given.values()):
            raise OptionError("kafka.ssl.* options need kafka.security.protocol SSL or SASL_SSL")
        asked = environ.get("WALKIT_CLIENT_TLS", "").lower() in ("1", "true", "yes", "on")
        if not asked and not any(environ.get(TLS_OPTIONS[name]) for name in _FILES):
            return None
    files = {name: given[name] or environ.get(variable) or None for name, variable in TLS_OPTIONS.items()}
    for name in _FILES:
        if files[name] is not None and not os.path.isfile(files[name]):
            raise OptionError(f"option {name} (or {TLS_OPTIONS[name]}): no file {files[name]!r}")
    if (files["kafka.ssl.certificate.location"] is None) != (files["kafka.ssl.key.location"] is None):
        raise OptionError("a client certificate needs both kafka.ssl.certificate.location and kafka.ssl.key.location")
    raw = _get(options, "kafka.ssl.endpoint.identification.algorithm")
    algorithm = "https" if raw is None else raw.strip().lower()
    if algorithm not in ("https", "", "none"):
        raise OptionError(f"kafka.ssl.endpoint.identification.algorithm is https or \"\" (none), not {algorithm!r}")
    return Tls(ca=files["kafka.ssl.ca.location"], certificate=files["kafka.ssl.certificate.location"],
               key=files["kafka.ssl.key.location"], key_password=files["kafka.ssl.key.password"],
               check_hostname=algorithm == "https")
