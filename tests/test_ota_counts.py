"""OTA verified once, copied never (issue 13 part 4), counted on a real push: real mosquitto, a real daemon
(a process), the real `edged push`.

The daemon runs with a `sitecustomize` on its PYTHONPATH that counts, in that process only, what the push
costs: every SHA-256 over the model file's bytes, every manifest parse (`parse_manifest`), every signature
check (`TrustStore.verify`), and the inodes the OTA receiver writes chunks into (`os.pwrite`). The
installed version's model file must be one of those inodes: the downloaded file itself, renamed in, not
a copy of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from tests.conftest import Broker, write_config
from tests.test_ota import MODEL, assert_consistent, build, device_doc, install, push, wait_results

COUNTER = """
import hashlib, json, os, threading
_out = os.environ["EDGEDTEST_COUNT_TO"]
_lock = threading.Lock()

def _log(kind, value=None):
    with _lock, open(_out, "a") as f:
        f.write(json.dumps([kind, value]) + "\\n")

_sha256 = hashlib.sha256

class _Counted:
    def __init__(self, data=b"", **kw):
        self._h = _sha256(data, **kw)
        self._n = len(data)
    def update(self, data):
        self._n += len(data)
        self._h.update(data)
    def _done(self):
        _log("sha256", self._n)
    def hexdigest(self):
        self._done()
        return self._h.hexdigest()
    def digest(self):
        self._done()
        return self._h.digest()
    def copy(self):
        c = _Counted.__new__(_Counted)
        c._h, c._n = self._h.copy(), self._n
        return c
    @property
    def name(self):
        return self._h.name
    @property
    def digest_size(self):
        return self._h.digest_size
    @property
    def block_size(self):
        return self._h.block_size

hashlib.sha256 = _Counted
_pwrite = os.pwrite

def _counted_pwrite(fd, data, offset):
    _log("pwrite", os.fstat(fd).st_ino)
    return _pwrite(fd, data, offset)

os.pwrite = _counted_pwrite

import edged.models.package as _package  # before anything imports parse_manifest by name
_parse = _package.parse_manifest

def _counted_parse(data, where):
    _log("parse")
    return _parse(data, where)

_package.parse_manifest = _counted_parse
import edged.models.signing as _signing
_verify = _signing.TrustStore.verify

def _counted_verify(self, *a, **kw):
    _log("verify")
    return _verify(self, *a, **kw)

_signing.TrustStore.verify = _counted_verify
"""


def events(path: Path) -> list[list[Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_one_push_hashes_each_file_once_parses_and_verifies_once_and_copies_nothing(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNTER)
    counts = tmp_path / "counts.jsonl"
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    pythonpath = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    d = start_daemon(cfg, env={"PYTHONPATH": pythonpath, "EDGEDTEST_COUNT_TO": str(counts)})
    wait_results(sub, 1)
    assert ["parse", None] in events(counts), "the counting hook did not load in the daemon"
    before = len(events(counts))  # start-up (the current version opened) is not the push's
    v2 = build(demo, tmp_path, signer, 2)
    r = push(broker, v2, "--device", "cam-01")
    assert r.returncode == 0, r.stdout + r.stderr + d.output()[-3000:]
    assert "1 of 1 device(s) succeeded" in r.stderr and "probation" in r.stderr
    wait_results(sub, 2)
    assert d.stop() == 0
    assert assert_consistent(tmp_path / "cam-01", {2}) == 2
    during = events(counts)[before:]
    model = tmp_path / "cam-01" / "models" / MODEL / "versions" / "2" / "model.onnx"
    size = model.stat().st_size
    hashes = sum(1 for kind, n in during if kind == "sha256" and n == size)
    parses = sum(1 for kind, _ in during if kind == "parse")
    verifies = sum(1 for kind, _ in during if kind == "verify")
    written = {ino for kind, ino in during if kind == "pwrite"}
    report = f"model file hashed {hashes}x, manifest parsed {parses}x, signature checked {verifies}x"
    print(report)
    assert (hashes, parses, verifies) == (1, 1, 1), report
    assert model.stat().st_ino in written, "the installed model file is a copy, not the downloaded file"
