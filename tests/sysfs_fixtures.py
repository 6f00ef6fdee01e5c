"""Fixture trees laid out as the sysfs/procfs of real boards, with values a test can change.

Layouts follow what the boards expose (L4T 32 on the Nano, L4T 35/36 on Xavier NX and Orin),
the same paths jetson-stats and tegrastats read:
- thermal zones by type, millidegrees; Orin Nano's cv*-thermal zones read -256000 (offline);
- INA3221: JetPack 4 through iio (rail_name_N, in_powerN_input mW), JetPack 5+ through hwmon
  (inN_label, inN_input mV, currN_input mA, currN_crit mA, channel 7 "sum of shunt voltages");
  AGX Orin has two monitors, no VDD_IN and "NC" channels;
- the GPU as a devfreq device whose of_node is named gp10b/gv11b/ga10b ("gpu" on the Nano);
- soctherm_oc's over-current counters; nvpmodel's status and configuration.
"""

from __future__ import annotations

from pathlib import Path


def put(root: Path, rel: str, value: object) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{value}\n")


THERMAL = "sys/devices/virtual/thermal"


# First lines of /etc/nv_tegra_release as the releases write them.
L4T_R32_7_4 = (
    "# R32 (release), REVISION: 7.4, GCID: 33514132, BOARD: t210ref, EABI: aarch64, DATE: Fri Jun  9 04:25:08 UTC 2023"
)
L4T_R35_4_1 = (
    "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023"
)
L4T_R36_3_0 = (
    "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: Mon May  6 17:34:21 UTC 2024"
)
L4T_R36_4_0 = (
    "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64, DATE: Fri Sep 13 04:36:44 UTC 2024"
)


def l4t(root: Path, release: str, compatible: list[str]) -> None:
    """/etc/nv_tegra_release and /proc/device-tree/compatible (NUL-separated, as the kernel exposes it)."""
    put(root, "etc/nv_tegra_release", release + "\n# KERNEL_VARIANT: oot")
    dt = root / "proc/device-tree/compatible"
    dt.parent.mkdir(parents=True, exist_ok=True)
    dt.write_bytes(b"".join(c.encode() + b"\0" for c in compatible))


def thermal(root: Path, zones: dict[str, float]) -> None:
    for i, (name, c) in enumerate(zones.items()):
        put(root, f"{THERMAL}/thermal_zone{i}/type", name)
        put(root, f"{THERMAL}/thermal_zone{i}/temp", int(c * 1000))


def set_temp(root: Path, zone: str, c: float) -> None:
    for d in (root / THERMAL).glob("thermal_zone*"):
        if (d / "type").read_text().strip() == zone:
            (d / "temp").write_text(f"{int(c * 1000)}\n")
            return
    raise KeyError(zone)


def ina_hwmon(root: Path, dev: str, hwmon: str, channels: dict[int, tuple[str, float, float]]) -> None:
    """channels: number -> (label, mV, mA)"""
    put(root, f"sys/bus/i2c/devices/{dev}/name", "ina3221")
    base = f"sys/bus/i2c/devices/{dev}/hwmon/{hwmon}"
    put(root, f"{base}/name", "ina3221")
    for n, (label, mv, ma) in channels.items():
        put(root, f"{base}/in{n}_label", label)
        put(root, f"{base}/in{n}_input", int(mv))
        put(root, f"{base}/curr{n}_input", int(ma))
        put(root, f"{base}/curr{n}_crit", 10000)
    put(root, f"{base}/in7_label", "sum of shunt voltages")
    put(root, f"{base}/in7_input", 1234)


def set_rail_hwmon(root: Path, label: str, mv: float, ma: float) -> None:
    for f in root.glob("sys/bus/i2c/devices/*/hwmon/hwmon*/in*_label"):
        if f.read_text().strip() == label:
            n = f.name[2:].split("_")[0]
            (f.parent / f"in{n}_input").write_text(f"{int(mv)}\n")
            (f.parent / f"curr{n}_input").write_text(f"{int(ma)}\n")
            return
    raise KeyError(label)


def gpu(root: Path, dev: str, node: str, load_pct: float, freq_mhz: float) -> None:
    put(root, f"sys/class/devfreq/{dev}/device/of_node/name", node)
    put(root, f"sys/class/devfreq/{dev}/device/load", int(load_pct * 10))
    put(root, f"sys/class/devfreq/{dev}/cur_freq", int(freq_mhz * 1e6))


def nvpmodel(root: Path, current: int, modes: dict[int, str]) -> None:
    put(root, "var/lib/nvpmodel/status", f"pmode:{current:04d} fmode:quiet")
    put(root, "etc/nvpmodel.conf", "\n".join(f"< POWER_MODEL ID={i} NAME={n} >" for i, n in modes.items()))


def meminfo(root: Path, available_kb: int, nvmap_kb: int | None) -> None:
    text = f"MemTotal:        7800000 kB\nMemFree:         1000000 kB\nMemAvailable:    {available_kb} kB\n"
    if nvmap_kb is not None:
        text += f"NvMapMemUsed:    {nvmap_kb} kB\n"
    put(root, "proc/meminfo", text)


def soctherm_oc(root: Path, hwmon: str, counts: list[int]) -> None:
    put(root, f"sys/class/hwmon/{hwmon}/name", "soctherm_oc")
    for i, c in enumerate(counts, start=1):
        put(root, f"sys/class/hwmon/{hwmon}/oc{i}_event_cnt", c)


