"""Signed packages and the on-device store: every verification failure, crashes at every step (real
SIGKILL of the real CLI), and a property-based state machine over install / crash / restart /
commit / rollback."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from edged.errors import PackageError
from edged.models.demo import DemoAssets
from edged.models.package import pack_tar, verify_folder, write_package
from edged.models.signing import SigningKey, TrustStore, generate_key, load_signing_key
from edged.models.store import INSTALL_STEPS, ROLLBACK_STEPS, Store
from tests.conftest import edged_cli


def _fields(demo: DemoAssets, version: int, **extra: Any) -> dict[str, Any]:
    src = demo.packages["blazeface-back"].manifest
    fields = src.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields.update(version=version, **extra)
    return fields


def make_package(demo: DemoAssets, tmp: Path, key: SigningKey, version: int, **extra: Any) -> Path:
    """A signed tar of the demo BlazeFace model as version `version`."""
    src = demo.packages["blazeface-back"]
    folder = tmp / f"pkg-{version}-{len(list(tmp.iterdir()))}"
    files = {"model.onnx": src.model_path, "labels.txt": src.root / "labels.txt"}
    pkg = write_package(folder, _fields(demo, version, **extra), files)
    return pack_tar(pkg, tmp / f"{folder.name}.tar", key.sign(pkg.manifest_bytes))


@pytest.fixture
def keys(tmp_path: Path) -> tuple[SigningKey, Path]:
    key_path, pub = generate_key(tmp_path / "signer")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / pub.name).write_text(pub.read_text())
    return load_signing_key(key_path), key_path


def device_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "edged.yaml"
    cfg.write_text(
        f"device_id: t-01\nstate_dir: {tmp_path / 'state'}\nmodel:\n  name: blazeface-back\n"
        f"  keys_dir: {tmp_path / 'trusted'}\ncameras:\n  - name: a\n    uri: synthetic://\n"
    )
    return cfg


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root with its content hash or link target: what 'nothing changed' means."""
    out = {}
    for p in sorted(root.rglob("*")) if root.exists() else []:
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif rel != "staging" or any(p.iterdir()):  # an empty scratch folder is not a change
            out[rel] = "dir"
    return out


def test_keys_pack_verify_install_list_rollback(demo: DemoAssets, tmp_path: Path, keys) -> None:
    key, _ = keys
    cfg = device_config(tmp_path)
    v1, v2 = make_package(demo, tmp_path, key, 1), make_package(demo, tmp_path, key, 2)
    r = edged_cli("model", "verify", str(v1), "-c", str(cfg))
    assert r.returncode == 0 and "every check passed; would install" in r.stdout, r.stderr
    for v in (v1, v2):
        r = edged_cli("model", "install", str(v), "-c", str(cfg))
        assert r.returncode == 0, r.stderr
    r = edged_cli("model", "list", "-c", str(cfg), "--json")
    (m,) = json.loads(r.stdout)
    assert (m["current"], m["previous"], m["probation"], m["highest_accepted"]) == (2, 1, 2, 2)
    r = edged_cli("model", "install", str(v2), "-c", str(cfg))
    assert r.returncode == 0 and "already installed; nothing to do" in r.stdout
    r = edged_cli("model", "rollback", "blazeface-back", "-c", str(cfg))
    assert r.returncode == 0 and "rolled back from 2 (marked bad) to 1" in r.stdout
    r = edged_cli("model", "list", "-c", str(cfg))
    assert "blazeface-back: 1 (current), 2 (bad)" in r.stdout
    r = edged_cli("model", "install", str(v2), "-c", str(cfg))
    assert r.returncode == 1 and "never retried" in r.stderr
    # the daemon's model.name resolves to the store's current
    r = edged_cli("check-config", "-c", str(cfg))
    assert r.returncode == 0 and "model blazeface-back@1" in r.stdout, r.stderr


def _tamper(tar_path: Path, out: Path, edit: Any) -> Path:
    """Rewrite a package tar with edit(name, bytes) -> bytes applied to every member."""
    with tarfile.open(tar_path) as src, tarfile.open(out, "w") as dst:
        for member in src.getmembers():
            f = src.extractfile(member)
            data = edit(member.name, f.read() if f else b"")
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return out


