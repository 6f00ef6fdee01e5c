"""``edged run`` (what systemd starts) and ``edged check-config``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edged.daemon.config import Config

# `edged run --duration S`: how long the run waits, once ready, for its first served batch (Daemon.run)
FIRST_BATCH_WAIT_S = 60.0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        help="run the daemon (what systemd starts)",
        description="Run the daemon until SIGTERM/SIGINT, --duration, or every camera has ended. SIGHUP re-reads "
        "the config. Exit 0 on a clean stop, 1 on a bad config or model or a --duration run that served no "
        "batch, 3 when the governor stopped it.",
    )
    run.add_argument("-c", "--config", required=True, type=Path, help="YAML config file")
    run.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="serve for S seconds, counted from the first served batch (not from the start, which a busy "
        "machine or a camera that opens late can make longer than S); a run that serves no batch within "
        f"{FIRST_BATCH_WAIT_S:.0f} s of ready stops then and exits 1",
    )
    run.set_defaults(func=_run)

    chk = sub.add_parser(
        "check-config",
        help="validate a config; exit 0 if good, 1 if not",
        description="Validate the config (every error names the key and the file, or the EDGED_* variable that set "
        "it), check that the files it names are there (TLS, password and CA files, model.package), check each "
        "camera without opening it (a file or device that does not exist, csi:// without nvarguscamerasrc, a "
        "gst:// pipeline that does not parse), then check that its model package opens (a .tar is unpacked into a "
        "temporary folder, not the state directory) and its backend and decoder are available. Every problem is "
        "reported, not only the first.",
    )
    chk.add_argument("-c", "--config", required=True, type=Path)
    chk.add_argument("--no-model", action="store_true", help="validate the file only, do not open the model")
    chk.add_argument(
        "--probe-cameras",
        action="store_true",
        help="open each camera once and print its resolution, frame rate, codec and the capture path chosen",
    )
    chk.set_defaults(func=_check)


def _run(args: argparse.Namespace) -> int:
    # Signals first (before the heavy imports): a SIGTERM in any phase is a clean stop, a SIGHUP never kills.
    from edged.daemon.host.startup import Signals, StateLock
    from edged.errors import StoppedBeforeStart

    signals = Signals()
    signals.install()
    from edged.daemon.app import Daemon
    from edged.daemon.config import load_config

    cfg = load_config(args.config)
    logging.getLogger().setLevel(logging.DEBUG if args.verbose else cfg.log_level.upper())
    if signals.stop.is_set():
        print(f"edged: stopped by {signals.received} before the start", file=sys.stderr)
        return 0
    lock = StateLock(cfg.state_dir, wait_s=2.0)  # before anything touches the state directory
    try:
        daemon = Daemon(cfg, config_path=args.config, signals=signals, lock=lock)
    except StoppedBeforeStart:
        print(f"edged: stopped by {signals.received} before the model was opened", file=sys.stderr)
        return 0
    summary = daemon.run(args.duration, first_batch_wait_s=FIRST_BATCH_WAIT_S)
    if daemon.first_batch_s is None:
        served = "no batch served"
    else:
        served = f"first batch {daemon.first_batch_s:.1f} s after the start, then {daemon.served_s:.1f} s serving"
    print(
        f"edged: {summary.results} results in {summary.batches} batches over {summary.seconds:.1f} s ({served}); "
        f"{summary.spooled} messages spooled, {summary.delivered} delivered, {summary.left_in_spool} left in "
        f"the spool, {summary.lost} dropped; peak RSS {summary.peak_rss_mb:.0f} MB"
        + (f"; {summary.events_dropped} object events over their cameras' caps" if summary.events_dropped else ""),
        file=sys.stderr,
    )
    if summary.failure:
        print(f"edged: stopped: {summary.failure}", file=sys.stderr)
        return 1
    if daemon.unserved:
        print(f"edged: stopped: {daemon.unserved}", file=sys.stderr)
        return 1
    if daemon.restart_reason:  # a probation rollback that cannot be done live: systemd starts us again
        print(f"edged: stopped for a restart: {daemon.restart_reason}", file=sys.stderr)
        return 3
    if summary.stop_reason:
        print(f"edged: stopped by the governor: {summary.stop_reason}", file=sys.stderr)
        return 3
    return 0


def _check(args: argparse.Namespace) -> int:
    from edged.daemon.config import load_config, missing_files

    cfg = load_config(args.config)
    missing = missing_files(cfg, model=not args.no_model)
    for problem in missing:  # the key and the file; the daemon would fail on it at its start or first connect
        print(f"{args.config}: {problem}", file=sys.stderr)
    if not missing:
        print(
            f"{args.config}: config valid (device {cfg.device_id}, {len(cfg.cameras)} camera(s), "
            f"broker {cfg.mqtt.host}:{cfg.mqtt.port})"
        )
    from edged.daemon.capture.probe import check_camera
    from edged.daemon.capture.sources import tls_warnings
    from edged.errors import CaptureError

    bad = 0
    for cam in cfg.cameras:  # the display form: no user, no password
        shown = f"camera {cam.name}: {cam.display}" + (" (password from password_file)" if cam.password_file else "")
        try:
            print(f"{shown}: capture {check_camera(cam)}")
            for warning in tls_warnings(cam):
                print(f"{shown}: WARNING: {warning}", file=sys.stderr)
        except CaptureError as exc:
            print(f"{shown}: {exc}", file=sys.stderr)
            bad += 1
            continue
        if args.probe_cameras:
            from edged.daemon.capture.probe import probe_camera

            try:
                print(f"  probe: {probe_camera(cam).line()}")
            except CaptureError as exc:
                print(f"  probe failed: {exc}", file=sys.stderr)
                bad += 1
    if bad:
        print(f"{args.config}: {bad} camera(s) failed their check", file=sys.stderr)
    if args.no_model or any(p.startswith("model.package:") for p in missing):
        return 1 if bad or missing else 0
    from edged.errors import EdgedError

    try:
        _check_model(cfg)
    except EdgedError as exc:  # after the cameras: every problem of the config in one run
        print(f"{args.config}: model: {exc}", file=sys.stderr)
        return 1
    return 1 if bad or missing else 0


def _check_model(cfg: Config) -> None:
    """The package opens (a .tar unpacked into a temporary folder: a running daemon's staging/ is its own),
    its backend and decoder are available."""
    import tempfile

    from edged.daemon.backends import open_backend
    from edged.daemon.decoders import build_decoder
    from edged.daemon.lifecycle.loader import resolve_package
    from edged.daemon.lifecycle.manager import check_io
    from edged.models.package import open_package

    with tempfile.TemporaryDirectory(prefix="edged-check-") as scratch:
        pkg = open_package(cfg.model.package, Path(scratch)) if cfg.model.package else resolve_package(cfg)
        m = pkg.manifest
        with open_backend(
            m.kind,
            pkg.model_path,
            cfg.model.backend,
            threads=1,
            providers=tuple(cfg.model.onnxruntime.providers),
            compatibility=m.compatibility,
            has_onnx="model.onnx" in m.files,
        ) as backend:
            check_io(pkg, backend)
            build_decoder(m.decoder, m.input, m.labels, {o.name: o.shape for o in backend.outputs})
            print(f"model {pkg.ref}: {m.kind} on {backend.name}, batch {m.input.batch}, decoder {m.decoder.type}: ok")
