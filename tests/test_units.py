"""The unit files as systemd reads them: `systemd-analyze verify` and the offline security score
(nothing is started; systemd never runs here as PID 1)."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "systemd"
ANALYZE = shutil.which("systemd-analyze") or "systemd-analyze"
pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt-get install systemd)"
)


def _units_here(tmp_path: Path, l4t: str) -> Path:
    """The units with their ExecStart pointing at this checkout's edged, the devices drop-in of `l4t`."""
    edged = Path(sys.executable).parent / "edged"
    for name in ("edged.service", "edged-rollback.service"):
        text = (UNITS / name).read_text().replace("/opt/edged/venv/bin/edged", str(edged))
        (tmp_path / name).write_text(text)
    dropin = tmp_path / "edged.service.d"
    dropin.mkdir()
    shutil.copy(UNITS / "devices" / f"l4t-{l4t}.conf", dropin / "devices.conf")
    return tmp_path / "edged.service"


@pytest.mark.parametrize("l4t", ["r35", "r36"])
def test_units_verify(tmp_path: Path, l4t: str) -> None:
    unit = _units_here(tmp_path, l4t)
    man1 = tmp_path / "man" / "man1"  # Documentation=man:edged(1): verify runs `man`; the bundle installs it
    man1.mkdir(parents=True)
    shutil.copy(REPO / "docs" / "edged.1", man1 / "edged.1")
    r = subprocess.run(
        [ANALYZE, "verify", str(unit), str(tmp_path / "edged-rollback.service")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MANPATH": f"{tmp_path / 'man'}:"},
    )
    problems = [line for line in r.stderr.splitlines() if "edged" in line]
    assert r.returncode == 0 and not problems, r.stderr


def test_the_credential_lines_an_operator_uncomments_verify(tmp_path: Path) -> None:
    """The unit's commented `LoadCredential=` lines (the broker identity, a camera's password), uncommented
    into a drop-in as an operator does: systemd takes them. (tests/nspawn/site.sh runs the identity lines
    under a real systemd: the daemon connects with the certificate only they hand it.)"""
    lines = [
        line[1:] for line in (UNITS / "edged.service").read_text().splitlines() if line.startswith("#LoadCredential=")
    ]
    assert [line.split("=", 1)[1].split(":", 1)[0] for line in lines] == [
        "tls_ca.crt",
        "tls_device.crt",
        "tls_device.key",
        "cam_door",
    ]
    unit = _units_here(tmp_path, "r36")
    (tmp_path / "edged.service.d" / "credentials.conf").write_text("[Service]\n" + "\n".join(lines) + "\n")
    man1 = tmp_path / "man" / "man1"
    man1.mkdir(parents=True)
    shutil.copy(REPO / "docs" / "edged.1", man1 / "edged.1")
    r = subprocess.run(
        [ANALYZE, "verify", str(unit), str(tmp_path / "edged-rollback.service")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MANPATH": f"{tmp_path / 'man'}:"},
    )
    problems = [line for line in r.stderr.splitlines() if "edged" in line]
    assert r.returncode == 0 and not problems, r.stderr
    r = subprocess.run(
        [ANALYZE, "security", "--offline=true", "--no-pager", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert "LoadCredential" not in r.stderr, r.stderr


def test_security_exposure_at_most_2(tmp_path: Path) -> None:
    unit = _units_here(tmp_path, "r36")
    r = subprocess.run(
        [ANALYZE, "security", "--offline=true", "--no-pager", str(unit)], capture_output=True, text=True, timeout=60
    )
    m = re.search(r"Overall exposure level for edged\.service: ([\d.]+)", r.stdout + r.stderr)
    assert m, r.stdout[-2000:] + r.stderr[-2000:]
    print(f"\nsystemd-analyze security --offline=true: {m.group(1)}")
    assert float(m.group(1)) <= 2.0


def test_unit_settings_that_matter() -> None:
    p = configparser.ConfigParser(strict=False, interpolation=None)
    p.optionxform = str  # type: ignore[assignment,method-assign]
    p.read_string((UNITS / "edged.service").read_text())
    s, u = p["Service"], p["Unit"]
    assert s["Type"] == "notify" and s["NotifyAccess"] == "main"
    assert s["WatchdogSec"] == "30" and s["Restart"] == "on-failure"
    assert s["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert (s["MemoryHigh"], s["MemoryMax"], s["OOMPolicy"]) == ("3584M", "4G", "stop")
    assert s["DevicePolicy"] == "closed" and s["User"] == "edged"
    assert u["OnFailure"] == "edged-rollback.service" and u["StartLimitBurst"] == "5"
    text = (UNITS / "edged.service").read_text()
    for forbidden in ("MemoryDenyWriteExecute=", "PrivateDevices="):  # they break CUDA
        assert not re.search(rf"^{forbidden}", text, re.M)
    for dropin in (UNITS / "devices").glob("*.conf"):
        for line in dropin.read_text().splitlines():
            if line.startswith("DeviceAllow="):
                assert "*" not in line, f"{dropin.name}: DeviceAllow= takes no globs"