def test_each_verification_failure_has_its_own_code_and_changes_nothing(demo: DemoAssets, tmp_path: Path, keys) -> None:
    key, _ = keys
    store = Store(tmp_path / "state")
    trust = TrustStore.load(tmp_path / "trusted")
    store.install(make_package(demo, tmp_path, key, 5), trust)
    before = snapshot(tmp_path / "state")
    stranger_key, _ = generate_key(tmp_path / "stranger")

    def flip_manifest(name: str, data: bytes) -> bytes:
        return data.replace(b'"version": 6', b'"version": 7') if name == "manifest.json" else data

    def longer_model(name: str, data: bytes) -> bytes:
        return data + b"\0" if name == "model.onnx" else data

    def other_model(name: str, data: bytes) -> bytes:
        return data[:-1] + bytes([data[-1] ^ 1]) if name == "model.onnx" else data

    six = make_package(demo, tmp_path, key, 6)
    cases = {
        "bad_signature": _tamper(six, tmp_path / "flipped.tar", flip_manifest),
        "unknown_key": make_package(demo, tmp_path, load_signing_key(stranger_key), 6),
        "expired": make_package(demo, tmp_path, key, 6, expires="2020-01-01T00:00:00Z"),
        "older_version": make_package(demo, tmp_path, key, 4),
        "incompatible": make_package(
            demo,
            tmp_path,
            key,
            6,
            compatibility={"platform": "riscv64", "tensorrt": "10.3.0"},
            kind="engine",
            model_file="model.onnx",
        ),
        "hash_mismatch": _tamper(six, tmp_path / "other.tar", other_model),
        "too_long": _tamper(six, tmp_path / "longer.tar", longer_model),
    }
    for code, pkg in cases.items():
        with pytest.raises(PackageError) as err:
            store.install(pkg, trust)
        assert err.value.code == code, (code, str(err.value))
        assert snapshot(tmp_path / "state") == before, f"{code} changed the store"
        store.recover()  # a failed install leaves at most scratch in staging; the next start wipes it
        assert snapshot(tmp_path / "state") == before
    same = store.install(make_package(demo, tmp_path, key, 5), trust)
    assert same.status == "unchanged" and snapshot(tmp_path / "state") == before
    assert verify_folder(tmp_path / "state/models/blazeface-back/current").manifest.version == 5
    # the CLI names them too
    cfg = device_config(tmp_path)
    r = edged_cli("model", "install", str(cases["expired"]), "-c", str(cfg))
    assert r.returncode == 1 and "expired at 2020-01-01" in r.stderr


def _assert_consistent(state: Path, allowed: set[int]) -> int:
    d = state / "models" / "blazeface-back"
    current = d / "current"
    assert current.is_symlink() and current.exists(), "current dangles"
    v = verify_folder(current).manifest.version
    assert v in allowed
    for which in ("previous",):
        p = d / which
        assert not p.is_symlink() or p.exists(), f"{which} dangles"
    assert not (state / "staging").exists() or not any((state / "staging").iterdir())
    assert not list(d.glob(".*.tmp")) and not list((d / "versions").glob(".*"))
    json.loads((d / "state.json").read_text())
    return v


