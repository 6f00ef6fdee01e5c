"""The user-facing verbs not covered elsewhere: watch and certs, as a user runs them."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from cryptography import x509

from edged.models.demo import DemoAssets

from .conftest import Broker, base_config, edged_cli, free_port, wait_until, write_config


def test_watch_prints_what_a_device_publishes(broker, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path / "c.yaml",
        base_config(broker, demo, tmp_path, [{"name": "cam", "uri": f"file://{demo.video}", "realtime": False}]),
    )
    d = start_daemon(cfg)
    wait_until(lambda: "serving 1 camera(s)" in d.output(), 60, "the daemon")
    snap = tmp_path / "snap.jpg"
    run = edged_cli("watch", "-c", str(cfg), "--duration", "12", "--only-detections", "--snapshot", str(snap),
                    "--video", str(demo.video))  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert any(line.startswith("result  cam") and "face:" in line for line in lines)
    assert not any(" 0 det " in line for line in lines)  # --only-detections
    assert snap.stat().st_size > 10_000 and "snapshot:" in run.stdout
    d.stop()


def test_watch_needs_only_broker_flags_and_a_device(broker, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    """A subscriber's first hour: no config file at all (run from an empty folder), only the broker's
    address and the device id."""
    cam = [{"name": "cam", "uri": "synthetic://?fps=10"}]
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cam)))
    empty = tmp_path / "empty"
    empty.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "edged", "watch", "--host", "127.0.0.1", "--port", str(broker.port),
         "--device", "test-01", "--count", "3", "--duration", "60"],
        capture_output=True, text=True, timeout=90, cwd=empty,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert sum(line.startswith("result  cam") for line in run.stdout.splitlines()) == 3, run.stdout
    assert "watch: 3 results" in run.stderr
    assert not list(empty.iterdir())
    # -c with a file holding nothing but an mqtt section (and flags over it)
    mq = write_config(tmp_path / "mqtt.yaml", {"mqtt": {"host": "127.0.0.1", "port": 1, "topic_prefix": "edged"}})
    run = edged_cli("watch", "-c", str(mq), "--port", str(broker.port), "--device", "test-01", "--count", "1",
                    "--duration", "60")  # fmt: skip
    assert run.returncode == 0 and "watch: 1 results" in run.stderr, run.stderr
    assert d.stop() == 0


def test_watch_says_what_is_missing(tmp_path: Path) -> None:
    run = edged_cli("watch", "--host", "127.0.0.1", "--count", "1")
    assert run.returncode == 1 and "no device to watch: give --device ID" in run.stderr, run.stderr
    run = edged_cli("watch", "--device", "d1", "--cert", "a.crt", "--key", "a.key")
    assert run.returncode == 1 and "--cert/--key need --cafile" in run.stderr, run.stderr
    run = edged_cli("watch", "--device", "d1", "--cafile", str(tmp_path / "none.crt"))
    assert run.returncode == 1 and "none.crt not found" in run.stderr, run.stderr
    run = edged_cli("watch", "--device", "d1", "--port", str(free_port()), "--duration", "1")
    assert run.returncode == 1 and "cannot reach the broker at 127.0.0.1" in run.stderr, run.stderr


def test_certs_cli(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    for args in (
        ["ca"],
        ["server", "broker.site", "10.0.0.2"],
        ["device", "orin-07"],
        ["revoke", str(pki / "orin-07.crt")],
    ):
        run = edged_cli("certs", *args, "--dir", str(pki))
        assert run.returncode == 0, run.stderr
    assert stat.S_IMODE((pki / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((pki / "orin-07.key").stat().st_mode) == 0o600
    dev = x509.load_pem_x509_certificate((pki / "orin-07.crt").read_bytes())
    assert dev.subject.rfc4514_string() == "CN=orin-07"
    crl = x509.load_pem_x509_crl((pki / "crl.pem").read_bytes())
    assert crl.get_revoked_certificate_by_serial_number(dev.serial_number) is not None
    again = edged_cli("certs", "ca", "--dir", str(pki))
    assert again.returncode == 1 and "refusing to replace a CA" in again.stderr


def test_every_verb_names_its_handler_beside_its_options() -> None:
    """`edged.cli` dispatches through `set_defaults(func=...)`, set where each verb adds its options: every
    leaf of the command tree has a handler, and no verb went missing when the CLI became its own part."""
    import argparse

    from edged.cli import build_parser

    def leaves(p: argparse.ArgumentParser, path: tuple[str, ...]):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield " ".join(path), p
        for a in subs:
            for name, child in a.choices.items():
                yield from leaves(child, (*path, name))

    found = dict(leaves(build_parser(), ()))
    assert sorted(found) == sorted(
        ["run", "check-config", "doctor", "watch", "telemetry", "quantize", "build-engine", "keys generate", "push"]
        + ["fleet", "diagnose", "clips"]
        + [f"config {v}" for v in ("push", "show", "clear")]
        + [f"certs {v}" for v in ("ca", "server", "device", "backend", "revoke", "crl", "status", "acl")]
        + [f"bundle {v}" for v in ("build", "verify")]
        + [
            f"model {v}"
            for v in ("pack", "sign", "verify", "install", "list", "rollback", "fetch-demo", "golden", "init", "fold")
        ]
    )
    for verb, parser in found.items():
        assert callable(parser.get_default("func")), verb


def test_watch_c_takes_the_daemons_environment_overrides(broker: Broker, tmp_path: Path) -> None:
    """The secured-site recipe puts the broker in EDGED_MQTT__* variables: `watch -c` reads them as the
    daemon does (and the device id from EDGED_DEVICE_ID), so it watches the broker the daemon publishes to."""
    mq = write_config(tmp_path / "mqtt.yaml", {"mqtt": {"host": "127.0.0.1", "port": 1}})
    env = {"EDGED_MQTT__PORT": str(broker.port), "EDGED_DEVICE_ID": "test-01"}
    run = edged_cli("watch", "-c", str(mq), "--duration", "1", env=env)
    assert run.returncode == 0, run.stderr
    assert "watch: 0 results" in run.stderr and ":1" not in run.stderr, run.stderr
    # and a bad value is the variable's fault, not the file's
    run = edged_cli("watch", "-c", str(mq), "--duration", "1", env={**env, "EDGED_MQTT__PORT": "x"})
    assert run.returncode == 1 and "environment variable EDGED_MQTT__PORT: mqtt.port" in run.stderr, run.stderr


def test_model_lines_never_say_none(demo: DemoAssets, tmp_path: Path) -> None:
    """A first install has no previous version, a store without the model has no current one: said in words."""
    keys = tmp_path / "keys"
    assert edged_cli("keys", "generate", "--dir", str(keys)).returncode == 0
    (key,) = keys.glob("*.key")
    tar = tmp_path / "b.tar"
    src = str(demo.packages["blazeface-back"].root)
    assert edged_cli("model", "pack", src, "--key", str(key), "--out", str(tar)).returncode == 0
    doc = {
        "device_id": "t",
        "state_dir": str(tmp_path / "state"),
        "model": {"name": "blazeface-back", "keys_dir": str(keys)},
        "cameras": [{"name": "a", "uri": "synthetic://"}],
    }
    cfg = write_config(tmp_path / "c.yaml", doc)
    r = edged_cli("model", "rollback", "--if-probation", "-c", str(cfg))
    assert r.returncode == 1 and "no current version" in r.stderr and "None" not in r.stderr, r.stderr
    r = edged_cli("model", "install", str(tar), "-c", str(cfg))
    assert r.returncode == 0 and "installed, current (on probation); no previous version" in r.stdout, r.stdout
    for args in (("model", "install", str(tar)), ("model", "list"), ("model", "rollback")):
        r = edged_cli(*args, "-c", str(cfg))
        assert "None" not in r.stdout + r.stderr, (args, r.stdout, r.stderr)


def test_push_takes_the_tls_flags_watch_takes(demo: DemoAssets, tmp_path: Path) -> None:
    """A broker that requires client certificates: `edged push` reaches it with --cafile/--cert/--key as
    `edged watch` does (the device here never answers: the push times out on it, having connected)."""
    from edged.deploy import certs
    from tests.test_tls import tls_broker

    pki = tmp_path / "pki"
    certs.make_ca(pki)
    certs.make_cert(pki, "server", hosts=["localhost", "127.0.0.1"])
    certs.make_cert(pki, "backend")
    (tmp_path / "b").mkdir()
    secure = tls_broker(tmp_path / "b", pki)
    secure.start()
    try:
        _push_over_tls(secure, pki, demo, tmp_path)
    finally:
        secure.stop()


def _push_over_tls(secure: Broker, pki: Path, demo: DemoAssets, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert edged_cli("keys", "generate", "--dir", str(keys)).returncode == 0
    (key,) = keys.glob("*.key")
    tar = tmp_path / "b.tar"
    src = str(demo.packages["blazeface-back"].root)
    assert edged_cli("model", "pack", src, "--key", str(key), "--out", str(tar)).returncode == 0
    where = ["--host", "127.0.0.1", "--port", str(secure.port), "--state", str(tmp_path / "rollout.json")]
    tls = ["--cafile", str(pki / "ca.crt"), "--cert", str(pki / "backend.crt"), "--key", str(pki / "backend.key")]
    r = edged_cli("push", str(tar), "--device", "ghost", "--timeout", "3", *where, *tls, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cannot reach the broker" not in r.stderr and "ghost" in r.stdout + r.stderr, r.stdout + r.stderr
    r = edged_cli("push", str(tar), "--device", "ghost", "--cert", "a.crt", "--key", "a.key", *where)
    assert r.returncode == 1 and "--cert/--key need --cafile" in r.stderr, r.stderr
