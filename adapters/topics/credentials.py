"""walkit.adapters.topics.credentials is how a `walkit topics` client command reaches a broker and logs in.

`BrokerCredentials.parse` takes what the options and the environment gave (walkit.adapters.topics.cli,
`client_options`) and checks it; `kafka_settings()` are the kafka-python settings it means:

- SASL, with a user: `sasl_mechanism` PLAIN (the default), SCRAM-SHA-256 or SCRAM-SHA-512, what
  `walkit topics serve --sasl-users` takes;
- TLS, asked for or implied by a CA, a client certificate or its key: `security_protocol` SSL
  (SASL_SSL with a user) with one `ssl_context` (walkit.tls.client_context) that checks the
  broker's certificate against the CA (default: the system's) and the address dialled, and
  presents the client certificate to a broker that asks for one (`--tls-ca` on the broker).

kafka-python retries a refused login or a failed TLS handshake until its bootstrap timeout and
only logs why, so `check_login` first makes one connection of its own, with the same SSLContext
and kafka-python's own SASL mechanism, and turns what it learns into one `LoginRefused` line: a
refused password, an unknown CA, a host name the certificate does not name, plaintext against
a TLS port and TLS against a plaintext one, a missing SASL login or client certificate. A broker
it cannot connect to is left to kafka-python's retries (it may be starting).
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field

from walkit.adapters.topics import errors
from walkit.tls import BadTls, client_context

#: The SASL mechanisms `walkit topics serve` takes, in the order --help lists them.
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: How long `check_login` waits for each step of its exchange.
CHECK_TIMEOUT_S = 10.0

_CLIENT_ID = "walkit-topics"
#: OpenSSL's reasons for a handshake answered with bytes that are not TLS.
_NOT_TLS = {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"}
_CERT_HINT = "--tls-cert and --tls-key, or WALKIT_CLIENT_TLS_CERT and WALKIT_CLIENT_TLS_KEY"


class BadCredentials(ValueError):
    """BadCredentials are settings that cannot work together or files that cannot be used; the message says which."""


class LoginRefused(Exception):
    """LoginRefused is a broker that refused this client, or that this client refused; the message is one line."""


def sasl_refused(reason: str) -> str:
    """sasl_refused is the message for a SASL login the broker refused with `reason`."""
    return f"the broker refused the SASL login: {reason} (check --sasl-username, --sasl-mechanism and " \
           "WALKIT_SASL_PASSWORD)"


@dataclass(frozen=True)
class BrokerCredentials:
    """BrokerCredentials are a broker's address and how to log in to it (made by `parse`).

    `sasl_mechanism` is None without SASL; `context` is the client's SSLContext, None without TLS.
    """

    bootstrap: str
    host: str
    port: int
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    tls_cert: str | None = None
    context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, bootstrap: str, *, sasl_mechanism: str | None = None, sasl_username: str | None = None,
              sasl_password: str | None = None, tls: bool = False, tls_ca: str | None = None,
              tls_cert: str | None = None, tls_key: str | None = None,
              tls_key_password: str | None = None) -> "BrokerCredentials":
        """parse checks a command's settings (module doc) and builds the SSLContext; BadCredentials if they do not fit."""
        host, port = _first_address(bootstrap)
        if sasl_username is None and sasl_password is None:
            if sasl_mechanism is not None:
                raise BadCredentials(f"--sasl-mechanism {sasl_mechanism} needs a user: --sasl-username "
                                     "(WALKIT_SASL_USERNAME) and WALKIT_SASL_PASSWORD")
        elif not sasl_username or not sasl_password:
            raise BadCredentials("SASL needs both a user and a password: --sasl-username (WALKIT_SASL_USERNAME) "
                                 "and WALKIT_SASL_PASSWORD (or --sasl-password)")
        else:
            sasl_mechanism = (sasl_mechanism or "PLAIN").upper()
            if sasl_mechanism not in MECHANISMS:
                raise BadCredentials(f"--sasl-mechanism is one of {', '.join(MECHANISMS)}, not {sasl_mechanism!r}")
        if (tls_key is not None or tls_key_password is not None) and tls_cert is None:
            raise BadCredentials("--tls-key and --tls-key-password (WALKIT_CLIENT_TLS_KEY, "
                                 "WALKIT_CLIENT_TLS_KEY_PASSWORD) need --tls-cert (WALKIT_CLIENT_TLS_CERT), the "
                                 "client certificate of that key")
        context = None
        if tls or tls_ca is not None or tls_cert is not None:
            try:
                context = client_context(tls_ca, tls_cert, tls_key, tls_key_password)
            except BadTls as exc:
                raise BadCredentials(str(exc)) from None
        return cls(bootstrap, host, port, sasl_mechanism, sasl_username, sasl_password, tls_cert, context)

    @property
    def address(self) -> str:
        """address is the broker `check_login` dials, HOST:PORT."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def security_protocol(self) -> str:
        """security_protocol is Kafka's name for the connection: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
        tls = "SSL" if self.context is not None else "PLAINTEXT"
        return tls if self.sasl_mechanism is None else f"SASL_{tls}"

    def kafka_settings(self) -> dict:
        """kafka_settings are kafka-python's connection settings (its clients' keyword arguments)."""
        settings = {"bootstrap_servers": self.bootstrap, "security_protocol": self.security_protocol}
        if self.context is not None:
            settings["ssl_context"] = self.context
        if self.sasl_mechanism is not None:
            settings.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                            sasl_plain_password=self.sasl_password)
        return settings


