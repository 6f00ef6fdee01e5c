"""``edged certs``: a small CA for a site's broker and its devices (TLS with client certificates).

    edged certs ca --dir pki                      pki/ca.crt, pki/ca.key (keep ca.key off the devices)
    edged certs server broker.site 10.0.0.2 --dir pki    pki/server.crt/.key for mosquitto
    edged certs device orin-07 --dir pki          pki/orin-07.crt/.key: CN = the device id, which
                                                  mosquitto uses as the user name (use_identity_as_username)
    edged certs revoke pki/orin-07.crt --dir pki  add it to pki/crl.pem (mosquitto's crlfile)

Keys are ECDSA P-256; files holding private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edged.errors import EdgedError


class CertError(EdgedError):
    code = "certs_failed"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _write(path: Path, data: bytes, secret: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(folder: Path, name: str = "edged CA", days: int = 3650) -> Path:
    if (folder / "ca.key").exists():
        raise CertError(f"{folder / 'ca.key'} exists; refusing to replace a CA")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write(folder / "ca.key", _key_pem(key), secret=True)
    _write(folder / "ca.crt", cert.public_bytes(serialization.Encoding.PEM))
    return folder / "ca.crt"


def _load_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise CertError(
            f"{folder}: no usable ca.crt / ca.key ({exc}); run `edged certs ca --dir {folder}` first"
        ) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{folder / 'ca.key'}: not an EC key")
    return cert, key


def make_cert(
    folder: Path,
    name: str,
    hosts: list[str] | None = None,
    days: int = 825,
    valid_from: dt.datetime | None = None,
    out: Path | None = None,
) -> Path:
    """A certificate signed by the CA in `folder`: a client (CN = name) or, with `hosts`, a server."""
    ca, ca_key = _load_ca(folder)
    key = ec.generate_private_key(ec.SECP256R1())
    start = valid_from or (_now() - dt.timedelta(minutes=5))
    usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for h in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                names.append(x509.DNSName(h))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out = out or folder
    _write(out / f"{name}.key", _key_pem(key), secret=True)
    _write(out / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
    return out / f"{name}.crt"


def revoke(folder: Path, cert_path: Path) -> Path:
    """Add a certificate to the CA's CRL (`crl.pem`, for mosquitto's `crlfile`)."""
    ca, ca_key = _load_ca(folder)
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CertError(f"{cert_path}: not a PEM certificate: {exc}") from exc
    crl_path = folder / "crl.pem"
    revoked = []
    if crl_path.exists():
        revoked = list(x509.load_pem_x509_crl(crl_path.read_bytes()))
    builder = x509.CertificateRevocationListBuilder().issuer_name(ca.subject).last_update(_now())
    builder = builder.next_update(_now() + dt.timedelta(days=365))
    for r in revoked:
        builder = builder.add_revoked_certificate(r)
    if all(r.serial_number != cert.serial_number for r in revoked):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(cert.serial_number).revocation_date(_now()).build()
        )
    _write(crl_path, builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return crl_path
