"""The report of bench/pipeline.py: the ratios it derives from the figures measured (eta: end to end over
the engine alone), the printed table, and the JSON and the PNG plot of the stage breakdown."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline_batch import one_camera_lines


def add_ratios(res: dict[str, Any]) -> None:
    """The derived figures, into `res`: eta (end to end / the engine alone) and end to end / naive."""
    res["eta_ort"] = res["e2e_ort"] / res["raw_ort"]
    res["eta_sleep"] = res["e2e_sleep"] / res["raw_sleep"]
    res["eta_ort_loaded"] = res["e2e_ort"] / res["raw_ort_loaded"]
    for fig in res["sleep"].values():
        fig["eta"] = fig["e2e"] / fig["raw"]
        fig["eta_of_supply"] = fig["e2e"] / min(fig["raw"], res["e2e_free"])
        fig["eta_nodecode"] = fig["e2e_nodecode"] / fig["raw"]
        fig["eta_nodecode_of_supply"] = fig["e2e_nodecode"] / min(fig["raw"], res["e2e_nodecode_free"])
    res["e2e_vs_naive_sleep"] = res["e2e_sleep"] / res["naive_sleep"]
    res["e2e_vs_naive_sleep_b1"] = res["e2e_sleep"] / res["naive_sleep_b1"]


def report_lines(res: dict[str, Any], B: int) -> list[tuple[str, str, str]]:
    """The printed table: (what, figure, ratio) a row."""
    s = res["stages_ms"]
    return [
        ("raw backend, ONNX Runtime 1 thread", f"{res['raw_ort']:.1f} img/s", ""),
        (
            "raw backend, the other core decoding video",
            f"{res['raw_ort_loaded']:.1f} img/s",
            f"{res['raw_ort_loaded'] / res['raw_ort']:.3f} of raw",
        ),
        (
            "end to end, ONNX Runtime",
            f"{res['e2e_ort']:.1f} img/s",
            f"eta {res['eta_ort']:.3f} ({res['e2e_ort'] / res['raw_ort_loaded']:.3f} of the loaded engine); "
            f"overhead {1000 / res['e2e_ort'] - 1000 / res['raw_ort']:.2f} ms/frame",
        ),
        (
            "raw backend, camera work at the e2e rate",
            f"{res['raw_ort_paced']:.1f} img/s",
            f"e2e / it, each repeat: {res['eta_ort_paced']:.3f} (median)",
        ),
        (
            "the engine inside the daemon (p50 batch)",
            f"{res['engine_in_daemon']:.1f} img/s",
            f"{res['engine_in_daemon'] / res['raw_ort']:.3f} of raw; e2e / it (kept busy): {res['engine_busy']:.3f}",
        ),
        (
            "end to end, inference.dedicated_core",
            f"{res['e2e_ort_dc']:.1f} img/s",
            f"{res['e2e_ort_dc'] / res['e2e_ort']:.3f} of without; eta {res['eta_ort_dc_run']:.3f} "
            f"(without: {res['eta_ort_run']:.3f}; each against raw measured right after it)",
        ),
        (
            "  its engine inside the daemon (p50 batch)",
            f"{res['engine_in_daemon_dc']:.1f} img/s",
            f"{res['engine_in_daemon_dc'] / res['raw_ort']:.3f} of raw; kept busy: {res['engine_busy_dc']:.3f}",
        ),
        (
            "naive loop, ONNX Runtime (batch-B engine)",
            f"{res['naive_ort']:.1f} img/s",
            f"e2e / naive {res['e2e_ort'] / res['naive_ort']:.2f}x",
        ),
        *(
            line
            for ms, fig in res["sleep"].items()
            for line in (
                (f"raw backend, sleeping {ms:g} ms/img", f"{fig['raw']:.1f} img/s", ""),
                (
                    f"end to end, sleeping {ms:g} ms/img",
                    f"{fig['e2e']:.1f} img/s",
                    f"eta {fig['eta']:.3f} ({fig['eta_of_supply']:.3f} of min(engine, no-engine pipeline)); "
                    f"overhead {1000 / fig['e2e'] - 1000 / fig['raw']:.2f} ms/frame",
                ),
                (
                    "  the same, cameras without decoding",
                    f"{fig['e2e_nodecode']:.1f} img/s",
                    f"eta {fig['eta_nodecode']:.3f} ({fig['eta_nodecode_of_supply']:.3f} of min(engine, "
                    f"no-engine pipeline)); overhead {1000 / fig['e2e_nodecode'] - 1000 / fig['raw']:.2f} ms/frame",
                ),
            )
        ),
        (
            "end to end, a backend that returns at once",
            f"{res['e2e_free']:.1f} img/s",
            "what the cameras and the pipeline deliver with no engine time",
        ),
        (
            "  the same, cameras without decoding",
            f"{res['e2e_nodecode_free']:.1f} img/s",
            "synthetic 960x540 at <= 240 fps each: a hardware decoder's stand-in",
        ),
        (
            "naive loop, sleeping (batch-B engine)",
            f"{res['naive_sleep']:.1f} img/s",
            f"e2e / naive {res['e2e_vs_naive_sleep']:.2f}x",
        ),
        (
            "naive loop, sleeping (batch-1 engine)",
            f"{res['naive_sleep_b1']:.1f} img/s",
            f"e2e / naive {res['e2e_vs_naive_sleep_b1']:.2f}x",
        ),
        (
            "2x overload, sleeping",
            f"{res['overload_delivered_per_s']:.1f} img/s",
            f"delivered / capacity {res['overload_ratio']:.3f}",
        ),
        (
            "capture-to-publish at 0.5x load, sleeping",
            f"p50 {res['latency_half_load_p50_ms']:.1f} ms",
            f"p99 {res['latency_half_load_p99_ms']:.1f} ms",
        ),
        *one_camera_lines(res, B),
        ("peak RSS of the daemon", f"{res['peak_rss_mb']:.0f} MB", ""),
        ("stages alone, ms/frame", " ".join(f"{k} {v:.2f}" for k, v in s.items()), ""),
    ]


def write_report(out: Path, res: dict[str, Any], B: int) -> None:
    """Print the table; write pipeline.json and pipeline.png under `out`."""
    lines = report_lines(res, B)
    s = res["stages_ms"]
    width = max(len(a) for a, _, _ in lines)
    for a, b, c in lines:
        print(f"{a:<{width}}  {b:<22} {c}")
    (out / "pipeline.json").write_text(json.dumps(res, indent=2))
    plot(
        out / "pipeline.png",
        s,
        {
            "engine alone (ONNX Runtime)": 1000 / res["raw_ort"],
            "pipeline (ONNX Runtime)": 1000 / res["e2e_ort"],
            "naive loop (ONNX Runtime)": 1000 / res["naive_ort"],
        },
        f"BlazeFace-256, batch {B}, ONNX Runtime 1 thread, {os.cpu_count()} cores",
    )
    print(f"\nwrote {out / 'pipeline.json'} and {out / 'pipeline.png'}")


def plot(path: Path, stages: dict[str, float], rows: dict[str, float], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6))
    left = 0.0
    colours = ["#8da0cb", "#66c2a5", "#fc8d62", "#e78ac3", "#a6d854"]
    for (name, ms), colour in zip(stages.items(), colours, strict=True):
        ax.barh("stages, one frame\n(sequential sum)", ms, left=left, color=colour, label=f"{name} {ms:.2f} ms")
        left += ms
    for label, ms in rows.items():
        ax.barh(label, ms, color="#999999")
        ax.text(ms, label, f" {ms:.2f} ms", va="center")
    ax.set_xlabel("ms per frame")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
