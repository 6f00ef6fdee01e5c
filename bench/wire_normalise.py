"""What may differ between two runs of the same edged, and nothing else (bench/wire_compare.py).

Payloads are normalised as text, not parsed and written again: a change of key order, separators or number
formatting stays a difference. Only the values of the keys in VARYING are replaced, by key name, wherever they
occur in a JSON payload; everything else, detections included, must be byte for byte the same. The demo run
is deterministic where it matters: every frame of the file is inferred once, alone in its batch, by ONNX
Runtime on the CPU with one thread, so boxes, scores, track ids, zones and event order repeat exactly.
"""

from __future__ import annotations

import re

# key name -> why its value differs between two runs of the same code
VARYING: dict[str, str] = {
    "boot_id": "a random id drawn at every start",
    "since": "the wall-clock time the daemon started",
    "ts": "the wall-clock time a message was made",
    "captured_at": "the wall-clock time a frame was read",
    "first_seen": "the wall-clock time of a track's first frame",
    "last_seen": "the wall-clock time of a track's last frame",
    "dwell_s": "the difference of two capture wall-clock times",
    "zone_dwell_s": "the difference of two capture wall-clock times",
    "uptime_s": "seconds since the start",
    "capture_to_result": "a measured latency (result latency_ms)",
    "infer": "a measured latency (result latency_ms)",
    "p50": "a percentile of measured latencies (telemetry)",
    "p95": "a percentile of measured latencies (telemetry)",
    "p99": "a percentile of measured latencies (telemetry)",
    "fps": "a rate over wall-clock time",
    "rss_mb": "the process's memory at that instant",
    "peak_rss_mb": "the process's memory",
    "model_mb": "the model's memory, measured as the RSS it added at load",
    "mem_available_mb": "the machine's free memory",
    "rss_slope_mb_per_min": "a fit of RSS over time (null until there are samples)",
    "cpu_pct": "the governor's measured CPU time",
    "samples": "governor readings so far: one a second",
    "spool_rows": "rows not yet deleted from the spool at that instant (group commit, PUBACK timing)",
    "spool_mb": "the spool file's size at that instant",
    "acked": "PUBACKs in by the instant of the stop's telemetry: the last events' acknowledgements race it",
    "inflight": "QoS 1 messages not yet acknowledged at that instant (the same race)",
}

# An object event's crop is compared byte for byte: it is cut from the frame its box was found in
# (Camera.frame_for). Before that fix it came from the camera's newest frame, a race this script found.

# /metrics sample names whose values are measurements (the name, its labels and HELP/TYPE stay exact)
METRIC_VARYING: dict[str, str] = {
    r"edged_uptime_seconds": "seconds since the start",
    r"edged_\w+_seconds_(bucket|sum)": "a histogram of measured latencies (its _count is exact)",
    r"edged_memory_bytes": "the process's memory",
    r"edged_spool_(bytes|rows)": "the spool at that instant (group commit, PUBACK timing)",
    r"edged_inference_fps": "a rate over wall-clock time",
}

PLACEHOLDER = '"<varies>"'
_SCALAR = r'-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|"(?:[^"\\]|\\.)*"|true|false|null'
_KEYS = re.compile(r'(?<!\\)("(?:' + "|".join(map(re.escape, VARYING)) + r')"\s*:\s*)(?:' + _SCALAR + ")")
_METRIC = re.compile(r"^((?:" + "|".join(METRIC_VARYING) + r")(?:\{[^}]*\})?) \S+$", re.MULTILINE)


def normalise_json(text: str) -> str:
    """`text` (a JSON document) with the value of every VARYING key replaced by "<varies>"."""
    return _KEYS.sub(lambda m: m.group(1) + PLACEHOLDER, text)


def normalise_metrics(text: str) -> str:
    """A /metrics page with the values of the METRIC_VARYING samples replaced by <varies>."""
    return _METRIC.sub(lambda m: m.group(1) + " <varies>", text)


def normalise_payload(payload: bytes) -> bytes:
    """A payload for comparison: JSON normalised as text, anything else (a JPEG) as it is."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return payload
    if not text.lstrip().startswith(("{", "[")):
        return payload
    return normalise_json(text).encode("utf-8")
