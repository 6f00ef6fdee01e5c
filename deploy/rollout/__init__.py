"""Rollouts that survive the pusher: ``edged push`` in waves, its state in a file, stopped and resumed.

A rollout is a JSON file (``edged.rollout/1``, written atomically after every change, at most every
`SAVE_EVERY_S` during a wave): the package, the transfer id, the plan (the devices of each wave, fixed
when it starts), each device's outcome, the wave reached and how the rollout ended. It lives beside the
operator, not on the broker: a file is what an operator can read, copy and delete, and a retained message
would be readable (and clearable) by every client the ACL lets read the prefix. Its default place is
``$XDG_STATE_HOME/edged/rollouts/<name>@<version>-<group or devices>-<host>_<port>.json`` (``~/.local/state``), so
running the same command again resumes it; ``--state FILE`` names another; ``--resume FILE`` takes
everything (package, targets, waves, thresholds) from the file.

The plan: ``--canary N`` devices first, then ``--waves 1,10,50,100`` (cumulative percentages of the rest;
default one wave). Every wave but the last waits for its devices to commit (probation passed); the last
waits as ``--wait`` says. After each wave the failures (rejected, failed, rolled back, timed out) of the
whole rollout are held against ``--max-failures`` (a count, or a percentage of the devices, default 0):
over it, the rest is left untouched (``skipped``), the group's offer is withdrawn and the exit status is 3.

A resume (the same command again, or ``--resume``) keeps the transfer id, so a device downloading when
the pusher stopped carries on with what it has; it never offers to a device whose retained model state
runs the version committed (whatever the file says), nor again to one that failed (timed out included);
the others (offered, downloading, offline, and one recorded as succeeded whose model state says
otherwise) are offered again. A finished rollout is not resumed: the same command again starts a new one (with a new
transfer id; devices already current answer ``unchanged``). An aborted rollout is not resumed
(remove its file to start over).

With ``--group``, when the rollout reaches its last wave the offer is also published, retained, on the
group's topic (`edged.protocol.topics.group_offer`): a device of the group that was offline takes it when
it connects again (`edged.daemon.lifecycle.ota.group_offer`), still refused if older than what it runs or rolled back
there. The pusher follows such devices (``--wait-offline S`` after the last wave) and serves them. The
retained offer lives only while a pusher serves it: it expires (MQTT v5 Message Expiry) when this one
stops waiting and is withdrawn when it exits, so a device back later never starts a transfer nobody
serves (pushing again serves it: a new rollout).

With ``--shadow`` (`edged.deploy.promote`) every wave's devices first evaluate the candidate on their live
frames; a device whose evidence fails the thresholds (``model_rejected``) or that saw too little to judge on
(``no_evidence``) ends ``rejected`` and counts against ``--max-failures`` like any failure, so the rollout
stops before the next wave. The state file keeps the ask (``shadow``) and each device's report (its
outcome's ``shadow``: state, totals, per camera, reasons), and the report names each device with its figures.

Exit status: 0 every device succeeded; 1 some did not (within the threshold), or stayed offline; 2 usage
or another rollout's state; 3 aborted (over the threshold); 130 stopped (resume it).
"""

from __future__ import annotations

import functools
import json
import math
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any, TextIO

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.errors import Code, EdgedError
from edged.errors import RolloutError as RolloutError  # importable here as before
from edged.protocol import topics
from edged.protocol.client import MqttSettings
from edged.protocol.ota import group_offer_payload
from edged.protocol.shadow import ShadowAsk

from ..mirror import Mirror
from ..progress import report
from ..promote import ShadowView, ask_text, summary_text
from ..push import Device, Wait
from .pusher import RolloutPusher

# the plan and the state file live in rollout/state.py; re-exported: `from edged.deploy.rollout import plan_waves`
from .state import FAILED, OK, Rollout, open_rollout, running_lock
from .state import SAVE_EVERY_S as SAVE_EVERY_S
from .state import SCHEMA as SCHEMA
from .state import allowed_failures as allowed_failures
from .state import default_state_path as default_state_path
from .state import new_rollout as new_rollout
from .state import parse_waves as parse_waves
from .state import plan_waves as plan_waves

EXIT_ABORTED = 3
TIMEOUT_S = 900.0  # a wave's default bound; a rollout that shadows adds its ask's max_s
EXIT_STOPPED = 130


