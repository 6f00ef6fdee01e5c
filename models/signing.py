"""Ed25519 signing keys, ``manifest.sig``, and the device's pinned public keys.

A key id is the first 16 hex digits of the sha256 of the raw 32-byte public key. ``manifest.sig`` is
a small JSON document (schema ``edged.sig/1``) naming the key id and carrying the base64 signature
over the exact bytes of ``manifest.json``; nothing is canonicalised, so what was signed is what is
verified. A device trusts the public keys in its keys folder (``<id>.pub``, one per file), and only
those: an unknown key id is refused before any signature arithmetic.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from edged.errors import Code, PackageError

SIG_SCHEMA = "edged.sig/1"
SIG_FILE = "manifest.sig"
MAX_SIG_BYTES = 4096


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


@dataclass(frozen=True)
class SigningKey:
    key_id: str
    private_pem: bytes

    def sign(self, manifest_bytes: bytes) -> bytes:
        """The contents of manifest.sig for these exact manifest bytes."""
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        key = load_pem_private_key(self.private_pem, password=None)
        signature = key.sign(manifest_bytes)  # type: ignore[call-arg,union-attr]
        doc = {
            "schema": SIG_SCHEMA,
            "alg": "ed25519",
            "key_id": self.key_id,
            "sig": base64.b64encode(signature).decode(),
        }
        return (json.dumps(doc) + "\n").encode()


def generate_key(directory: Path, name: str | None = None) -> tuple[Path, Path]:
    """A new Ed25519 key pair: `<id>.key` (private, mode 0600) and `<id>.pub` (raw public key, base64).
    Returns the two paths. Refuses to overwrite."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    kid = name or key_id(raw)
    directory.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = directory / f"{kid}.key", directory / f"{kid}.pub"
    for p in (key_path, pub_path):
        if p.exists():
            raise PackageError(f"{p}: exists; refusing to overwrite a key", code=Code.KEY_EXISTS)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_path.write_text(base64.b64encode(raw).decode() + "\n")
    return key_path, pub_path


def load_signing_key(path: Path) -> SigningKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        pem = path.read_bytes()
        key = serialization.load_pem_private_key(pem, password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise PackageError(f"{path}: not a readable Ed25519 private key: {exc}", code=Code.KEY_INVALID) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise PackageError(f"{path}: not an Ed25519 key", code=Code.KEY_INVALID)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SigningKey(key_id(raw), pem)


class TrustStore:
    """The public keys a device accepts, by key id: every `*.pub` file in a folder."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        self.keys = keys

    @classmethod
    def load(cls, directory: Path) -> TrustStore:
        keys: dict[str, bytes] = {}
        if directory.is_dir():
            for p in sorted(directory.glob("*.pub")):
                try:
                    raw = base64.b64decode(p.read_text().strip(), validate=True)
                except (OSError, ValueError) as exc:
                    raise PackageError(f"{p}: not a base64 public key: {exc}", code=Code.KEY_INVALID) from exc
                if len(raw) != 32:
                    raise PackageError(f"{p}: {len(raw)} bytes, an Ed25519 public key has 32", code=Code.KEY_INVALID)
                keys[key_id(raw)] = raw
        return cls(keys)

    def verify(self, manifest_bytes: bytes, sig_bytes: bytes, where: str, signed: str = "manifest.json") -> str:
        """Check manifest.sig against these exact bytes; return the key id. Unknown key and bad
        signature are distinct errors (`unknown_key`, `bad_signature`). `signed`: what the bytes are, as the
        error names them (a remote config document's, too: the same ``edged.sig/1`` over its exact bytes)."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        if len(sig_bytes) > MAX_SIG_BYTES:
            raise PackageError(
                f"{where}: {SIG_FILE} is {len(sig_bytes)} bytes, over {MAX_SIG_BYTES}", code=Code.TOO_LARGE
            )
        try:
            doc = json.loads(sig_bytes)
            kid, alg, sig = doc["key_id"], doc["alg"], base64.b64decode(doc["sig"], validate=True)
            if doc.get("schema") != SIG_SCHEMA or not isinstance(kid, str):
                raise ValueError(f"schema is not {SIG_SCHEMA}")
        except RecursionError as exc:  # json.loads recurses once per level: a deeply nested document
            raise PackageError(f"{where}: {SIG_FILE} is malformed: nested too deeply", code=Code.BAD_SIGNATURE) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise PackageError(f"{where}: {SIG_FILE} is malformed: {exc}", code=Code.BAD_SIGNATURE) from exc
        if alg != "ed25519":
            raise PackageError(
                f"{where}: signature algorithm {alg!r}, only ed25519 is accepted", code=Code.BAD_SIGNATURE
            )
        raw = self.keys.get(kid)
        if raw is None:
            raise PackageError(
                f"{where}: signed by key {kid}, which this device does not trust "
                f"(trusted: {', '.join(sorted(self.keys)) or 'none'})",
                code=Code.UNKNOWN_KEY,
            )
        try:
            Ed25519PublicKey.from_public_bytes(raw).verify(sig, manifest_bytes)
        except InvalidSignature as exc:
            raise PackageError(
                f"{where}: the signature by key {kid} does not match {signed} (altered after signing?)",
                code=Code.BAD_SIGNATURE,
            ) from exc
        return kid
