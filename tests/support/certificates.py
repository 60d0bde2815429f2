"""Certificates for the TLS tests, made with the openssl command (Debian package openssl; never skipped).

`make_certificates(directory)` writes a test CA, a server certificate for 127.0.0.1 and
localhost, a client certificate the CA signed (its key also encrypted with KEY_PASSWORD), and a
"rogue" client certificate signed by another CA, all P-256 keys valid for two days;
`client_hello()` is the first TLS record a Python client sends, for the handshake fuzz.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from dataclasses import dataclass

import pytest

#: The password of Certificates.client_key_encrypted.
KEY_PASSWORD = "k3y-pass"


@dataclass(frozen=True)
class Certificates:
    """Certificates are the paths of the PEM files make_certificates wrote."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    rogue_cert: str
    rogue_key: str
    client_key_encrypted: str

    def client_context(self, *, cert: bool = False, rogue: bool = False, trust: bool = True) -> ssl.SSLContext:
        """client_context is a client's SSLContext trusting the test CA (unless not `trust`), presenting
        the client certificate (`cert`) or the rogue one (`rogue`)."""
        context = ssl.create_default_context(cafile=self.ca if trust else self.rogue_cert)
        if cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        if rogue:
            context.load_cert_chain(self.rogue_cert, self.rogue_key)
        return context


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"openssl {' '.join(args)} failed:\n{done.stderr}"


def _authority(directory: str, name: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
             "-out", cert, "-days", "2", "-subj", f"/CN=walkit test {name}")
    return cert, key


def _signed(directory: str, name: str, authority: tuple[str, str], extensions: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
    request, ext = os.path.join(directory, f"{name}.csr"), os.path.join(directory, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(extensions + "\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out",
             request, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", request, "-CA", authority[0], "-CAkey", authority[1], "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", ext)
    return cert, key


def make_certificates(directory) -> Certificates:
    """make_certificates writes the test CA and certificates under `directory` (see the module doc)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed; run scripts/test.sh, which installs it", pytrace=False)
    directory = str(directory)
    ca = _authority(directory, "ca")
    rogue_ca = _authority(directory, "rogue-ca")
    server = _signed(directory, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                              "extendedKeyUsage=serverAuth")
    client = _signed(directory, "client", ca, "extendedKeyUsage=clientAuth")
    rogue = _signed(directory, "rogue", rogue_ca, "extendedKeyUsage=clientAuth")
    encrypted = os.path.join(directory, "client-encrypted.key")
    _openssl("pkey", "-in", client[1], "-aes256", "-passout", f"pass:{KEY_PASSWORD}", "-out", encrypted)
    return Certificates(ca[0], *server, *client, *rogue, encrypted)


def client_hello() -> bytes:
    """client_hello is the TLS record a Python client sends first (a ClientHello), taken without a socket."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    connection = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        connection.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()
