"""The config of the pipeline that runs on the device: the model to serve (``model``, with its backend,
on-device build and probation), batching (``inference``), detection filters (``detection``), model
pushes (``ota``), and the device's limits: memory budget (``memory``), thermals and power
(``governor``), and telemetry. Validated once at load like the rest of the config (daemon/config/__init__.py,
which loads the file and re-exports these)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .cameras import StrictModel as _Strict

logger = logging.getLogger(__name__)


class OnnxRuntimeConfig(_Strict):
    threads: int = Field(0, ge=0, le=256, description="intra-op threads; 0 lets ONNX Runtime choose")
    providers: list[Literal["cpu", "cuda", "tensorrt"]] = Field(
        ["cpu"], description="execution providers (cuda and tensorrt need onnxruntime-gpu); a missing one is an error"
    )


class ModelConfig(_Strict):
    package: Path | None = Field(None, description="a model package: a folder or a .tar; set this or name")
    name: str | None = Field(None, description="or: the store's package at <state_dir>/models/<name>/current")
    backend: Literal["auto", "onnxruntime", "tensorrt"] = Field(
        "auto", description="auto: TensorRT for an engine package, ONNX Runtime for an ONNX one"
    )
    onnxruntime: OnnxRuntimeConfig = Field(OnnxRuntimeConfig(), description="ONNX Runtime's settings")
    keys_dir: Path = Field(
        Path("/etc/edged/keys"), description="the public keys (*.pub) whose signatures this device accepts"
    )
    keep_versions: int = Field(
        3, ge=2, le=20, description="model versions kept in the store (current, previous and probation always)"
    )
    probation_s: float = Field(300.0, ge=0, description="a newly installed version is committed after this long ...")
    probation_batches: int = Field(500, ge=0, description="... and this many batches, with no inference errors")
    probation_max_crashes: int = Field(
        1, ge=0, le=100, description="daemon crashes tolerated on probation; one more rolls the version back"
    )
    probation_latency_ratio: float = Field(
        2.0, ge=0, description="median batch cost over the replaced version's x this rolls back (0: off)"
    )
    probation_output_ratio: float = Field(
        10.0,
        ge=0,
        description="detections per frame off by more than x this from the previous version's over its last "
        "frames before the swap (a model that suddenly detects nothing, or everything) rolls back (0: off); a "
        "collapse counts only when that window held at least 20 detections ...",
    )
    probation_output_frames: int = Field(
        200, ge=1, le=5000, description="... judged over this many frames of each version"
    )
    build_on_device: bool = Field(
        False, description="an ONNX package on a device with TensorRT: build an engine once, cache it, run it"
    )
    build_precision: Literal["fp16", "int8", "fp32"] | None = Field(
        None,
        description="precision for build_on_device; none: what the model is (its own precision on TensorRT "
        ">= 10.12, strongly typed; before: int8 for QDQ models, else fp16)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.package is None) == (self.name is None):
            raise ValueError("set exactly one of model.package (a package folder or .tar) or model.name")
        return self


class InferenceConfig(_Strict):
    max_wait_ms: float = Field(
        30.0, ge=0, le=10_000, description="after a batch's first frame, wait at most this long for more"
    )
    warmup_batches: int = Field(2, ge=0, le=100, description="batches run before serving")
    dedicated_core: bool = Field(
        False,
        description="give the inference thread a CPU core of its own (the last the daemon may use) and the "
        "daemon's other threads the rest: for a model on the CPU (onnxruntime.threads: 1) on a machine with few "
        "cores; not applied, with a warning, on a GPU or with other thread counts",
    )
    serving_timeout_s: float = Field(
        300.0,
        ge=0,
        le=86_400,
        description="the watchdog and /healthz fail (systemd restarts the daemon) when no camera has delivered a "
        "frame, or no batch has run, for this long while inference is not paused and a camera has not ended; "
        "0: off. At least 10; under 120 a site whose cameras all stay down can use up the unit's 5 starts in "
        "10 minutes",
    )

    @field_validator("serving_timeout_s")
    @classmethod
    def _serving_bound(cls, v: float) -> float:
        if 0 < v < 10:
            raise ValueError(f"{v:g} s: a camera's reconnect would restart the daemon; 0 (off) or at least 10")
        return v


class DetectionConfig(_Strict):
    score_threshold: float = Field(0.5, ge=0.0, le=1.0, description="minimum score")
    iou_threshold: float = Field(0.3, ge=0.0, le=1.0, description="NMS IoU, per class")
    max_detections: int = Field(100, ge=1, le=10_000, description="detections per frame, at most")
    labels: list[str] = Field([], description="publish only these labels; empty publishes all")


class TelemetryConfig(_Strict):
    interval_s: float = Field(5.0, ge=0.5, le=3600, description="telemetry period (and systemd STATUS=)")


class GovernorConfig(_Strict):
    enabled: bool = Field(True, description="run the governor")
    interval_s: float = Field(1.0, ge=0.1, le=60, description="sampling period")
    sysfs_root: Path = Field(
        Path("/"), description="where sys/, proc/meminfo and the nvpmodel files are read (a bind mount, a fixture tree)"
    )
    zones: list[str] = Field(
        [],
        description="thermal zone types to watch; empty watches the hottest SoC thermal zone (hwmon chips such as "
        "an NVMe drive only on a machine without thermal zones, never storage or network ones)",
    )
    warm_c: float = Field(85.0, ge=0, le=150, description="warm level (°C): the frame rate is scaled down")
    hot_c: float = Field(90.0, ge=0, le=150, description="hot level (°C): inference pauses, cameras keep reading")
    critical_c: float = Field(97.0, ge=0, le=150, description="critical level (°C): critical_action is taken")
    hysteresis_c: float = Field(5.0, ge=0, le=50, description="a level is left only this far below its threshold ...")
    min_dwell_s: float = Field(10.0, ge=0, le=3600, description="... and after this long in it")
    warm_fps_scale: float = Field(0.5, gt=0, le=1, description="frame-rate factor while warm")
    critical_action: Literal["pause", "exit"] = Field(
        "exit", description="exit (code 3, for systemd to handle) or pause"
    )
    power_cap_w: float | None = Field(
        None, gt=0, le=1000, description="total power cap: over it the frame rate scales by cap / power; none: no cap"
    )

    @model_validator(mode="after")
    def _ordered(self) -> GovernorConfig:
        if not self.warm_c < self.hot_c < self.critical_c:
            raise ValueError(
                f"thresholds must rise: warm_c {self.warm_c} < hot_c {self.hot_c} < critical_c {self.critical_c}"
            )
        return self


class RemoteConfigConfig(_Strict):
    enabled: bool = Field(
        True,
        description="take signed config documents (edged config push) for this device and its groups; each "
        "signed by a key of model.keys_dir, changing only the keys docs/operator.md lists",
    )
    ready_timeout_s: float = Field(
        60.0,
        ge=5,
        le=3600,
        description="after a document is applied: every camera up, a batch served and the broker connected "
        "within this long, else the last good config comes back (reverted, with the reason)",
    )


class OtaConfig(_Strict):
    enabled: bool = Field(True, description="accept model pushes (edged push) when the daemon runs the store")
    chunk_kb: int = Field(256, ge=4, le=4096, description="KiB asked for per chunk request")
    window: int = Field(4, ge=1, le=64, description="chunk requests in flight")
    retry_s: float = Field(
        5.0, gt=0, le=600, description="no chunk for this long (plus a jittered back-off): ask again from the last byte"
    )
    give_up_s: float = Field(
        3600.0,
        gt=0,
        description="no chunk (or, downloading over HTTP(S), no byte) for this long: the transfer fails "
        "(stalled); what arrived is kept",
    )
    http_rate_kib_s: float = Field(
        0.0, ge=0, description="the most an HTTP(S) package download reads, KiB/s; 0: no cap"
    )
    http_ca_file: Path | None = Field(
        None,
        description="CA certificates (PEM) that HTTPS package downloads trust; unset: the system's. "
        "Certificates are always verified",
    )
    http_timeout_s: float = Field(
        30.0, gt=0, le=600, description="an HTTP(S) download's connect and read timeout; then it retries"
    )
    http_min_rate_kib_s: float = Field(
        8.0,
        ge=0,
        description="the slowest an HTTP(S) package download may be, KiB/s: each file must arrive within "
        "http_timeout_s (a grace for connecting) + its bytes still to fetch at this rate, retries included, or "
        "the transfer fails (stalled; what arrived is kept) and the device takes other offers again. 8 KiB/s "
        "(64 kbit/s, a poor cellular link) gives a 50 MiB engine 107 min; a mirror dripping a byte a second "
        "fails instead of holding the device's only transfer for good. 0: no deadline (only give_up_s)",
    )

    @model_validator(mode="after")
    def _cap_over_minimum(self) -> OtaConfig:
        if 0 < self.http_rate_kib_s < self.http_min_rate_kib_s:
            raise ValueError(
                f"http_rate_kib_s ({self.http_rate_kib_s:g}) is below http_min_rate_kib_s "
                f"({self.http_min_rate_kib_s:g}): every download would miss its deadline; raise the cap or lower "
                "the minimum (0 turns the deadline off)"
            )
        return self


class MemoryConfig(_Strict):
    budget_mb: float = Field(
        4096.0, gt=0, le=1_000_000, description="the device budget: a model that does not fit on top is refused"
    )
    throttle_pct: float = Field(
        85.0,
        gt=0,
        le=100,
        description="memory spent over this share of the budget halves the frame rate: less CPU/GPU load and "
        "heat, no memory freed (buffers are preallocated); formerly soft_limit_pct (still read, deprecated)",
    )
    hard_limit_pct: float = Field(
        95.0, gt=0, le=100, description="RSS over this share stops the daemon cleanly (exit 3)"
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "soft_limit_pct" in data:
            if "throttle_pct" in data:
                raise ValueError("soft_limit_pct is the old name of throttle_pct: give only throttle_pct")
            logger.warning(
                "config: memory.soft_limit_pct is deprecated, read as memory.throttle_pct (it halves the frame "
                "rate, which frees no memory); rename it"
            )
            data = {("throttle_pct" if k == "soft_limit_pct" else k): v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _ordered(self) -> MemoryConfig:
        if self.throttle_pct >= self.hard_limit_pct:
            raise ValueError("throttle_pct must be below hard_limit_pct")
        return self