def _stop_on_sigterm() -> Any:
    """SIGTERM means what Ctrl-C means: stop, keep the state for a resume."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (a test driving run_rollout): nothing to install
        return None


def run_rollout(
    mqtt_cfg: MqttSettings,
    r: Rollout,
    timeout_s: float,
    discover_s: float = 2.0,
    wait_offline_s: float = 0.0,
    out: TextIO = sys.stderr,
    mirror: Mirror | None = None,
    verbose: bool = False,
) -> int:
    resumed = r.status != "new"
    pusher = RolloutPusher(mqtt_cfg, Path(r.package), out, transfer=r.transfer)
    pusher.resumed = resumed
    pusher.verbose = verbose
    if r.shadow is not None:
        pusher.use_shadow(ShadowAsk.model_validate(r.shadow))
    print(
        f"push: {pusher.ref} ({pusher.total / 2**20:.1f} MiB, transfer {pusher.transfer}) via "
        f"{mqtt_cfg.host}:{mqtt_cfg.port}; rollout state {r.path}"
        + (" (resumed)" if resumed else "")
        + (" (another push of it runs now: this is a rollout of its own)" if r.beside else ""),
        file=out,
    )
    if pusher.shadow_ask is not None:
        print(f"push: shadow first: {ask_text(pusher.shadow_ask)}", file=out)
    old_handler = _stop_on_sigterm()
    t0 = time.monotonic()
    try:
        if mirror is not None:  # before anything is offered: the files must be there (a resume keeps its URLs)
            r.urls = mirror.prepare(pusher.manifest, pusher.files, out)
        if r.urls:
            pusher.use_urls(r.urls)
        pusher.connect()
        _settle_targets(pusher, r, discover_s, out)
        r.status = "running"
        r.save()
        allowed = allowed_failures(r.max_failures, len(r.targets()))
        code = _waves(pusher, r, timeout_s, wait_offline_s, allowed, out)
        _final_report(pusher, r, time.monotonic() - t0, out)
        return code
    except KeyboardInterrupt:
        r.record([d for d in pusher.devices.values() if d.active or d.ended is not None])
        r.status, r.reason = "stopped", "interrupted"
        r.save()
        print(f"push: stopped; resume with: edged push --resume {r.path}", file=out)
        return EXIT_STOPPED
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        if not pusher.urls or r.status == "aborted":  # a mirror serves it when we are gone; else nobody does
            _withdraw_group_offer(pusher)  # (a SIGKILL leaves it to expire)
        pusher.close()


def _settle_targets(pusher: RolloutPusher, r: Rollout, discover_s: float, out: TextIO) -> None:
    """The plan, made at the first run; a resume adds devices of the group seen online since (last wave)."""
    online: list[str] = []
    offline: list[str] = []
    if r.group is not None:
        t = time.monotonic()
        online, offline = pusher.discover(r.group, discover_s)
        print(
            f"push: group {r.group!r}: {len(online)} online, {len(offline)} offline "
            f"(discovered in {time.monotonic() - t:.1f} s)",
            file=out,
        )
    if not r.plan:
        targets = list(dict.fromkeys(r.devices + online))
        if not targets:
            no_device = "no device to push to (no --device, and no online device in the group)"
            raise EdgedError(no_device, code=Code.NO_DEVICES)
        r.plan = plan_waves(targets, r.canary, r.waves)
    else:
        known = set(r.targets())
        new = [d for d in online if d not in known]
        if new:
            r.plan[-1].extend(new)
            print(f"push: {len(new)} device(s) of the group new since the rollout began: in the last wave", file=out)
    r.offline = [d for d in offline if d not in set(r.targets())]


def _waves(
    pusher: RolloutPusher, r: Rollout, timeout_s: float, wait_offline_s: float, allowed: int, out: TextIO
) -> int:
    last = len(r.plan) - 1
    for i, wave in enumerate(r.plan):
        # a device recorded as succeeded is offered again only if its retained model state does not run the
        # version (rolled back since, or another broker's device of the same name): `run_wave` checks
        todo = [d for d in wave if r.state_of(d) not in FAILED]
        done = sum(1 for d in wave if r.state_of(d) in OK)
        wait: Wait = r.wait if i == last else "commit"
        name = "canary wave" if i == 0 and r.canary and len(r.plan) > 1 else f"wave {i + 1}/{len(r.plan)}"
        print(
            f"push: {name}: {len(wave)} device(s)"
            + (f", {done} done before (offered again only if their model state says otherwise)" if done else "")
            + (f", {len(wave) - len(todo)} failed before (not offered again)" if len(todo) < len(wave) else "")
            + f", waiting for {wait}",
            file=out,
        )
        follow: list[str] = []
        group_offer: Callable[[], None] | None = None
        if i == last and r.group is not None:
            group_offer = functools.partial(_publish_group_offer, pusher, r.group, timeout_s + wait_offline_s + 30)
            follow = [d for d in r.offline if r.state_of(d) not in OK + FAILED]
        r.wave = i
        r.save()

        def tick() -> None:  # during the wave: what each device reached, saved at most every SAVE_EVERY_S
            r.record([d for d in pusher.devices.values() if d.active])
            r.save(force=False)

        pusher.run_wave(todo, follow, wait, timeout_s, tick, offered=group_offer)  # followers back are served
        r.record([pusher.devices[d] for d in todo])
        still = [d for d in follow if pusher.devices[d].state == "offline"]
        if still and wait_offline_s > 0:
            print(f"push: following {len(still)} offline device(s) for up to {wait_offline_s:.0f} s", file=out)
            pusher.run_wave([], still, wait, wait_offline_s, tick, wait_follow=True)
        for dev in follow:
            d = pusher.devices.get(dev)
            if d is None or d.state == "offline" or d.ended is None:
                back = "it takes the group's offer from the mirror" if pusher.urls else "push again to serve it"
                r.outcomes[dev] = {"state": "offline", "error": f"offline; {back} when it is back"}
            else:
                r.record([d])  # with its shadow report (a --shadow rollout), as a wave's device's
        r.wave = i + 1
        failures = r.failures()
        if len(failures) > allowed and i == last:  # nothing left to abort; devices away must not take it
            if pusher.group_offered is not None:
                _withdraw_group_offer(pusher)
                print(f"push: {len(failures)} failure(s): the group's offer is withdrawn", file=out)
        elif len(failures) > allowed:
            skipped = [d for w in r.plan[i + 1 :] for d in w if r.state_of(d) not in OK + FAILED]
            for dev in skipped:
                r.outcomes[dev] = {"state": "skipped", "error": "left untouched: the rollout aborted"}
            _withdraw_group_offer(pusher)
            r.status = "aborted"
            named = "; ".join(_failure_text(r, dev) for dev in failures[:5])
            r.reason = f"{len(failures)} failure(s) ({named}) over --max-failures {r.max_failures}"
            r.save()
            print(f"push: ABORTED after {name}: {r.reason}; {len(skipped)} device(s) left untouched", file=out)
            return EXIT_ABORTED
        if name == "canary wave":
            print(f"push: canaries committed; the rest: {len(r.targets()) - len(wave)} device(s)", file=out)
        r.save()
    r.status = "done"
    r.save()
    bad = [dev for dev in r.targets() + r.offline if r.state_of(dev) not in OK and not _ok_swap(r, dev)]
    return 0 if not bad else 1


def _failure_text(r: Rollout, dev: str) -> str:
    """A failed device in the abort's reason: its id, with its shadow figures when it was judged on them."""
    shadow = r.outcomes.get(dev, {}).get("shadow")
    return f"{dev}: {summary_text(shadow)}" if isinstance(shadow, dict) else dev