@pytest.mark.parametrize("step", INSTALL_STEPS)
def test_sigkill_at_every_install_step(step: str, demo: DemoAssets, tmp_path: Path, keys) -> None:
    key, _ = keys
    cfg = device_config(tmp_path)
    assert edged_cli("model", "install", str(make_package(demo, tmp_path, key, 1)), "-c", str(cfg)).returncode == 0
    r = edged_cli(
        "model", "install", str(make_package(demo, tmp_path, key, 2)), "-c", str(cfg), env={"EDGEDTEST_CRASH_AT": step}
    )
    assert r.returncode == -9, (step, r.returncode, r.stderr)
    r = edged_cli("model", "list", "-c", str(cfg), "--json")  # a restart: recovery runs first
    assert r.returncode == 0, r.stderr
    v = _assert_consistent(tmp_path / "state", {1, 2})
    (m,) = json.loads(r.stdout)
    assert m["current"] == v
    # and the install can simply be repeated to completion
    r = edged_cli("model", "install", str(make_package(demo, tmp_path, key, 2)), "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    assert _assert_consistent(tmp_path / "state", {2}) == 2


@pytest.mark.parametrize("step", ROLLBACK_STEPS)
def test_sigkill_during_rollback(step: str, demo: DemoAssets, tmp_path: Path, keys) -> None:
    key, _ = keys
    cfg = device_config(tmp_path)
    for v in (1, 2):
        assert edged_cli("model", "install", str(make_package(demo, tmp_path, key, v)), "-c", str(cfg)).returncode == 0
    r = edged_cli("model", "rollback", "blazeface-back", "-c", str(cfg), env={"EDGEDTEST_CRASH_AT": step})
    assert r.returncode == -9
    assert edged_cli("model", "list", "-c", str(cfg)).returncode == 0
    v = _assert_consistent(tmp_path / "state", {1})
    state = json.loads((tmp_path / "state/models/blazeface-back/state.json").read_text())
    assert state["bad"] == [2]  # marked before the link moved; recovery finishes the rollback
    assert v == 1


def test_recovery_rebuilds_a_corrupt_state_and_a_dangling_current(demo: DemoAssets, tmp_path: Path, keys) -> None:
    key, _ = keys
    store = Store(tmp_path / "state")
    trust = TrustStore.load(tmp_path / "trusted")
    for v in (1, 2):
        store.install(make_package(demo, tmp_path, key, v), trust)
    d = tmp_path / "state/models/blazeface-back"
    (d / "state.json").write_text("{not json")
    done = Store(tmp_path / "state").recover()
    assert any("was corrupt" in line for line in done)
    assert list(d.glob("state.json.corrupt-*"))
    assert json.loads((d / "state.json").read_text())["highest_accepted"] == 2
    import shutil

    shutil.rmtree(d / "versions/2")  # current now dangles
    done = Store(tmp_path / "state").recover()
    assert "blazeface-back: current -> 1" in done
    assert verify_folder(d / "current").manifest.version == 1


# ---- property-based: install / crash / restart / commit / rollback ------------------------


class Crash(Exception):
    pass


class StoreMachine(RuleBasedStateMachine):
    """In-process: a crash is an exception raised at a chosen step, a restart is a new Store + recover()."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_at: str | None = None

    @initialize()
    def setup(self) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="store-sm-"))
        key_path, _ = generate_key(self.dir / "k")
        self.key = load_signing_key(key_path)
        self.trust = TrustStore.load(self.dir / "k")
        self.next_version = 1
        self.highest = 0
        self.bad: set[int] = set()
        self.packages: dict[int, Path] = {}
        self.store = self._open()

    def _open(self) -> Store:
        def on_step(step: str) -> None:
            if step == self.crash_at:
                self.crash_at = None
                raise Crash(step)

        return Store(self.dir / "state", keep=3, on_step=on_step)

    def _package(self, version: int) -> Path:
        if version not in self.packages:
            folder = self.dir / f"p{version}"
            folder.mkdir()
            (folder / "model.onnx").write_bytes(os.urandom(64))
            (folder / "labels.txt").write_text("face\n")
            fields = {
                "schema": "edged.model/1",
                "name": "m",
                "version": version,
                "created": "2026-11-29T00:00:00Z",
                "kind": "onnx",
                "model_file": "model.onnx",
                "input": {"name": "x", "shape": [1, 3, 8, 8], "layout": "NCHW"},
                "decoder": {"type": "classify"},
            }
            pkg = write_package(
                folder, fields, {"model.onnx": folder / "model.onnx", "labels.txt": folder / "labels.txt"}
            )
            self.packages[version] = pack_tar(pkg, self.dir / f"p{version}.tar", self.key.sign(pkg.manifest_bytes))
        return self.packages[version]

    @rule(crash=st.one_of(st.none(), st.sampled_from(INSTALL_STEPS)))
    def install_new(self, crash: str | None) -> None:
        v = self.next_version
        self.next_version += 1
        self.crash_at = crash
        try:
            self.store.install(self._package(v), self.trust)
        except Crash:
            self.restart()
            return
        self.highest = max(self.highest, v)

    @precondition(lambda self: self.next_version > 2)
    @rule(data=st.data())
    def replay_old(self, data: st.DataObject) -> None:
        v = data.draw(st.integers(1, self.next_version - 1))
        try:
            self.store.install(self._package(v), self.trust)
        except PackageError as exc:
            assert exc.code in ("older_version", "bad_version")

    @rule()
    def restart(self) -> None:
        self.crash_at = None
        self.store = self._open()
        self.store.recover()

    @rule()
    def commit(self) -> None:
        if self.store.pointer("m", "current") is not None:
            self.store.commit("m")

    @rule(crash=st.one_of(st.none(), st.sampled_from(ROLLBACK_STEPS)))
    def rollback(self, crash: str | None) -> None:
        cur = self.store.pointer("m", "current")
        self.crash_at = crash
        try:
            self.store.rollback("m")
        except PackageError as exc:
            assert exc.code == "no_previous"
            return
        except Crash:
            self.restart()
        if cur is not None:
            self.bad.add(cur)

    @invariant()
    def current_is_verified_and_good(self) -> None:
        if not hasattr(self, "store") or self.crash_at is not None:
            return
        cur = self.store.pointer("m", "current")
        if cur is None:
            return
        assert verify_folder(self.dir / "state/models/m/current").manifest.version == cur
        assert cur not in self.bad, f"bad version {cur} is current"
        assert cur not in self.store.state("m").bad

    @invariant()
    def highest_accepted_never_decreases(self) -> None:
        if not hasattr(self, "store") or not (self.dir / "state/models/m/state.json").exists():
            return
        got = self.store.state("m").highest_accepted
        assert got >= self.highest
        self.highest = got

    def teardown(self) -> None:
        import shutil

        if hasattr(self, "dir"):
            shutil.rmtree(self.dir, ignore_errors=True)


StoreMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_store_state_machine = StoreMachine.TestCase


def test_rollback_if_probation_acts_once_per_version(demo: DemoAssets, tmp_path: Path, keys) -> None:
    """What edged-rollback.service runs after a crash loop."""
    key, _ = keys
    cfg = device_config(tmp_path)
    for v in (1, 2):
        assert edged_cli("model", "install", str(make_package(demo, tmp_path, key, v)), "-c", str(cfg)).returncode == 0
    # failed starts that never opened the model (a bad config, say) leave no evidence against it
    r = edged_cli("model", "rollback", "--if-probation", "-c", str(cfg))
    assert r.returncode == 1 and "no run died with it loaded; nothing rolled back" in r.stderr, r.stderr
    Store(tmp_path / "state").probation_run("blazeface-back", "a-run-that-died")  # its marker, left behind
    r = edged_cli("model", "rollback", "--if-probation", "-c", str(cfg))  # name from model.name
    assert r.returncode == 0 and "rolled back from 2 (marked bad) to 1" in r.stdout, r.stderr
    r = edged_cli("model", "rollback", "--if-probation", "-c", str(cfg))
    assert r.returncode == 1 and "not on probation; nothing rolled back" in r.stderr
    assert _assert_consistent(tmp_path / "state", {1}) == 1


def test_daemon_commits_a_version_after_its_probation(
    demo: DemoAssets, tmp_path: Path, keys, broker, subscribe, start_daemon
) -> None:
    from tests.conftest import base_config, wait_until, write_config

    key, _ = keys
    cfg = device_config(tmp_path)
    for v in (1, 2):
        assert edged_cli("model", "install", str(make_package(demo, tmp_path, key, v)), "-c", str(cfg)).returncode == 0
    sub = subscribe(broker, "edged/#")
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True}]
    doc = base_config(broker, demo, tmp_path, cams)
    doc["model"] = {
        "name": "blazeface-back",
        "keys_dir": str(tmp_path / "trusted"),
        "probation_s": 2,
        "probation_batches": 5,
        "onnxruntime": {"threads": 1},
    }
    d = start_daemon(write_config(tmp_path / "run.yaml", doc))
    wait_until(lambda: any(m.json().get("type") == "model_committed" for m in sub.on("events")), 30, "commit event")
    d.stop()
    state = json.loads((tmp_path / "state/models/blazeface-back/state.json").read_text())
    assert state["pending"] is None and state["bad"] == []
    assert all(r["model"] == {"name": "blazeface-back", "version": 2} for r in sub.results())
    r = edged_cli("model", "rollback", "--if-probation", "-c", str(cfg))  # committed: nothing to blame
    assert r.returncode == 1 and "not on probation" in r.stderr


def test_model_verbs_leave_a_running_daemons_staging_alone(demo: DemoAssets, tmp_path: Path, keys) -> None:
    """`edged model list|install|rollback` recover the store only when no daemon holds the state directory's
    lock: a running daemon's staging/ may hold an over-the-air install in progress."""
    from edged.daemon.host.startup import StateLock

    key, _ = keys
    cfg = device_config(tmp_path)
    assert edged_cli("model", "install", str(make_package(demo, tmp_path, key, 1)), "-c", str(cfg)).returncode == 0
    in_flight = tmp_path / "state" / "staging" / "blazeface-back-2-4242" / "model.onnx"
    in_flight.parent.mkdir(parents=True)
    in_flight.write_bytes(b"half a transfer")
    lock = StateLock(tmp_path / "state")  # what a running daemon holds (a real flock, another process)
    try:
        r = edged_cli("model", "list", "-c", str(cfg), "--json")
        assert r.returncode == 0, r.stderr
        assert in_flight.read_bytes() == b"half a transfer"
    finally:
        lock.release()
    r = edged_cli("model", "list", "-c", str(cfg), "--json")  # no daemon: recovery as at a start
    assert r.returncode == 0, r.stderr
    assert "staging wiped" in r.stderr
    assert not in_flight.exists()
