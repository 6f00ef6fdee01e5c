"""Readers for thermals, power, GPU load, power mode and memory, across Jetson generations.

Everything is read from files under a root (``/`` on a device; a fixture tree in tests), found once
at start and then re-read each sample. Every value carries its unit in its name. What a box does not
have (a generic Linux machine has no INA3221 and no Jetson GPU) is listed in ``missing``; nothing
here raises for an absent or offline sensor.

    thermal   <root>/sys/devices/virtual/thermal/thermal_zone*/{type,temp}   millidegrees C
              <root>/sys/class/hwmon/hwmon*/temp*_input (+ name, temp*_label)
              offline sensors (unreadable, or -256 °C as Jetson reports them) are skipped
    power     INA3221 under <root>/sys/bus/i2c/devices/*/ whose `name` has "ina3221":
                JetPack 5+: hwmon/hwmon*/in<N>_label, in<N>_input mV, curr<N>_input mA, curr<N>_crit mA
                JetPack 4:  iio:device*/rail_name_<N>, in_power<N>_input mW, in_voltage<N>_input mV,
                            in_current<N>_input mA, crit_current_limit_<N> mA
              "NC" channels and "sum of shunt voltages" are skipped; the total is VDD_IN or POM_5V_IN,
              else the sum of the rails
    over-current  <root>/sys/class/hwmon/hwmon*/ named soctherm_oc: oc*_event_cnt
    GPU       <root>/sys/class/devfreq/*/device/of_node/name in gv11b gp10b ga10b gb10b gpu:
              device/load (0-1000), cur_freq (Hz)
    power mode  <root>/var/lib/nvpmodel/status ("pmode:0002") named by <root>/etc/nvpmodel.conf
    memory    this process's RSS (/proc/self/status); MemAvailable and NvMapMemUsed from
              <root>/proc/meminfo; this process's nvmap (GPU) memory from
              <root>/sys/kernel/debug/nvmap/iovmm/clients (root only), counted with RSS in the
              governor's budget. `process_memory_mb()`: this process's RSS now and at its peak, read
              when asked (admission, telemetry, the run summary), not by the governor's sampling
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GPU_NODES = ("gv11b", "gp10b", "ga10b", "gb10b", "gpu")
OFFLINE_C = -256.0
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")
# hwmon chips whose temperature is not the SoC's: storage and network (names as their drivers register them)
UNRELATED_HWMON = ("nvme", "drivetemp", "iwlwifi", "mt76", "mt79", "ath", "rtw", "r8169", "igc", "e1000e", "bat")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _num(path: Path) -> float | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


@dataclass
class Rail:
    voltage: Path | None = None  # mV
    current: Path | None = None  # mA
    power: Path | None = None  # mW (JetPack 4)
    crit: Path | None = None  # mA


@dataclass
class Reading:
    temps_c: dict[str, float] = field(default_factory=dict)
    rails_w: dict[str, float] = field(default_factory=dict)
    rails_crit_a: dict[str, float] = field(default_factory=dict)
    power_w: float | None = None
    power_source: str = ""
    oc_events: dict[str, int] = field(default_factory=dict)
    gpu: str = ""
    gpu_load_pct: float | None = None
    gpu_freq_mhz: float | None = None
    power_mode: str | None = None
    rss_mb: float | None = None
    mem_available_mb: float | None = None
    nvmap_mb: float | None = None
    missing: list[str] = field(default_factory=list)
    hwmon_chips: dict[str, str] = field(default_factory=dict)  # temps_c key -> hwmon chip name (not a zone)
    gpu_mb: float | None = None  # this process's nvmap (GPU) memory on a Jetson; None where unreadable

    @property
    def spent_mb(self) -> float | None:
        """What this process spends against the memory budget: RSS plus, on a Jetson, its nvmap
        allocations (cudaMalloc, TensorRT), which share the same DRAM and do not show in RSS."""
        if self.rss_mb is None:
            return None
        return round(self.rss_mb + (self.gpu_mb or 0.0), 1)

    def governed_temps_c(self, zones: list[str]) -> dict[str, float]:
        """The temperatures the governor acts on. Named `zones`: exactly those. None named: the SoC's
        thermal zones; hwmon chips (an NVMe drive, a Wi-Fi card) only where a machine has no thermal
        zones, and then not the storage or network ones, whose heat is not the inference's."""
        if zones:
            return {k: v for k, v in self.temps_c.items() if k in zones}
        soc = {k: v for k, v in self.temps_c.items() if k not in self.hwmon_chips}
        if soc:
            return soc
        return {k: v for k, v in self.temps_c.items() if not self.hwmon_chips[k].startswith(UNRELATED_HWMON)}

    @property
    def max_temp_c(self) -> float | None:
        return max(self.temps_c.values(), default=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "temps_c": {k: round(v, 1) for k, v in self.temps_c.items()},
            "power_w": None if self.power_w is None else round(self.power_w, 3),
            "power_source": self.power_source,
            "rails_w": {k: round(v, 3) for k, v in self.rails_w.items()},
            "oc_events": self.oc_events,
            "gpu": self.gpu,
            "gpu_load_pct": self.gpu_load_pct,
            "gpu_freq_mhz": self.gpu_freq_mhz,
            "power_mode": self.power_mode,
            "mem_available_mb": self.mem_available_mb,
            "nvmap_mb": self.nvmap_mb,
            "gpu_mb": self.gpu_mb,
            "missing": self.missing,
        }


