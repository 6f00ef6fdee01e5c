"""``edged certs``: a small CA for a site's broker and its devices (TLS with client certificates).

    edged certs ca --dir pki                      pki/ca.crt, pki/ca.key (keep ca.key off the devices) and
                                                  pki/crl.pem, an empty CRL: mosquitto's crlfile exists from day one
    edged certs server broker.site 10.0.0.2 --dir pki    pki/server.crt/.key for mosquitto
    edged certs device orin-07 --dir pki          pki/orin-07.crt/.key: CN = the device id, which
                                                  mosquitto uses as the user name (use_identity_as_username)
    edged certs backend --dir pki                 pki/backend.crt/.key: the ACL's `backend` principal
                                                  (edged push, edged watch, the site's consumers)
    edged certs acl [--prefix edged]              mosquitto's ACL for a topic prefix (the shipped
                                                  systemd/mosquitto/edged.acl is `edged certs acl`)
    edged certs revoke pki/orin-07.crt --dir pki  add it to pki/crl.pem (mosquitto's crlfile)
    edged certs crl --dir pki                     sign pki/crl.pem again with a fresh next update
    edged certs status --dir pki                  what expires when; exit 1 if anything is within --warn-days

Keys are ECDSA P-256; files holding private keys are written with mode 0600, except the broker's
key: mosquitto started as root drops to the `mosquitto` user before it loads its certificates, so
server.key is 0640 and group `mosquitto` where that group exists (else `share_with_broker` says what
to chown). A CRL whose next update has passed makes mosquitto refuse every client certificate:
`status` warns ahead of it and `crl` renews it (a cron line or timer, docs/operator.md "Broker security").
"""

from __future__ import annotations

import datetime as dt
import grp
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edged.errors import CertError as CertError  # defined in edged.errors, importable here as before

from .acl import site_acl

CRL_DAYS = 365  # a CRL's next update: mosquitto refuses every client once it has passed
BROKER_GROUP = "mosquitto"  # the user and group mosquitto drops to when started as root
# a client's CN is its MQTT user name and a topic level (edged/<CN>/...); these names are files of the CA
_CLIENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_RESERVED = {"ca", "server", "crl", "_push"}
BACKEND = "backend"  # edged.acl's `user backend`: reads every device, sends commands and OTA chunks


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
    write_crl(folder)  # the shipped edged.conf names a crlfile: mosquitto does not start without one
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
    if not hosts and (not _CLIENT_NAME.match(name) or name in _RESERVED):
        raise CertError(
            f"{name!r} cannot be a client's name: it is its MQTT user name and a topic level (1-64 letters, "
            f"digits, '_', '.', '-'), and not one of {', '.join(sorted(_RESERVED))}"
        )
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


def make_device(folder: Path, device_id: str, days: int = 825) -> Path:
    """A device's certificate (CN = its device id). `backend` is refused: the shipped ACL gives that
    user name the backend's rights (every device's topics, commands, OTA chunks); `make_backend` issues it."""
    if device_id == BACKEND:
        raise CertError(
            f"a device cannot be named {BACKEND!r}: edged.acl gives that user the backend's rights "
            f"(reads every device, sends commands); issue the backend's certificate with `edged certs backend`"
        )
    return make_cert(folder, device_id, days=days)


def make_backend(folder: Path, days: int = 825) -> Path:
    """The backend's certificate (CN = backend, edged.acl's `user backend`): `edged push`, `edged watch`
    and the site's consumers connect with it."""
    return make_cert(folder, BACKEND, days=days)


def share_with_broker(key_path: Path, group: str = BROKER_GROUP) -> str:
    """Make the broker's key readable by `group` (mode 0640), which mosquitto runs as once it has
    dropped root; returns a sentence saying what was done, or what to do where it could not be."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return (
            f"{key_path} is 0600: no group {group!r} here; on the broker, install it readable by the user "
            f"mosquitto runs as: install -m 0640 -g {group} {key_path.name} /etc/mosquitto/certs/"
        )
    try:
        os.chown(key_path, -1, gid)
    except PermissionError:
        return (
            f"{key_path} is 0600: only root may give it to group {group!r}; "
            f"run: chgrp {group} {key_path} && chmod 0640 {key_path}"
        )
    os.chmod(key_path, 0o640)
    return f"{key_path} is 0640, group {group!r} (mosquitto reads it after dropping root)"


def _load_crl(crl_path: Path) -> x509.CertificateRevocationList:
    try:
        return x509.load_pem_x509_crl(crl_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CertError(f"{crl_path}: not a PEM CRL ({exc})") from exc


def write_crl(
    folder: Path, days: int = CRL_DAYS, add: x509.Certificate | None = None, valid_from: dt.datetime | None = None
) -> Path:
    """Sign the CA's CRL (`crl.pem`) again: the certificates it revokes (plus `add`), a fresh last
    update and a next update `days` out. Mosquitto reads it at start and on SIGHUP."""
    ca, ca_key = _load_ca(folder)
    crl_path = folder / "crl.pem"
    revoked = list(_load_crl(crl_path)) if crl_path.exists() else []
    start = valid_from or _now()
    builder = x509.CertificateRevocationListBuilder().issuer_name(ca.subject).last_update(start)
    builder = builder.next_update(start + dt.timedelta(days=days))
    for r in revoked:
        builder = builder.add_revoked_certificate(r)
    if add is not None and all(r.serial_number != add.serial_number for r in revoked):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(add.serial_number).revocation_date(_now()).build()
        )
    _write(crl_path, builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return crl_path


def revoke(folder: Path, cert_path: Path) -> Path:
    """Add a certificate to the CA's CRL (`crl.pem`, for mosquitto's `crlfile`)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CertError(f"{cert_path}: not a PEM certificate: {exc}") from exc
    return write_crl(folder, add=cert)


