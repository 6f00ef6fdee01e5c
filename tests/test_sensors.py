"""Readers over fixture trees laid out as the real boards' sysfs (tests/sysfs_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.daemon.host.sensors import Sensors

from . import sysfs_fixtures as fx
from .conftest import edged_cli


def test_nano_jetpack4_iio_rails(tmp_path: Path) -> None:
    r = Sensors(fx.nano_jp4(tmp_path)).read()
    assert "PMIC-Die" not in r.temps_c  # a fixed 100 °C reading on these boards, skipped
    assert r.temps_c["CPU-therm"] == 41.0 and r.max_temp_c == 41.0
    assert r.power_source == "POM_5V_IN" and r.power_w == pytest.approx(4.52)
    assert r.rails_w["POM_5V_GPU"] == pytest.approx(1.19) and r.rails_crit_a["POM_5V_CPU"] == pytest.approx(3.0)
    assert r.gpu == "gpu" and r.gpu_load_pct == 35.0 and r.gpu_freq_mhz == pytest.approx(921.6)
    assert r.power_mode == "MAXN" and r.nvmap_mb == pytest.approx(175.8, abs=0.1)
    assert r.missing == ["over_current"]


def test_xavier_nx_jetpack5_hwmon_rails_and_over_current(tmp_path: Path) -> None:
    root = fx.xavier_nx_jp5(tmp_path)
    s = Sensors(root)
    r = s.read()
    assert set(r.rails_w) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}  # "sum of shunt voltages" skipped
    assert r.power_source == "VDD_IN" and r.power_w == pytest.approx(7.5)
    assert r.gpu == "gv11b" and r.gpu_load_pct == 55.0 and r.power_mode == "MODE_20W_6CORE"
    assert r.oc_events == {"oc1": 0, "oc2": 0, "oc3": 0, "oc4": 0} and r.missing == []
    fx.put(root, "sys/class/hwmon/hwmon1/oc2_event_cnt", 3)
    assert s.read().oc_events["oc2"] == 3


def test_orin_nano_jetpack6_offline_zones(tmp_path: Path) -> None:
    r = Sensors(fx.orin_nano_jp6(tmp_path)).read()
    assert not any(k.startswith("cv") for k in r.temps_c)  # -256 °C: offline on Orin Nano
    assert r.temps_c["tj-thermal"] == 48.3 and r.max_temp_c == 48.3
    assert r.power_w == pytest.approx(5.048 * 1.27, rel=1e-3) and r.gpu == "ga10b" and r.power_mode == "15W"


def test_agx_orin_two_monitors_no_vdd_in_sums_rails(tmp_path: Path) -> None:
    r = Sensors(fx.agx_orin_jp5(tmp_path)).read()
    assert "NC" not in r.rails_w and set(r.rails_w) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}
    assert r.power_source == "sum" and r.power_w == pytest.approx(19 * 0.3 + 19 * 0.12 + 5 * 0.5 + 5 * 0.1)


def test_generic_linux_and_an_empty_root(tmp_path: Path) -> None:
    r = Sensors(fx.generic_linux(tmp_path / "g")).read()
    assert r.temps_c == {"x86_pkg_temp": 52.0, "Package id 0": 52.0}
    assert r.power_w is None and r.gpu == "" and r.nvmap_mb is None and r.mem_available_mb is not None
    assert set(r.missing) == {"power", "gpu", "power_mode", "over_current"}
    (tmp_path / "e").mkdir()
    empty = Sensors(tmp_path / "e").read()
    assert empty.temps_c == {} and empty.max_temp_c is None
    assert set(empty.missing) == {"thermal", "power", "gpu", "power_mode", "over_current"}
    assert empty.rss_mb is not None and empty.rss_mb > 10  # this process's own RSS is always there


def test_unreadable_sensor_is_skipped(tmp_path: Path) -> None:
    root = fx.orin_nano_jp6(tmp_path)
    fx.put(root, "sys/devices/virtual/thermal/thermal_zone0/temp", "garbage")
    assert "cpu-thermal" not in Sensors(root).read().temps_c


def test_edged_telemetry_prints_one_reading(tmp_path: Path) -> None:
    fx.xavier_nx_jp5(tmp_path)
    run = edged_cli("telemetry", "--root", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert "VDD_IN" in run.stdout and "gv11b" in run.stdout and "MODE_20W_6CORE" in run.stdout
    as_json = edged_cli("telemetry", "--root", str(tmp_path), "--json")
    assert '"power_source": "VDD_IN"' in as_json.stdout
