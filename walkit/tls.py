"""walkit.tls builds the TLS settings of walkit's client-facing servers (the KV server, the topics broker) and their clients.

    context = server_context("server.pem", "server.key", ca="clients-ca.pem")
    await loop.create_server(factory, host, port, ssl=context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)

A server given a certificate and its key serves TLS 1.2 or later on its port (Python's `ssl`
defaults: no compression, the system's cipher choice). With `ca` it also asks every client for a
certificate and accepts only those the CA signed (mutual TLS); without it any client may connect
and proves who it is some other way (AUTH, SASL). A failed handshake closes that connection only:
asyncio reports it to nobody but that connection, and the server keeps accepting.

`client_context(ca, cert, key)` is the other end, for walkit's own clients of those servers (the
`walkit topics` commands): it checks the server's certificate and name, and presents a client
certificate when given one.
"""

from __future__ import annotations

import ssl

#: How long a new connection may take to finish its TLS handshake before it is closed (asyncio's
#: default is 60 s: a client that connects and sends nothing would hold a connection that long).
HANDSHAKE_TIMEOUT_S = 10.0


class BadTls(ValueError):
    """BadTls is a certificate, key or CA file that cannot be used; its message names the file and why."""


def server_context(cert: str, key: str | None = None, ca: str | None = None) -> ssl.SSLContext:
    """server_context is a server's SSLContext for certificate chain `cert` and private key `key`
    (None: the key is in `cert`'s file), requiring client certificates signed by `ca` if given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert, key)
    if ca is not None:
        _load_ca(context, ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: str | None = None, cert: str | None = None, key: str | None = None,
                   key_password: str | None = None) -> ssl.SSLContext:
    """client_context is a client's SSLContext (TLS 1.2 or later): it accepts a server whose certificate
    `ca` signed (None: one of the system's CAs) and names the address dialled, and presents certificate
    `cert` with key `key` (None: in `cert`'s file; encrypted: give `key_password`) to a server that asks
    for one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)       # verifies the certificate and the host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is None:
        context.load_default_certs()
    else:
        _load_ca(context, ca)
    if cert is not None:
        _load_chain(context, cert, key, key_password)
    return context


def _load_chain(context: ssl.SSLContext, cert: str, key: str | None, password: str | None = None) -> None:
    try:
        context.load_cert_chain(cert, key, password)
    except FileNotFoundError as exc:
        raise BadTls(f"the TLS certificate or key file {exc.filename or cert} does not exist") from None
    except (ssl.SSLError, OSError) as exc:
        raise BadTls(f"cannot use the TLS certificate {cert} with the key {key or cert}: {exc}") from None


def _load_ca(context: ssl.SSLContext, ca: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except FileNotFoundError:
        raise BadTls(f"the TLS CA file {ca} does not exist") from None
    except (ssl.SSLError, OSError) as exc:
        raise BadTls(f"cannot read the TLS CA file {ca}: {exc}") from None


def options_context(cert: str | None, key: str | None, ca: str | None) -> ssl.SSLContext | None:
    """options_context is the SSLContext of a server's --tls-cert, --tls-key and --tls-ca, None without
    them; BadTls when only some are given (a key or a CA without a certificate)."""
    if cert is None:
        if key is not None or ca is not None:
            raise BadTls("--tls-key and --tls-ca need --tls-cert (the server's certificate)")
        return None
    return server_context(cert, key, ca)


def tls_options(fn):
    """tls_options gives a server command (click) --tls-cert, --tls-key and --tls-ca, for options_context."""
    import click
    fn = click.option("--tls-ca", envvar="WALKIT_TLS_CA", default=None, metavar="FILE",
                      type=click.Path(dir_okay=False),
                      help="Require client certificates signed by the CA certificates of FILE (PEM) "
                           "[env WALKIT_TLS_CA].")(fn)
    fn = click.option("--tls-key", envvar="WALKIT_TLS_KEY", default=None, metavar="FILE",
                      type=click.Path(dir_okay=False),
                      help="The private key of --tls-cert (PEM, unencrypted) [default: in the certificate's "
                           "file] [env WALKIT_TLS_KEY].")(fn)
    return click.option("--tls-cert", envvar="WALKIT_TLS_CERT", default=None, metavar="FILE",
                        type=click.Path(dir_okay=False),
                        help="Serve TLS only, with this certificate chain (PEM) [default: plaintext] "
                             "[env WALKIT_TLS_CERT].")(fn)
