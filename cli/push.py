"""``edged push``: a signed model package to devices over MQTT (the client is ``edged.deploy.push``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .broker import add_broker_flags, broker_flags

if TYPE_CHECKING:
    from edged.daemon.config import MqttConfig
    from edged.protocol.shadow import ShadowAsk

TIMEOUT_S = 900  # a wave's default bound; a --shadow push adds its --max-s (edged.deploy.rollout.TIMEOUT_S)
SHADOW_FLAGS = ("sample_fps", "promote_if", "min_frames", "min_detections", "min_s", "max_s")
# the documented defaults, as the device takes them (`ShadowAsk`); written out so --help loads no pydantic
DEFAULTS_TEXT = (
    "--sample-fps 1 --promote-if 'agreement>=0.95,recall>=0.95,precision>=0.95,latency<=1.5' --min-frames 100 "
    "--min-detections 30 --min-s 20 --max-s 900"
)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    push = sub.add_parser(
        "push",
        help="push a signed model package to devices over MQTT, with progress",
        description="Offer a signed package on each device's cmd/ota; each device checks the manifest "
        "before anything is sent, then pulls the files in chunks it asks for, installs, swaps and "
        "reports. Resumes across broker outages and device restarts. A push is a rollout: waves, an abort "
        "threshold, and a state file from which a stopped push resumes (the same command again, or --resume). "
        "Exit 0 when every device succeeded, 1 when any did not (each is listed), 3 when the rollout aborted "
        "(over --max-failures), 130 when stopped (resumable). With --shadow each device first runs the candidate "
        "beside the serving version on a sample of its live frames and promotes it only when the evidence passes "
        "--promote-if; a rejected candidate (its figures shown) is a failure like any other.",
        epilog="examples:\n  edged push faces-8.tar --device orin-07\n"
        "  edged push faces-8.tar --group dock --canary 2 --wait commit -c operator.yaml\n"
        "  edged push faces-8.tar --group dock --waves 1,10,50,100 --max-failures 2%\n"
        "  edged push --resume ~/.local/state/edged/rollouts/faces@8-group-dock.json\n"
        "  edged push faces-9.tar --group dock --waves 10,100 --shadow --promote-if 'agreement>=0.95,recall>=0.98'\n"
        "  edged push plates-ocr-3.tar --stage ocr --device orin-07 --wait commit\n"
        f"\nshadow defaults: {DEFAULTS_TEXT}\n"
        "  figures: agreement (matched / the larger count), recall and precision against the serving model,\n"
        "  latency (the candidate's cost per image over the serving one's), score_shift; a scene that gives too\n"
        "  little evidence by --max-s ends no_evidence, never a pass",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    push.add_argument(
        "package", type=Path, nargs="?", help="a signed package tar (edged model pack --key); not with --resume"
    )
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
    push.add_argument(
        "--waves",
        default="100",
        metavar="P,P,...",
        help="cumulative percentages of the devices (after the canaries), e.g. 1,10,50,100; every wave but the "
        "last waits for its devices to commit (default 100: one wave)",
    )
    push.add_argument(
        "--max-failures",
        default="0",
        metavar="N|P%",
        help="failures (rejected, failed, rolled back, timed out) the rollout tolerates before it aborts the "
        "waves left: a count or a percentage of the devices (default 0)",
    )
    push.add_argument(
        "--state",
        type=Path,
        metavar="FILE",
        help="the rollout's state file (default: $XDG_STATE_HOME/edged/rollouts/<name>@<version>-<target>.json); "
        "an existing one of the same package is resumed",
    )
    push.add_argument(
        "--resume", type=Path, metavar="FILE", help="resume the rollout in FILE (package, devices, waves from it)"
    )
    push.add_argument(
        "--wait-offline",
        type=float,
        default=0.0,
        metavar="S",
        help="after the last wave, follow the group's offline devices this long as they come back and take "
        "the group's retained offer (default 0)",
    )
    push.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help=f"per wave (default {TIMEOUT_S:g}; with --shadow, {TIMEOUT_S:g} plus --max-s)",
    )
    push.add_argument(
        "--discover-s",
        type=float,
        default=2.0,
        metavar="S",
        help="time to collect a group when discovery's fence does not come back (an ACL without it) (2)",
    )
    push.add_argument(
        "--mirror",
        metavar="DIR_OR_URL",
        help="devices download the files over HTTP(S) from a web server: a directory to write them into "
        "(served at --mirror-url; without devices, only written), or the URL where they were uploaded "
        "(layout: sha256/<hex>)",
    )
    push.add_argument("--mirror-url", metavar="BASE", help="the URL at which the web server serves the --mirror DIR")
    push.add_argument(
        "--no-mirror-check",
        action="store_true",
        help="do not HEAD each URL first (only the devices reach the web server)",
    )
    push.add_argument(
        "--cancel",
        action="store_true",
        help="stop the transfer each --device runs (no package): it drops its files and publishes cancelled",
    )
    push.add_argument(
        "--stage",
        metavar="NAME",
        help="the package is the next version of the device's cascade stage NAME (stages[].name), not of its primary "
        "model: swapped in for that stage alone, judged on its own probation, rolled back alone; with --device",
    )
    add_shadow_flags(push)
    push.add_argument("-c", "--config", type=Path, help="a config file whose mqtt section to use (TLS, credentials)")
    add_broker_flags(push)
    push.set_defaults(func=_push)


def add_shadow_flags(push: argparse.ArgumentParser) -> None:
    """``--shadow`` and its evidence: each None unless given (the ask's documented defaults then)."""
    g = push.add_argument_group("shadow evaluation (promote on evidence from the device's live frames)")
    g.add_argument(
        "--shadow",
        action="store_true",
        help="run the candidate beside the serving version first; swap only when its report passes --promote-if",
    )
    g.add_argument("--sample-fps", type=float, metavar="F", help="frames per second per camera the candidate runs")
    g.add_argument(
        "--promote-if",
        metavar="RULES",
        help="thresholds on the report's totals, e.g. 'agreement>=0.95,recall>=0.98,latency<=1.2' "
        "(figures: agreement, recall, precision >= a share; latency, score_shift <= a bound)",
    )
    g.add_argument("--min-frames", type=int, metavar="N", help="frames evaluated before a verdict")
    g.add_argument(
        "--min-detections", type=int, metavar="N", help="detections (either model's) before a verdict; at least 1"
    )
    g.add_argument("--min-s", type=float, metavar="S", help="seconds of evaluation before a verdict")
    g.add_argument("--max-s", type=float, metavar="S", help="without the evidence by then: no_evidence (rejected)")
    g.add_argument("-v", "--verbose", action="store_true", help="show each camera's shadow figures too")


def shadow_from(args: argparse.Namespace) -> ShadowAsk | None:
    """The offer's shadow ask from the flags; None without --shadow. ValueError (a usage error) naming the bad
    flag or --promote-if term, or an evidence flag given without --shadow."""
    from edged.deploy.promote import shadow_ask

    given = [f for f in SHADOW_FLAGS if getattr(args, f) is not None]
    if args.resume is not None and (args.shadow or given):
        raise ValueError("--resume takes the shadow ask the rollout recorded; no --shadow flags with it")
    if not args.shadow:
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} needs --shadow")
        return None
    return shadow_ask(**{f: getattr(args, f) for f in SHADOW_FLAGS})


