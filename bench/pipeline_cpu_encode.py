#!/usr/bin/env python3
"""The publisher's per-result encoding, before and after (a benchmark script, not a test): the result document
built and dumped (``dumps(result_payload(...))``, how every result was encoded until issue 34) against
``result_bytes`` (daemon/delivery/payload.py: the same bytes, written without building the document), on
results of 0, 2 and 8 detections (with tracks and zones on half of them), interleaved in each repeat; CPU
microseconds per result (``time.thread_time``), medians, and the ratio within each repeat. Checks the bytes
are the same first.

    python bench/pipeline_cpu_encode.py [--repeats 7] [--n 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from edged.daemon.capture.camera import FrameMeta
from edged.daemon.capture.preprocess import Transform
from edged.daemon.decoders.base import Detection
from edged.daemon.delivery.payload import result_bytes, result_payload
from edged.daemon.inference import Result
from edged.protocol.schemas import dumps


def results(n_dets: int, n: int) -> list[Any]:
    t = Transform(0.2667, 0.2667, 0.0, 56.0, 960, 540)
    out = []
    for i in range(n):
        dets = [
            Detection(
                "face",
                0,
                0.91234567 - k * 0.01,
                (100.123 + k, 200.456, 180.789 + i % 7, 290.5),
                (k + 1) if k % 2 else None,
                ("door",) if k % 2 else (),
            )
            for k in range(n_dets)
        ]
        meta = FrameMeta(i, 1_764_000_000.0 + i / 30, 100.0 + i / 30, t, 100.0 + i / 30)
        out.append(Result(f"cam{i % 4}", meta, dets, 16.4321, 100.0 + i / 30 + 0.0473, "blazeface-back", 1))
    return out


def cpu_us(fn: Any, rs: list[Any]) -> float:
    c0 = time.thread_time()
    for seq, r in enumerate(rs):
        fn(r, "bench-01", "0" * 32, seq)
    return (time.thread_time() - c0) * 1e6 / len(rs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--n", type=int, default=2000, help="results per measurement")
    args = ap.parse_args()

    def document(r: Any, device: str, boot: str, seq: int) -> bytes:
        return dumps(result_payload(r, device, boot, seq))

    print("CPU us per result (thread clock), median of", args.repeats, "repeats; shared machine: read the ratios")
    for n_dets in (0, 2, 8):
        rs = results(n_dets, args.n)
        if any(
            result_bytes(r, "bench-01", "0" * 32, s) != document(r, "bench-01", "0" * 32, s) for s, r in enumerate(rs)
        ):
            raise SystemExit("result_bytes differs from the document's bytes")
        before, after, ratio = [], [], []
        for _ in range(args.repeats):
            b, a = cpu_us(document, rs), cpu_us(result_bytes, rs)
            before.append(b)
            after.append(a)
            ratio.append(b / a)
        print(
            f"  {n_dets} detections: document + dumps {statistics.median(before):6.1f} us, "
            f"result_bytes {statistics.median(after):6.1f} us, before / after {statistics.median(ratio):.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