def _first_address(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0].strip()
    host, colon, port = first.rpartition(":")
    if not colon or host.count(":") and not host.startswith("["):
        host, port = first, "9092"                      # Kafka's default port
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        raise BadCredentials(f"--bootstrap {bootstrap!r}: give HOST:PORT") from None


# -- the login check -----------------------------------------------------------------------------

class _Closed(Exception):
    """_Closed is a broker that closed the connection before it answered."""


def check_login(credentials: BrokerCredentials, timeout: float = CHECK_TIMEOUT_S) -> None:
    """check_login connects to the first bootstrap broker as `credentials` say, and logs in with SASL
    or sends the requests a client sends first (ApiVersions, Metadata). It returns once that
    worked or when nothing listens there; otherwise it raises LoginRefused saying why."""
    where = credentials.address
    try:
        raw = socket.create_connection((credentials.host, credentials.port), timeout=timeout)
    except OSError:
        return                                          # kafka-python retries until its timeout, then says so
    with raw:
        try:
            if credentials.context is None:
                _plaintext_exchange(raw, credentials, timeout)
            else:
                with _tls_handshake(raw, credentials, timeout) as sock:
                    try:
                        _exchange(sock, credentials)
                    except ssl.SSLError as exc:         # the broker's alert about the client certificate
                        raise _refused_handshake(exc, credentials) from None
                    except _Closed:
                        raise LoginRefused(_closed_over_tls(credentials)) from None
        except (socket.timeout, TimeoutError):
            raise LoginRefused(f"the broker at {where} did not answer within {timeout:g} s") from None


def _plaintext_exchange(sock: socket.socket, credentials: BrokerCredentials, timeout: float) -> None:
    try:
        _exchange(sock, credentials)
    except _Closed as exc:
        if _serves_tls(credentials, timeout):
            raise LoginRefused(f"the broker at {credentials.address} serves TLS: give --tls (WALKIT_CLIENT_TLS=1), "
                               "and --tls-ca FILE (WALKIT_CLIENT_TLS_CA) unless a system CA signed its "
                               "certificate") from None
        raise LoginRefused(f"the broker at {credentials.address} closed the connection {exc}") from None


def _tls_handshake(raw: socket.socket, credentials: BrokerCredentials, timeout: float) -> ssl.SSLSocket:
    where = credentials.address
    try:
        return credentials.context.wrap_socket(raw, server_hostname=credentials.host)
    except ssl.SSLCertVerificationError as exc:
        raise LoginRefused(f"the TLS certificate of the broker at {where} is not accepted: {exc.verify_message} "
                           f"(--tls-ca or WALKIT_CLIENT_TLS_CA names the CA that signed it; it must name "
                           f"{credentials.host})") from None
    except (ssl.SSLError, ConnectionError) as exc:
        not_tls = isinstance(exc, (ssl.SSLEOFError, ConnectionError)) or exc.reason in _NOT_TLS
        if not_tls and _answers_plaintext(credentials, timeout):
            raise LoginRefused(f"the broker at {where} does not serve TLS: drop --tls, --tls-ca, --tls-cert and "
                               "the WALKIT_CLIENT_TLS variables") from None
        if isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError):
            raise _refused_handshake(exc, credentials) from None
        raise LoginRefused(f"the broker at {where} closed the connection during the TLS handshake "
                           f"({type(exc).__name__})") from None