def nano_jp4(root: Path) -> Path:
    thermal(
        root,
        {
            "AO-therm": 38.5,
            "CPU-therm": 41.0,
            "GPU-therm": 39.5,
            "PLL-therm": 37.0,
            "PMIC-Die": 100.0,
            "thermal-fan-est": 40.2,
        },
    )
    put(root, "sys/bus/i2c/devices/6-0040/name", "ina3221x")
    iio = "sys/bus/i2c/devices/6-0040/iio:device0"
    for n, (label, mw, mv, ma) in enumerate(
        [("POM_5V_IN", 4520, 5024, 900), ("POM_5V_GPU", 1190, 5016, 237), ("POM_5V_CPU", 830, 5016, 165)]
    ):
        put(root, f"{iio}/rail_name_{n}", label)
        put(root, f"{iio}/in_power{n}_input", mw)
        put(root, f"{iio}/in_voltage{n}_input", mv)
        put(root, f"{iio}/in_current{n}_input", ma)
        put(root, f"{iio}/crit_current_limit_{n}", 3000)
    gpu(root, "57000000.gpu", "gpu", 35.0, 921.6)
    nvpmodel(root, 0, {0: "MAXN", 1: "5W"})
    l4t(root, L4T_R32_7_4, ["nvidia,p3450-0000", "nvidia,jetson-nano", "nvidia,tegra210"])
    meminfo(root, 2_100_000, 180_000)
    return root


def xavier_nx_jp5(root: Path) -> Path:
    thermal(
        root,
        {
            "AO-therm": 40.0,
            "CPU-therm": 45.5,
            "GPU-therm": 44.0,
            "PLL-therm": 42.0,
            "AUX-therm": 43.0,
            "Tboard_tegra": 35.0,
            "Tdiode_tegra": 36.5,
            "thermal-fan-est": 44.1,
        },
    )
    ina_hwmon(
        root,
        "7-0040",
        "hwmon5",
        {1: ("VDD_IN", 5000, 1500), 2: ("VDD_CPU_GPU_CV", 5000, 600), 3: ("VDD_SOC", 5000, 300)},
    )
    gpu(root, "17000000.gv11b", "gv11b", 55.0, 1109.25)
    soctherm_oc(root, "hwmon1", [0, 0, 0, 0])
    nvpmodel(root, 8, {2: "MODE_15W_6CORE", 8: "MODE_20W_6CORE"})
    l4t(root, L4T_R35_4_1, ["nvidia,p3509-0000+p3668-0001", "nvidia,jetson-xavier-nx", "nvidia,tegra194"])
    meminfo(root, 4_000_000, 350_000)
    return root


def orin_nano_jp6(root: Path) -> Path:
    thermal(
        root,
        {
            "cpu-thermal": 48.0,
            "gpu-thermal": 47.5,
            "cv0-thermal": -256.0,
            "cv1-thermal": -256.0,
            "cv2-thermal": -256.0,
            "soc0-thermal": 46.0,
            "soc1-thermal": 46.5,
            "soc2-thermal": 45.9,
            "tj-thermal": 48.3,
        },
    )
    ina_hwmon(
        root,
        "1-0040",
        "hwmon1",
        {1: ("VDD_IN", 5048, 1270), 2: ("VDD_CPU_GPU_CV", 5048, 420), 3: ("VDD_SOC", 5048, 300)},
    )
    gpu(root, "17000000.ga10b", "ga10b", 62.0, 624.75)
    soctherm_oc(root, "hwmon3", [0, 0, 0])
    nvpmodel(root, 0, {0: "15W", 1: "7W"})
    l4t(root, L4T_R36_3_0, ["nvidia,p3768-0000+p3767-0005", "nvidia,p3767-0005", "nvidia,tegra234"])
    meminfo(root, 5_200_000, 410_000)
    return root


def agx_orin_jp5(root: Path) -> Path:
    thermal(
        root,
        {
            "CPU-therm": 50.0,
            "GPU-therm": 49.0,
            "CV0-therm": 47.0,
            "CV1-therm": 47.5,
            "CV2-therm": 46.8,
            "SOC0-therm": 48.0,
            "SOC1-therm": 48.1,
            "SOC2-therm": 47.7,
            "Tj-therm": 50.2,
        },
    )
    ina_hwmon(
        root,
        "1-0040",
        "hwmon2",
        {1: ("VDD_GPU_SOC", 19000, 300), 2: ("VDD_CPU_CV", 19000, 120), 3: ("VIN_SYS_5V0", 5000, 500)},
    )
    ina_hwmon(root, "1-0041", "hwmon3", {1: ("NC", 0, 0), 2: ("VDDQ_VDD2_1V8AO", 5000, 100), 3: ("NC", 0, 0)})
    gpu(root, "17000000.ga10b", "ga10b", 20.0, 1300.5)
    soctherm_oc(root, "hwmon4", [0, 0, 0])
    nvpmodel(root, 0, {0: "MAXN", 1: "MODE_15W", 2: "MODE_30W", 3: "MODE_50W"})
    l4t(root, L4T_R35_4_1, ["nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005", "nvidia,tegra234"])
    meminfo(root, 25_000_000, 900_000)
    return root


def generic_linux(root: Path) -> Path:
    thermal(root, {"x86_pkg_temp": 52.0})
    put(root, "sys/class/hwmon/hwmon0/name", "coretemp")
    put(root, "sys/class/hwmon/hwmon0/temp1_label", "Package id 0")
    put(root, "sys/class/hwmon/hwmon0/temp1_input", 52000)
    meminfo(root, 9_000_000, None)
    return root


BOARDS = {
    "nano_jp4": nano_jp4,
    "xavier_nx_jp5": xavier_nx_jp5,
    "orin_nano_jp6": orin_nano_jp6,
    "agx_orin_jp5": agx_orin_jp5,
    "generic_linux": generic_linux,
}
