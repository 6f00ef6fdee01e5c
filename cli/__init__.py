"""``edged <verb>``: the one command line of edged (DESIGN.md §1: ``cli/``, imported as ``edged.cli``).

Each verb, or group of verbs, is a module of this package with ``add_parsers(sub)``, which adds its
subparser and options beside its handler and names the handler with ``set_defaults(func=...)``; ``main``
parses and calls it. Handlers import their part when they run, so ``edged run`` on a device never loads
build tools, and ``edged watch`` and ``edged push`` load neither OpenCV nor ONNX Runtime.

    run.py       run, check-config              observe.py   watch, telemetry (watch.py: the subscriber)
    certs.py     certs ca|server|device|…       quantize.py  quantize, build-engine
    keys.py      keys generate                  bundle.py    bundle build|verify
    model.py     model pack|sign|golden|fold    store.py     model verify|install|list|rollback
    demo.py      model fetch-demo               push.py      push (the client: edged.deploy.push)
    doctor.py    doctor (checks: edged.daemon.doctor)
    fleet.py     fleet, diagnose (edged.deploy.fleet; diagnose.py: the asker)
    config.py    config push|show|clear (remote configuration: edged.deploy.config_push)

Exit codes: 0 success, 1 a user-facing error (bad config, bad model, fetch failure), 2 usage; some verbs
add their own (``run``: 3, ``quantize``: 4), named in their help.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from edged import __version__
from edged.errors import EdgedError

from . import bundle, certs, clips, config, doctor, fleet, keys, model, observe, push, quantize, run

EPILOG = """\
examples:
  edged model fetch-demo                    fetch the demo models and video (~/.cache/edged/demo)
  edged check-config -c examples/demo.yaml  validate a config, its model and its cameras
  edged run -c examples/demo.yaml --duration 20
  edged watch -c examples/demo.yaml         print what the device publishes
  edged watch --host broker --device orin-07 --cafile ca.crt --cert backend.crt --key backend.key
  edged telemetry                           one reading of thermals, power, GPU and memory
  edged doctor -c /etc/edged/edged.yaml     can this device run edged? one line per check, with the fix
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

# The order of `edged --help`'s verb list.
VERBS = (run, doctor, observe, certs, quantize, keys, bundle, model, push, fleet, config, clips)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The whole ``edged`` command line (also the source of the generated CLI reference and man page)."""
    p = argparse.ArgumentParser(
        prog="edged",
        description="Inference daemon for Jetson-class edge devices: cameras -> fixed-batch inference -> MQTT.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"edged {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        verb.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "func", None)
    if handler is None:  # every leaf parser sets one; a verb added without it is a usage error, not a crash
        parser.print_usage(sys.stderr)
        return 2
    from edged.daemon.host.systemd import log_handler

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[log_handler()])
    try:
        return handler(args)
    except EdgedError as exc:
        print(f"edged: error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # an extra not installed (ONNX Runtime, OpenCV): name it and its fix
        from edged.daemon.host.extras import missing_message  # here: `edged push`/`watch` load nothing of the daemon

        fix = missing_message(exc.name or "")
        if fix is None:
            raise
        print(f"edged: error: {fix}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