def _refused_handshake(exc: ssl.SSLError, credentials: BrokerCredentials) -> LoginRefused:
    reason = exc.reason or str(exc)
    where = credentials.address
    if "CERTIFICATE_REQUIRED" in reason:
        return LoginRefused(f"the broker at {where} requires a client certificate: give {_CERT_HINT}")
    if any(alert in reason for alert in ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN")):
        return LoginRefused(f"the broker at {where} refused the client certificate {credentials.tls_cert} "
                            f"({reason}): a CA the broker trusts (its --tls-ca) must have signed it")
    return LoginRefused(f"the TLS handshake with the broker at {where} failed: {reason}")


def _closed_over_tls(credentials: BrokerCredentials) -> str:
    """_closed_over_tls explains a broker that closed a TLS connection without a word: with TLS 1.3 a
    server checks the client's certificate after the client's handshake is done, and Python's
    asyncio servers close without sending the alert."""
    where = credentials.address
    if credentials.tls_cert is None:
        return f"the broker at {where} closed the TLS connection without answering: it may require a client " \
               f"certificate ({_CERT_HINT})"
    return f"the broker at {where} closed the TLS connection without answering: it may not accept the client " \
           f"certificate {credentials.tls_cert} (a CA the broker trusts, its --tls-ca, must have signed it)"


def _exchange(sock, credentials: BrokerCredentials) -> None:
    """_exchange logs in with SASL, or sends ApiVersions and Metadata as an anonymous client does."""
    from kafka.net.sasl import get_sasl_mechanism
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
    from kafka.protocol.sasl import (
        SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
    )
    where = credentials.address
    if credentials.sasl_mechanism is None:
        _call(sock, ApiVersionsRequest(version=0), ApiVersionsResponse, "without answering ApiVersions")
        try:
            _call(sock, MetadataRequest(version=1, topics=[]), MetadataResponse, "")
        except _Closed:
            raise LoginRefused(f"the broker at {where} requires a SASL login: give --sasl-username "
                               "(WALKIT_SASL_USERNAME) and WALKIT_SASL_PASSWORD") from None
        return
    mechanism = credentials.sasl_mechanism
    answer = _call(sock, SaslHandshakeRequest(version=1, mechanism=mechanism), SaslHandshakeResponse,
                   "without answering SaslHandshake")
    if answer.error_code == errors.ILLEGAL_SASL_STATE and not answer.mechanisms:
        raise LoginRefused(f"the broker at {where} does not use SASL: drop --sasl-username and "
                           "WALKIT_SASL_USERNAME")
    if answer.error_code or mechanism not in answer.mechanisms:
        raise LoginRefused(f"the broker at {where} does not take SASL mechanism {mechanism}; it takes "
                           f"{', '.join(answer.mechanisms) or 'none'} (--sasl-mechanism, WALKIT_SASL_MECHANISM)")
    login = get_sasl_mechanism(mechanism)(host=credentials.host, **credentials.kafka_settings())
    while not login.is_done():
        answer = _call(sock, SaslAuthenticateRequest(version=1, auth_bytes=login.auth_bytes()),
                       SaslAuthenticateResponse, "during the SASL login")
        if answer.error_code:
            raise LoginRefused(sasl_refused(answer.error_message))
        try:
            login.receive(answer.auth_bytes)
        except ValueError as exc:                       # the server's SCRAM signature does not check
            raise LoginRefused(f"the broker at {where} failed the SCRAM check of the server: {exc}") from None
    if not login.is_authenticated():
        raise LoginRefused(sasl_refused("the exchange ended unfinished"))


def _call(sock, request, response_class, closed: str):
    """_call sends `request` and decodes the answer; _Closed(`closed`) if the broker closes instead."""
    request.with_header(correlation_id=1, client_id=_CLIENT_ID)
    sock.sendall(bytes(request.encode(header=True, framed=True)))
    size = int.from_bytes(_receive(sock, 4, closed), "big")
    return response_class.decode(_receive(sock, size, closed), version=request.API_VERSION, header=True)


def _receive(sock, count: int, closed: str) -> bytes:
    data = b""
    while len(data) < count:
        try:
            chunk = sock.recv(count - len(data))
        except (ConnectionResetError, BrokenPipeError):
            chunk = b""
        if not chunk:
            raise _Closed(closed)
        data += chunk
    return data


def _serves_tls(credentials: BrokerCredentials, timeout: float) -> bool:
    """_serves_tls is whether a TLS handshake on a new connection gets a TLS answer (the certificate unchecked)."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((credentials.host, credentials.port), timeout=timeout) as raw, \
                probe.wrap_socket(raw, server_hostname=credentials.host):
            return True
    except ssl.SSLEOFError:
        return False
    except ssl.SSLError:                                # an alert: the other end speaks TLS
        return True
    except OSError:
        return False


def _answers_plaintext(credentials: BrokerCredentials, timeout: float) -> bool:
    """_answers_plaintext is whether a new plaintext connection gets an answer to ApiVersions."""
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
    try:
        with socket.create_connection((credentials.host, credentials.port), timeout=timeout) as sock:
            _call(sock, ApiVersionsRequest(version=0), ApiVersionsResponse, "")
            return True
    except (_Closed, OSError, ValueError):
        return False