@dataclass(frozen=True)
class Expiry:
    """One dated thing in a CA's folder: the CA, its CRL (its next update), or a certificate it issued."""

    path: Path
    what: str  # "CA", "CRL", "server", "client <CN>"
    ends: dt.datetime
    revoked: bool = False

    def days_left(self, now: dt.datetime) -> float:
        return (self.ends - now).total_seconds() / 86400

    def line(self, now: dt.datetime, warn_days: int) -> str:
        left = self.days_left(now)
        when = f"{self.ends:%Y-%m-%d %H:%M} UTC"
        if self.revoked:
            state = "revoked"
        elif left < 0:
            state = (
                f"EXPIRED {-left:.0f} days ago" if self.what != "CRL" else f"PAST its next update {-left:.0f} days ago"
            )
        elif left <= warn_days:
            state = f"WARN: ends in {left:.1f} days"
        else:
            state = f"ok, {left:.0f} days left"
        return f"{self.what:<24} {when}  {state}  ({self.path.name})"

    def needs_action(self, now: dt.datetime, warn_days: int) -> bool:
        return not self.revoked and self.days_left(now) <= warn_days


def status(folder: Path) -> list[Expiry]:
    """The CA, the CRL and every certificate in `folder`, with when each ends. A missing or foreign
    CRL is an error (mosquitto would not start, or would refuse every client)."""
    ca, _ = _load_ca(folder)
    crl_path = folder / "crl.pem"
    if not crl_path.exists():
        raise CertError(
            f"{crl_path} is missing: mosquitto (crlfile) does not start without it; "
            f"run `edged certs crl --dir {folder}`"
        )
    crl = _load_crl(crl_path)
    if not crl.is_signature_valid(ca.public_key()):  # type: ignore[arg-type]
        raise CertError(f"{crl_path} is not signed by {folder / 'ca.crt'}; run `edged certs crl --dir {folder}`")
    if crl.next_update_utc is None:
        raise CertError(f"{crl_path} has no next update")
    found = [Expiry(folder / "ca.crt", "CA", ca.not_valid_after_utc), Expiry(crl_path, "CRL", crl.next_update_utc)]
    for path in sorted(folder.glob("*.crt")):
        if path.name == "ca.crt":
            continue
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except ValueError as exc:
            raise CertError(f"{path}: not a PEM certificate: {exc}") from exc
        try:  # ours always carry both; a certificate made elsewhere and dropped here may not
            server = (
                ExtendedKeyUsageOID.SERVER_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
            )
        except x509.ExtensionNotFound:
            server = False
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        what = "server" if server else f"client {cns[0].value!s}" if cns else f"certificate {path.stem}"
        revoked = crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None
        found.append(Expiry(path, what, cert.not_valid_after_utc, revoked))
    return found


_PREFIX_LEVEL = re.compile(r"^[A-Za-z0-9_.-]+$")


def acl(prefix: str = "edged") -> str:
    """mosquitto's ACL for an edged site whose devices use `prefix` (mqtt.topic_prefix), made from the topic table
    (deploy/acl.py). systemd/mosquitto/edged.acl is acl("edged") (tests/test_site.py checks they agree and runs
    mosquitto with it)."""
    levels = prefix.split("/")
    if any(not _PREFIX_LEVEL.match(level) for level in levels) or levels[0] == BACKEND:
        raise CertError(
            f"{prefix!r} cannot be a topic prefix in an ACL: topic levels of letters, digits, '_', '.', '-' "
            f"joined by '/', not starting with {BACKEND!r} (the backend's own topics)"
        )
    return site_acl(prefix)