def _ok_swap(r: Rollout, dev: str) -> bool:
    return r.wait == "swap" and r.state_of(dev) == "probation"


def _publish_group_offer(pusher: RolloutPusher, group: str, serve_s: float) -> None:
    """The rollout's offer, retained on the group's topic: devices offline now take it when they return.
    Served by this pusher (chunks over MQTT), it expires (MQTT v5 Message Expiry) when the pusher stops
    serving (`serve_s`) and is withdrawn when it exits: a device that comes back later never starts a
    transfer nobody serves. Served by a web server (``--mirror``), it stays until the group's next rollout
    replaces it or this one aborts: a device back in a week still catches up, from the mirror."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if not pusher.urls:
        props.MessageExpiryInterval = max(1, math.ceil(serve_s))
    info = pusher.client.publish(
        topics.group_offer(pusher.prefix, group),
        group_offer_payload(group, pusher.offer_args()),
        qos=1,
        retain=True,
        properties=props,
    )
    info.wait_for_publish(10)
    refused = pusher.refused.pop(info.mid, None)
    if refused is not None or not info.is_published():
        why = f"refused it ({refused})" if refused else "did not acknowledge it within 10 s"
        print(
            f"push: WARNING: the broker {why}: group {group!r}'s devices that are offline will not take this "
            f"offer (the identity needs `topic write {pusher.prefix}/_groups/+/ota` in the broker's ACL)",
            file=pusher.out,
        )
        return
    pusher.group_offered = group


def _withdraw_group_offer(pusher: RolloutPusher) -> None:
    """An empty retained message on the group's topic (devices ignore it)."""
    if pusher.group_offered is None or not pusher.client.is_connected():
        return
    info = pusher.client.publish(topics.group_offer(pusher.prefix, pusher.group_offered), b"", qos=1, retain=True)
    pusher.group_offered = None
    info.wait_for_publish(5)