def _broker(args: argparse.Namespace) -> MqttConfig:
    """The config's mqtt section (with its EDGED_MQTT__* overrides) and the flags over it, as `edged watch`."""
    from edged.daemon.config import MqttConfig, load_mqtt_config
    from edged.daemon.config.mqtt import with_flags

    return with_flags(load_mqtt_config(args.config) if args.config else MqttConfig(), args.config, broker_flags(args))


def _push(args: argparse.Namespace) -> int:
    from edged.deploy.mirror import Mirror, is_url, stage
    from edged.deploy.rollout import start_rollout

    if args.cancel:
        return _cancel(args)
    if args.resume is None and args.package is None:
        print("edged push: error: name a package, or --resume FILE", file=sys.stderr)
        return 2
    if args.resume is None and not args.device and not args.group:
        if args.mirror and args.package is not None and not is_url(args.mirror):  # only onto the mirror
            for line in stage(args.package, Path(args.mirror), args.mirror_url):
                print(line)
            return 0
        print("edged push: error: name the devices (--device ID, repeatable) or a --group", file=sys.stderr)
        return 2
    try:
        shadow = shadow_from(args)
    except ValueError as exc:
        print(f"edged push: error: {exc}", file=sys.stderr)
        return 2
    if args.stage is not None:
        return _push_stage(args, shadow is not None)
    mirror = None
    if args.mirror or args.mirror_url:
        try:
            mirror = Mirror(args.mirror or "", args.mirror_url, check=not args.no_mirror_check)
        except ValueError as exc:
            print(f"edged push: error: {exc}", file=sys.stderr)
            return 2
    return start_rollout(
        _broker(args),
        args.package,
        args.device,
        args.group,
        args.canary,
        args.wait,
        args.timeout,
        args.discover_s,
        mirror=mirror,
        waves=args.waves,
        max_failures=args.max_failures,
        state=args.state,
        resume=args.resume,
        wait_offline_s=args.wait_offline,
        shadow=shadow,
        verbose=args.verbose,
    )


def _push_stage(args: argparse.Namespace, shadow: bool) -> int:
    """``--stage NAME``: the package as that cascade stage's next version, to each ``--device`` at once."""
    from edged.deploy.push import push_stage

    refused = [flag for flag, given in (("--group", args.group), ("--resume", args.resume), ("--shadow", shadow),
               ("--mirror", args.mirror or args.mirror_url), ("--canary", args.canary)) if given]  # fmt: skip
    if refused or not args.device or args.package is None:
        why = f"not with {', '.join(refused)}" if refused else "it takes a package and --device ID (repeatable)"
        print(f"edged push: error: --stage: {why}", file=sys.stderr)
        return 2
    timeout = args.timeout if args.timeout is not None else TIMEOUT_S
    return push_stage(_broker(args), args.package, args.stage, args.device, args.wait, timeout)


def _cancel(args: argparse.Namespace) -> int:
    """``--cancel``: the cancel command to each ``--device``; exit 0 when every one cancelled a transfer."""
    from edged.deploy.cancel import cancel

    if args.package is not None or args.resume is not None or args.group or not args.device:
        print("edged push: error: --cancel takes --device ID (repeatable), and no package, --resume or --group",
              file=sys.stderr)  # fmt: skip
        return 2
    return cancel(_broker(args), args.device, sys.stderr)