class Sensors:
    """Finds the sensors under `root` once; `read()` samples them."""

    def __init__(self, root: Path = Path("/"), proc_self: Path = Path("/proc/self/status")) -> None:
        self.root = root
        self.proc_self = proc_self
        self.pid = os.getpid()
        sysfs = root / "sys"
        self.zones: list[tuple[str, Path]] = []
        for zone in sorted((sysfs / "devices/virtual/thermal").glob("thermal_zone*"), key=_natural):
            name = _read(zone / "type")
            if name and (zone / "temp").exists() and "PMIC" not in name:
                self.zones.append((name, zone / "temp"))
        self.hwmon_temps: list[tuple[str, Path]] = []
        self.hwmon_chip: dict[Path, str] = {}
        self.oc: list[tuple[str, Path]] = []
        for hw in sorted((sysfs / "class/hwmon").glob("hwmon*"), key=_natural):
            name = _read(hw / "name") or hw.name
            if name == "soctherm_oc":
                self.oc += [
                    (p.name.removesuffix("_event_cnt"), p) for p in sorted(hw.glob("oc*_event_cnt"), key=_natural)
                ]
                continue
            for t in sorted(hw.glob("temp*_input"), key=_natural):
                label = _read(hw / t.name.replace("_input", "_label")) or f"{name}-{t.name.split('_')[0]}"
                self.hwmon_temps.append((label, t))
                self.hwmon_chip[t] = name
        self.rails = self._find_rails(sysfs / "bus/i2c/devices")
        self.gpu_name, self.gpu_dir, self.gpu_freq = "", None, None
        for dev in sorted((sysfs / "class/devfreq").glob("*")):
            node = _read(dev / "device/of_node/name")
            if node and node.strip("\x00") in GPU_NODES:
                self.gpu_name, self.gpu_dir, self.gpu_freq = node.strip("\x00"), dev / "device", dev / "cur_freq"
                break
        self.missing = [
            what
            for what, have in (
                ("thermal", self.zones or self.hwmon_temps),
                ("power", self.rails),
                ("gpu", self.gpu_dir),
                ("power_mode", (root / "var/lib/nvpmodel/status").exists()),
                ("over_current", self.oc),
            )
            if not have
        ]

    @staticmethod
    def _find_rails(devices: Path) -> dict[str, Rail]:
        rails: dict[str, Rail] = {}
        for dev in sorted(devices.glob("*")):
            if "ina3221" not in (_read(dev / "name") or ""):
                continue
            for hw in sorted(dev.glob("hwmon/hwmon*")):  # JetPack 5 and later
                for label_file in sorted(hw.glob("in*_label"), key=_natural):
                    label = _read(label_file) or ""
                    n = label_file.name[2:].split("_")[0]
                    if not label or label.startswith("NC") or "sum of shunt" in label.lower():
                        continue
                    rails[label] = Rail(
                        voltage=hw / f"in{n}_input", current=hw / f"curr{n}_input", crit=hw / f"curr{n}_crit"
                    )
            for iio in sorted(dev.glob("iio:device*")):  # JetPack 4
                for name_file in sorted(iio.glob("rail_name_*"), key=_natural):
                    label = _read(name_file) or ""
                    n = name_file.name.removeprefix("rail_name_")
                    if label:
                        rails[label] = Rail(
                            voltage=iio / f"in_voltage{n}_input",
                            current=iio / f"in_current{n}_input",
                            power=iio / f"in_power{n}_input",
                            crit=iio / f"crit_current_limit_{n}",
                        )
        return rails

    def read(self) -> Reading:
        r = Reading(missing=list(self.missing))
        for name, path in self.zones + self.hwmon_temps:
            milli = _num(path)
            if milli is None or milli / 1000.0 <= OFFLINE_C:
                continue  # offline sensor
            key = name if name not in r.temps_c else f"{name}.{len(r.temps_c)}"
            r.temps_c[key] = milli / 1000.0
            if path in self.hwmon_chip:
                r.hwmon_chips[key] = self.hwmon_chip[path]
        for name, rail in self.rails.items():
            mw = _num(rail.power) if rail.power else None
            if mw is None and rail.voltage and rail.current:
                mv, ma = _num(rail.voltage), _num(rail.current)
                mw = None if mv is None or ma is None else mv * ma / 1000.0
            if mw is not None:
                r.rails_w[name] = mw / 1000.0
            crit = _num(rail.crit) if rail.crit else None
            if crit is not None:
                r.rails_crit_a[name] = crit / 1000.0
        total = next((n for n in TOTAL_RAILS if n in r.rails_w), None)
        if total:
            r.power_w, r.power_source = r.rails_w[total], total
        elif r.rails_w:
            r.power_w, r.power_source = sum(r.rails_w.values()), "sum"
        for name, path in self.oc:
            v = _num(path)
            if v is not None:
                r.oc_events[name] = int(v)
        if self.gpu_dir is not None:
            r.gpu = self.gpu_name
            load = _num(self.gpu_dir / "load")
            r.gpu_load_pct = None if load is None else load / 10.0
            freq = _num(self.gpu_freq) if self.gpu_freq else None
            r.gpu_freq_mhz = None if freq is None else freq / 1e6
        r.power_mode = self._power_mode()
        r.rss_mb = _kb_field(self.proc_self, "VmRSS")
        meminfo = self.root / "proc/meminfo"
        r.mem_available_mb = _kb_field(meminfo, "MemAvailable")
        r.nvmap_mb = _kb_field(meminfo, "NvMapMemUsed")
        r.gpu_mb = nvmap_process_mb(self.pid, self.root)
        return r

    def _power_mode(self) -> str | None:
        status = _read(self.root / "var/lib/nvpmodel/status")
        if not status:
            return None
        m = re.search(r"pmode:(\d+)", status)
        if not m:
            return None
        ident = int(m.group(1))
        conf = _read(self.root / "etc/nvpmodel.conf") or ""
        for mid, name in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>", conf):
            if int(mid) == ident:
                return str(name)
        return f"mode {ident}"