def _final_report(pusher: RolloutPusher, r: Rollout, seconds: float, out: TextIO) -> None:
    """Every device of the rollout, this run's and earlier runs' alike."""
    for dev in r.targets() + r.offline:
        if dev not in pusher.devices:
            o = r.outcomes.get(dev, {})
            d = pusher.devices[dev] = Device(dev, total=pusher.total)
            d.finish(o.get("state", "skipped"), o.get("error", "") or "(an earlier run)")
            shadow = o.get("shadow")
            if isinstance(shadow, dict):
                d.shadow = ShadowView(
                    state=str(shadow.get("state") or ""),
                    totals=dict(shadow.get("totals") or {}),
                    per_camera=dict(shadow.get("per_camera") or {}),
                    reasons=list(shadow.get("reasons") or []),
                )
    report(pusher, r.wait, seconds, out)
    print(f"push: rollout {r.status}; state in {r.path}", file=out)


def start_rollout(
    mqtt_cfg: MqttSettings,
    package: Path | None,
    devices: list[str],
    group: str | None,
    canary: int,
    wait: Wait,
    timeout_s: float | None,
    discover_s: float = 2.0,
    out: TextIO = sys.stderr,
    waves: str = "100",
    max_failures: str = "0",
    state: Path | None = None,
    resume: Path | None = None,
    wait_offline_s: float = 0.0,
    mirror: Mirror | None = None,
    shadow: ShadowAsk | None = None,
    verbose: bool = False,
) -> int:
    """``edged push``: a new rollout, or the one in `state` (the default file for this package and these
    targets) resumed, or the one in `resume` with everything it recorded. `timeout_s`: per wave (None:
    `TIMEOUT_S`, plus the shadow ask's ``max_s`` when the rollout shadows)."""
    lock: IO[str] | None = None
    try:
        if resume is not None:
            lock = running_lock(resume)
            r = Rollout.load(resume)
            if r.status in ("aborted", "done"):
                why = f"was aborted ({r.reason})" if r.status == "aborted" else "finished (push again for a new one)"
                raise RolloutError(f"{resume}: this rollout {why}; nothing to resume")
        elif package is None:
            raise ValueError("a package, or --resume FILE")
        else:
            allowed_failures(max_failures, 1)  # a usage error before anything is sent
            _, ref, fresh = new_rollout(package, group, devices, parse_waves(waves), canary, max_failures, wait)
            fresh.shadow = None if shadow is None else shadow.doc()
            fresh.path = state or default_state_path(ref, group, devices, f"{mqtt_cfg.host}_{mqtt_cfg.port}")
            try:
                lock = running_lock(fresh.path)
            except RolloutError:
                if state is not None:
                    raise
                # another operator pushes this package to these devices now: a rollout of its own (the device
                # runs one transfer; this offer joins it, and each push reports what the device did)
                fresh.path = fresh.path.with_name(f"{fresh.path.stem}-{fresh.transfer}.json")
                lock = running_lock(fresh.path)
                fresh.beside = True
            r = open_rollout(fresh.path, fresh, state is not None, out)
            if r is not fresh and r.shadow != fresh.shadow:  # the same rollout must ask the same of every wave
                said = "with --shadow " + json.dumps(r.shadow) if r.shadow else "without --shadow"
                raise RolloutError(
                    f"{fresh.path}: this rollout was started {said}; resume it with --resume {fresh.path}, "
                    "or remove the file to start another",
                    code=Code.INVALID_ARGUMENTS,
                )
    except (ValueError, RolloutError) as exc:
        print(f"edged push: error: {exc}", file=out)
        if lock is not None:
            lock.close()
        return 2
    if timeout_s is None:
        timeout_s = TIMEOUT_S + (ShadowAsk.model_validate(r.shadow).max_s if r.shadow is not None else 0.0)
    try:
        return run_rollout(mqtt_cfg, r, timeout_s, discover_s, wait_offline_s, out, mirror, verbose)
    finally:
        lock.close()  # the lock goes with the process anyway (a SIGKILL frees it too)
