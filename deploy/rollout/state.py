"""A rollout's state (``edged.rollout/1``, described in deploy/rollout/__init__.py): its plan (the waves, the
failures allowed), the file that holds it (Rollout: written atomically, read back for a resume, found
again at its default place), and the lock that lets one ``edged push`` at a time run it."""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from edged.errors import Code
from edged.errors import RolloutError as RolloutError  # defined in edged.errors, importable here as before
from edged.models.store.files import read_head, write_atomic

from ..push import Device, Wait

SCHEMA = "edged.rollout/1"
SAVE_EVERY_S = 0.5
OK = ("committed", "unchanged")
FAILED = ("rejected", "failed", "rolled_back", "timed_out")


def parse_waves(text: str) -> list[float]:
    """``1,10,50,100`` -> cumulative percentages, increasing, ending at 100 (added when missing)."""
    try:
        waves = [float(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise ValueError(f"--waves {text!r}: percentages separated by commas, e.g. 1,10,50,100") from exc
    if not waves or any(not 0 < p <= 100 for p in waves) or any(b <= a for a, b in itertools.pairwise(waves)):
        raise ValueError(f"--waves {text!r}: increasing percentages in (0, 100], e.g. 1,10,50,100")
    return waves if waves[-1] == 100 else [*waves, 100.0]


def allowed_failures(spec: str, n: int) -> int:
    """``--max-failures``: ``3`` (devices) or ``5%`` (of the `n` devices, rounded down)."""
    try:
        if spec.endswith("%"):
            pct = float(spec[:-1])
            if not 0 <= pct <= 100:
                raise ValueError(spec)
            return math.floor(n * pct / 100)
        count = int(spec)
        if count < 0:
            raise ValueError(spec)
        return count
    except ValueError as exc:
        raise ValueError(f"--max-failures {spec!r}: a count (3) or a percentage of the devices (5%)") from exc


def plan_waves(targets: list[str], canary: int, waves: list[float]) -> list[list[str]]:
    """The devices of each wave: `canary` first, then cumulative percentages of the rest (none empty)."""
    plan = [targets[:canary]] if 0 < canary < len(targets) else []
    rest = targets[len(plan[0]) :] if plan else targets
    done = 0
    for pct in waves:
        upto = min(len(rest), max(done + 1, math.ceil(len(rest) * pct / 100)))
        if upto > done:
            plan.append(rest[done:upto])
            done = upto
    return plan


def default_state_path(ref: str, group: str | None, devices: list[str], broker: str) -> Path:
    """One file per package, target and broker (`broker`: ``host_port``): the same command finds it again."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    target = (
        f"group-{group}" if group else "devices-" + hashlib.sha256(",".join(sorted(devices)).encode()).hexdigest()[:8]
    )
    return base / "edged" / "rollouts" / f"{ref}-{target}-{broker}.json"


@dataclass
class Rollout:
    path: Path
    package: str
    manifest_sha256: str
    ref: str
    transfer: str
    group: str | None
    devices: list[str]
    waves: list[float]
    canary: int
    max_failures: str
    wait: Wait
    plan: list[list[str]] = field(default_factory=list)
    offline: list[str] = field(default_factory=list)
    # each device's {state, error}, and with --shadow its report's `shadow` summary (`ShadowView.summary`)
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    wave: int = 0
    status: str = "new"  # new, running, stopped, aborted, done
    urls: dict[str, list[str]] = field(default_factory=dict)  # --mirror: where the files are (kept for a resume)
    reason: str = ""
    shadow: dict[str, Any] | None = None  # --shadow: the offer's ask (`ShadowAsk.doc()`), kept for a resume
    _saved: float = 0.0
    beside: bool = False  # not saved: another `edged push` runs this package to these devices now

    def doc(self) -> dict[str, Any]:
        keys = ["package", "manifest_sha256", "ref", "transfer", "group", "devices", "waves", "canary"]
        keys += ["max_failures", "wait", "plan", "offline", "outcomes", "wave", "status", "reason", "urls", "shadow"]
        return {"schema": SCHEMA, **{k: getattr(self, k) for k in keys}, "saved_at": time.time()}

    def save(self, force: bool = True) -> None:
        now = time.monotonic()
        if not force and now - self._saved < SAVE_EVERY_S:
            return
        self._saved = now
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.doc(), indent=1).encode())

    @classmethod
    def load(cls, path: Path) -> Rollout:
        try:
            doc = json.loads(path.read_text())
            if doc.get("schema") != SCHEMA:
                raise ValueError(f"schema {doc.get('schema')!r}, not {SCHEMA}")
            fields = {k: v for k, v in doc.items() if k not in ("schema", "saved_at")}
            return cls(path=path, **fields)
        except (OSError, ValueError, TypeError) as exc:
            raise RolloutError(f"{path}: not a rollout's state: {exc}", code=Code.INVALID_ARGUMENTS) from exc

    def record(self, devices: list[Device]) -> None:
        for d in devices:
            self.outcomes[d.id] = {"state": d.state, "error": d.error}
            if d.shadow is not None and (d.shadow.state or d.shadow.totals):
                self.outcomes[d.id]["shadow"] = d.shadow.summary()

    def state_of(self, dev: str) -> str:
        return str(self.outcomes.get(dev, {}).get("state", ""))

    def failures(self) -> list[str]:
        return [dev for dev, o in self.outcomes.items() if o.get("state") in FAILED]

    def targets(self) -> list[str]:
        return [dev for wave in self.plan for dev in wave]


def open_rollout(state: Path, fresh: Rollout, named: bool, out: TextIO) -> Rollout:
    """The rollout at `state` when it is this package's (a resume), else `fresh`; RolloutError when the file
    is an aborted rollout, or another package's where the operator `named` the file (the default file of
    another package of this name and version is replaced: a rebuilt package starts a new rollout)."""
    if not state.exists():
        return fresh
    old = Rollout.load(state)
    if old.status == "done":  # finished: running it again is a new rollout (current devices say unchanged)
        print(f"push: the rollout in {state} finished; a new one replaces it", file=out)
        return fresh
    if old.manifest_sha256 != fresh.manifest_sha256 and not named:
        print(f"push: {state} was the rollout of another build of {old.ref}: a new rollout replaces it", file=out)
        return fresh
    if old.manifest_sha256 != fresh.manifest_sha256:
        raise RolloutError(
            f"{state} is the rollout of {old.ref} (another package); name another --state or remove it",
            code=Code.INVALID_ARGUMENTS,
        )
    if old.status == "aborted":
        raise RolloutError(
            f"{state}: this rollout was aborted ({old.reason}); remove the file to start it over",
            code=Code.INVALID_ARGUMENTS,
        )
    return old


def new_rollout(
    package: Path, group: str | None, devices: list[str], waves: list[float], canary: int, max_failures: str, wait: Wait
) -> tuple[str, str, Rollout]:
    """(manifest sha256, ref, a fresh rollout without a path)."""
    manifest_bytes, sig_bytes = read_head(package)
    sha = hashlib.sha256(manifest_bytes + sig_bytes).hexdigest()  # the signed package's identity
    m = json.loads(manifest_bytes)
    ref = f"{m.get('name')}@{m.get('version')}"
    transfer = sha[:8] + os.urandom(4).hex()
    r = Rollout(Path(), str(package.resolve()), sha, ref, transfer, group, devices, waves, canary, max_failures, wait)
    return sha, ref, r


def running_lock(state: Path) -> IO[str]:
    """An exclusive lock on ``<state>.lock`` held while this process runs the rollout: a rollout is resumed by
    one `edged push` at a time (RolloutError while another process holds it)."""
    state.parent.mkdir(parents=True, exist_ok=True)
    f = open(state.with_name(state.name + ".lock"), "a")  # noqa: SIM115  (held until the rollout ends)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise RolloutError(f"{state}: an edged push runs this rollout now; wait for it, or stop it first") from None
    return f