NVMAP_CLIENTS = "sys/kernel/debug/nvmap/iovmm/clients"


def nvmap_process_mb(pid: int, root: Path = Path("/")) -> float | None:
    """`pid`'s GPU memory on a Jetson, MiB: the sum of its rows in nvmap's iovmm client table
    (``CLIENT PROCESS PID SIZE``, sizes like ``123456K``; the file jtop reads). debugfs, readable by root
    only (the unit grants it or not): None where it cannot be read, 0.0 for a process with no rows."""
    text = _read(root / NVMAP_CLIENTS)
    if text is None:
        return None
    kib = 0.0
    scale = {"": 1 / 1024, "K": 1.0, "M": 1024.0, "G": 1024.0**2}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == str(pid):
            m = re.fullmatch(r"(\d+)([KMG]?)", parts[3])
            if m:
                kib += int(m.group(1)) * scale[m.group(2)]
    return round(kib / 1024.0, 1)


def process_memory_mb() -> dict[str, float]:
    """This process's resident memory now (`rss_mb`) and at its peak (`peak_rss_mb`), from /proc/self/status;
    where that cannot be read, only the peak, from getrusage."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key = "rss_mb" if line.startswith("VmRSS") else "peak_rss_mb"
                    out[key] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def rss_mb() -> float:
    """This process's resident memory now, MiB (0.0 where /proc/self/status cannot be read)."""
    return process_memory_mb().get("rss_mb", 0.0)


def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # glibc's; musl and others have none
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def trim_heap() -> float:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim(0)); MiB of RSS released.

    Freed memory stays in glibc's arenas: a replaced ONNX Runtime session, a reopened decoder's buffers are
    free but still resident, so RSS climbs in steps with every hot swap and camera reopen and never comes
    back (12 swaps of the demo model in one process: 102 MB resident with a trim after each, 167 MB
    without). 0.0 where there is no malloc_trim."""
    if _TRIM is None:
        return 0.0
    before = rss_mb()
    _TRIM(0)
    return max(0.0, before - rss_mb())


def _kb_field(path: Path, key: str) -> float | None:
    text = _read(path)
    if text is None:
        return None
    m = re.search(rf"^{key}:\s+(\d+)\s*kB", text, re.MULTILINE)
    return round(int(m.group(1)) / 1024.0, 1) if m else None


def _natural(p: Path) -> tuple[str, int]:
    m = re.search(r"(\d+)", p.name)
    return (re.sub(r"\d+", "", p.name), int(m.group(1)) if m else -1)
