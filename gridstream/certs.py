"""``gridstream certs``: a local certificate authority and certificates for a
development or test cluster (TLS and mutual TLS). Production clusters should
use certificates from their own CA; the files go where ``[security]`` says."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gridstream.auth import write_private

VALID_DAYS = 365


@dataclass(frozen=True)
class Issued:
    """Paths of one certificate and its key."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Writes a certificate, or a private key created with mode 0600 (never
    readable by others, not even between creating and restricting it)."""
    if private:
        write_private(path, data.decode())
    else:
        path.write_bytes(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def create_ca(out: Path, name: str = "gridstream local CA") -> Issued:
    """A self-signed CA (ca.pem, ca-key.pem)."""
    out.mkdir(parents=True, exist_ok=True)
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    issued = Issued(out / "ca.pem", out / "ca-key.pem")
    _write(issued.cert, cert.public_bytes(serialization.Encoding.PEM))
    _write(issued.key, _pem_key(key), private=True)
    return issued


def issue(ca: Issued, out: Path, name: str, hosts: list[str]) -> Issued:
    """A certificate for ``name`` signed by ``ca``, valid as server and client,
    with ``hosts`` (names and IP addresses) as subject alternative names."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    key = _key()
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    issued = Issued(out / f"{name}.pem", out / f"{name}-key.pem")
    _write(issued.cert, cert.public_bytes(serialization.Encoding.PEM))
    _write(issued.key, _pem_key(key), private=True)
    return issued


def create_dev_certs(out: Path, hosts: list[str]) -> dict[str, Issued]:
    """A CA, a certificate for the cluster's services and one for clients."""
    ca = create_ca(out)
    return {"ca": ca, "node": issue(ca, out, "node", hosts),
            "client": issue(ca, out, "client", ["client"])}
