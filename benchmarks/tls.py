"""A self-signed certificate for loopback TLS servers (the push stand-ins, the tests' receivers)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TlsMaterial:
    cafile: str  # the self-signed certificate; trust it to verify the server
    server_context: ssl.SSLContext
    sni_names: list[str | None]  # the server name each TLS client sent

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cafile)


def make_tls_material(directory: str | os.PathLike | None = None, hostname: str = "localhost") -> TlsMaterial:
    """A self-signed certificate for `hostname` and 127.0.0.1, and a server context using it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = Path(directory or tempfile.mkdtemp(prefix="omnipost-tls-"))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = dt.datetime.now(dt.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(hostname), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    sni_names: list[str | None] = []
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_path, key_path)
    server.sni_callback = lambda sock, server_name, ctx: sni_names.append(server_name)
    return TlsMaterial(str(cert_path), server, sni_names)
