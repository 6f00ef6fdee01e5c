"""The on-device model store (DESIGN §5), crash-safe at every step.

    <state_dir>/models/<name>/versions/<v>/   immutable once renamed in
    <state_dir>/models/<name>/current  -> versions/<v>     symlink, swapped by rename
    <state_dir>/models/<name>/previous -> versions/<v'>
    <state_dir>/models/<name>/state.json                 highest accepted, probation, versions marked bad
    <state_dir>/models/<name>/state.json.bak             its copy, written just before it
    <state_dir>/models/<name>/output.json                what each version output while it served (store.output)
    <state_dir>/staging/                                   scratch, wiped at start

Every write that must survive a power cut is: write a temp file -> fsync -> os.replace -> fsync the
folder. A version folder appears under ``versions/`` only complete (staged, checked, fsynced, renamed
in, one rename). A package comes in two ways: ``stage()`` copies a tar or folder into ``staging/``
(checking as it goes), ``adopt()`` takes a folder under the state directory whose files were hashed as
they were written (an OTA download): nothing is copied, ``activate()`` renames it in (same file system).
``recover()`` (run at every start) wipes staging and temp files, quarantines a corrupt
``state.json`` and restores it from ``state.json.bak`` (else rebuilds it from what is on disk), and
points a dangling ``current`` at ``previous``. So after a crash at any step exactly one of old / new is ``current``.

An offered package is verified (`store.offer`: every check that needs only its manifest and
signature, in DESIGN §5's order) before anything is copied; its files' sizes and hashes last. The
record of each model, ``state.json`` and its backup, is `store.state`'s; the file helpers are
`store.files`'.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.errors import Code, PackageError

from ..compat import DeviceFacts, detect
from ..package import MANIFEST, Package, _with_labels_file, verify_folder
from ..signing import SIG_FILE, TrustStore
from .files import copy_files, crash_at_env_step, fsync_dir, link_atomic, read_head, write_atomic
from .offer import MAX_FILE_BYTES, Offer, admit, check_offer
from .output import RecordedOutput, read_outputs, record_output
from .state import STATE, STATE_BACKUP, ModelState, read_state, rebuilt_state, write_state

__all__ = [
    "INSTALL_STEPS",
    "MAX_FILE_BYTES",
    "ROLLBACK_STEPS",
    "STATE",
    "STATE_BACKUP",
    "Installed",
    "ModelState",
    "Offer",
    "RecordedOutput",
    "Store",
]

INSTALL_STEPS = ("staged", "hidden", "renamed", "state_written", "previous_linked", "current_linked")
ROLLBACK_STEPS = ("marked_bad", "rolled_back")


@dataclass(frozen=True)
class Installed:
    name: str
    version: int
    status: Literal["installed", "unchanged"]
    previous: int | None


class Store:
    def __init__(self, state_dir: Path, keep: int = 3, on_step: Callable[[str], None] = crash_at_env_step) -> None:
        if keep < 2:
            raise ValueError("keep must be at least 2 (current and previous)")
        self.state_dir = state_dir
        self.root = state_dir / "models"
        self.staging = state_dir / "staging"
        self.keep = keep
        self._step = on_step

    # ---- reading ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []

    def _dir(self, name: str) -> Path:
        return self.root / name

    def versions(self, name: str) -> list[int]:
        d = self._dir(name) / "versions"
        return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit()) if d.is_dir() else []

    def pointer(self, name: str, which: Literal["current", "previous"]) -> int | None:
        link = self._dir(name) / which
        if not link.is_symlink() or not link.exists():
            return None
        target = Path(os.readlink(link)).name
        return int(target) if target.isdigit() else None

    def state(self, name: str) -> ModelState:
        return read_state(self._dir(name))

    def current(self, name: str) -> Package:
        link = self._dir(name) / "current"
        if self.pointer(name, "current") is None:
            raise PackageError(f"model {name!r}: nothing installed in {self.root}", code=Code.NOT_FOUND)
        return verify_folder(link)

    def previous(self, name: str) -> Package:
        """The version a rollback would make current, verified (from its versions/ folder, which outlives
        the `previous` link); PackageError(no_previous) when there is none to go back to."""
        cur, prev = self.pointer(name, "current"), self.pointer(name, "previous")
        if cur is None or prev is None or prev == cur or prev in self.state(name).bad:
            raise PackageError(f"model {name!r}: no previous version to roll back to", code=Code.NO_PREVIOUS)
        return verify_folder(self._dir(name) / "versions" / str(prev))

    def recorded_output(self, name: str, version: int | None) -> RecordedOutput | None:
        """What `version` output while it served, as last recorded (`store.output`); None when unknown."""
        return None if version is None else read_outputs(self._dir(name)).get(version)

    def record_output(self, name: str, version: int, rec: RecordedOutput) -> int:
        """Record what `version` outputs (output.json, beside state.json; the entries of versions no longer
        on disk go); returns the bytes written."""
        return record_output(self._dir(name), version, rec, self.versions(name))

    # ---- start-up recovery -----------------------------------------------------------------
    def recover(self) -> list[str]:
        """Make the store consistent after whatever happened last; returns what it did, in words."""
        done: list[str] = []
        if self.staging.exists():
            shutil.rmtree(self.staging)
            done.append("staging wiped")
        for name in self.names():
            d = self._dir(name)
            for tmp in d.glob(".*.tmp"):
                tmp.unlink()
                done.append(f"{name}: removed {tmp.name}")
            vdir = d / "versions"
            if vdir.is_dir():
                for partial in vdir.glob(".*"):
                    shutil.rmtree(partial, ignore_errors=True)
                    done.append(f"{name}: removed partial {partial.name}")
            try:
                state = self.state(name)
            except (ValueError, TypeError, OSError) as exc:
                quarantine = d / f"{STATE}.corrupt-{int(time.time())}"
                os.replace(d / STATE, quarantine)
                state, source = rebuilt_state(d, self.versions(name))
                self._save(name, state)
                done.append(f"{name}: {STATE} was corrupt ({exc}); kept as {quarantine.name}, {source}")
            for which in ("current", "previous"):
                link = d / which
                if link.is_symlink() and not link.exists():
                    link.unlink()
                    done.append(f"{name}: {which} pointed nowhere; removed")
            cur, prev = self.pointer(name, "current"), self.pointer(name, "previous")
            pending = state.pending
            if pending is not None and pending != cur and (d / "versions" / str(pending)).is_dir():
                if cur is not None:  # an activation cut short after it was recorded: finish it
                    link_atomic(d / "previous", f"versions/{cur}")
                link_atomic(d / "current", f"versions/{pending}")
                done.append(f"{name}: finished activating {pending} (previous {cur})")
                cur, prev = pending, cur
            if cur is not None and cur in state.bad and prev is not None and prev not in state.bad:
                link_atomic(d / "current", f"versions/{prev}")  # a rollback cut short after marking
                (d / "previous").unlink()
                fsync_dir(d)
                done.append(f"{name}: finished rolling back {cur} -> {prev}")
            cur, prev = self.pointer(name, "current"), self.pointer(name, "previous")
            if prev is not None and (prev == cur or prev in state.bad):  # a rollback cut short after the flip
                (d / "previous").unlink()
                fsync_dir(d)
                done.append(f"{name}: previous ({prev}) dropped")
            if self.pointer(name, "current") is None:
                fallback = self.pointer(name, "previous")
                if fallback is None:
                    good = [v for v in self.versions(name) if v not in state.bad]
                    fallback = good[-1] if good else None
                if fallback is not None:
                    link_atomic(d / "current", f"versions/{fallback}")
                    done.append(f"{name}: current -> {fallback}")
        return done

    def _save(self, name: str, state: ModelState) -> None:
        """state.json, after its backup copy (`state.write_state`): a state.json damaged later is
        restored from the backup at the next start instead of being rebuilt from disk."""
        write_state(self._dir(name), state)

    def probation_blames(self, name: str) -> bool:
        """True when the version on probation (still current) has evidence against it: a run died with it
        loaded (its marker left behind) or crashes were counted. Starts that failed before the model was
        opened (a bad config, a locked or unwritable state directory) leave no evidence."""
        state = self.state(name)
        cur = self.pointer(name, "current")
        return (
            cur is not None
            and state.pending == cur
            and (state.probation_boot is not None or state.probation_crashes > 0)
        )

    # ---- verification (store.offer) ---------------------------------------------------------
    def check_offer(
        self,
        manifest_bytes: bytes,
        sig_bytes: bytes,
        trust: TrustStore,
        where: str,
        facts: DeviceFacts | None = None,
        now: dt.datetime | None = None,
    ) -> Offer:
        """Every check that needs only manifest.json and manifest.sig, in DESIGN §5's order."""
        return check_offer(self, manifest_bytes, sig_bytes, trust, where, facts, now)

    # ---- install ---------------------------------------------------------------------------
    def install(
        self,
        source: Path,
        trust: TrustStore,
        facts: DeviceFacts | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Installed:
        """Verify a package (tar or folder) and make it `current` on probation; the old one `previous`."""
        offer, staged = self.stage(source, trust, facts, progress)
        if staged is None:
            return Installed(
                offer.manifest.name, offer.manifest.version, "unchanged", self.pointer(offer.manifest.name, "previous")
            )
        return self.activate(offer.manifest.name, offer.manifest.version, staged.root)

    def stage(
        self,
        source: Path,
        trust: TrustStore,
        facts: DeviceFacts | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> tuple[Offer, Package | None]:
        """Every check, then a verified copy under staging/ (the package, rooted there); None instead when
        this version is already current (a no-op). Nothing outside staging/ changes; a refused package
        leaves nothing."""
        say = progress or (lambda m: None)
        manifest_bytes, sig_bytes = read_head(source)
        offer = self.check_offer(manifest_bytes, sig_bytes, trust, str(source), facts or detect())
        m = offer.manifest
        if offer.same_version:
            return offer, None
        self.staging.mkdir(parents=True, exist_ok=True)
        stage = self.staging / f"{m.name}-{m.version}-{os.getpid()}"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir()
        say(f"staging {m.name}@{m.version} (key {offer.key_id})")
        try:
            copy_files(source, stage, m)
            write_atomic(stage / MANIFEST, manifest_bytes)
            write_atomic(stage / SIG_FILE, sig_bytes)
            pkg = verify_folder(stage)  # sizes and hashes, the last check
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)  # a refused package leaves nothing behind
            raise
        self._step("staged")
        return offer, pkg

    def adopt(self, offer: Offer, folder: Path, facts: DeviceFacts | None = None) -> Package | None:
        """Take `folder` as the staged package of `offer`, as it is: its files were hashed against the
        offer's (signed, checked) manifest as they were written, by the caller (OTA's receiver), and were
        fsynced. Only what may have changed since the offer is checked again: the store's state (another
        version installed meanwhile: None when this one is current now), each file's size (a stat), nothing
        else in the folder. manifest.json and manifest.sig are written in, the folder is fsynced, and
        `activate` renames it in: `folder` must be under the state directory (one file system), nothing
        is copied or hashed again. On a refusal the folder is left as it was (the caller owns it)."""
        m = offer.manifest
        where = str(folder)
        if not folder.resolve().is_relative_to(self.state_dir.resolve()):
            raise PackageError(f"{where}: not under {self.state_dir}: it cannot be renamed in", code=Code.FAILED)
        if admit(self, m, where, facts or detect()):  # the state may have changed since the offer
            return None
        for tmp in folder.glob(".*.tmp"):  # a write_atomic cut short by a crash
            tmp.unlink()
        extra = sorted(p.name for p in folder.iterdir() if p.name not in m.files and p.name not in (MANIFEST, SIG_FILE))
        if extra:
            raise PackageError(f"{where}: {', '.join(extra)}: not in the manifest", code=Code.UNDECLARED_FILE)
        for name, entry in m.files.items():
            f = folder / name
            try:
                size = f.stat().st_size
            except OSError as exc:
                raise PackageError(f"{f}: listed in the manifest but missing", code=Code.FILE_MISSING) from exc
            if size != entry.size:
                raise PackageError(f"{f}: {size} bytes, the manifest says {entry.size}", code=Code.SIZE_MISMATCH)
        write_atomic(folder / MANIFEST, offer.manifest_bytes)
        write_atomic(folder / SIG_FILE, offer.sig_bytes)
        self._step("staged")
        return Package(root=folder, manifest=_with_labels_file(folder, m), manifest_bytes=offer.manifest_bytes)

    def renamed_in(self, offer: Offer) -> Package | None:
        """The offer's version when a crash after `activate` renamed it in (before it was recorded) left it
        under ``versions/``: checked again in full (hashes: it is a crash's leftover), so an interrupted
        install finishes from it. None when it is not there or is not exactly this package."""
        m = offer.manifest
        final = self._dir(m.name) / "versions" / str(m.version)
        try:
            if (final / MANIFEST).read_bytes() != offer.manifest_bytes:
                return None
            return verify_folder(final)
        except (OSError, PackageError):
            return None

    def activate(self, name: str, version: int, stage: Path, baseline_infer_ms: float | None = None) -> Installed:
        """Rename a verified staged folder in, record it, flip the links (previous first). `baseline_infer_ms`:
        the replaced version's median batch time, which the new one must not regress from on probation."""
        d = self._dir(name)
        vdir = d / "versions"
        vdir.mkdir(parents=True, exist_ok=True)
        final = vdir / str(version)
        if stage == final:  # renamed in by a run that crashed before recording it (`renamed_in`)
            self._step("hidden")
        elif final.exists():  # left by a crash after the rename: identical content (same verified manifest)
            shutil.rmtree(stage)
            self._step("hidden")
        else:
            os.replace(stage, final)  # one rename: a staged folder is complete and fsynced
            self._step("hidden")  # renamed in, the folder not yet fsynced
            fsync_dir(vdir)
        self._step("renamed")
        state = self.state(name)
        old = self.pointer(name, "current")
        state.highest_accepted = max(state.highest_accepted, version)
        state.pending, state.probation_crashes, state.probation_since = version, 0, time.time()
        state.probation_boot, state.baseline_infer_ms = None, baseline_infer_ms
        self._save(name, state)
        self._step("state_written")
        if old is not None and old != version:
            link_atomic(d / "previous", f"versions/{old}")
        self._step("previous_linked")
        link_atomic(d / "current", f"versions/{version}")
        self._step("current_linked")
        self.prune(name)
        return Installed(name, version, "installed", old)

    # ---- probation outcome -----------------------------------------------------------------
    def commit(self, name: str) -> None:
        state = self.state(name)
        state.pending, state.probation_crashes, state.probation_since = None, 0, None
        state.probation_boot = state.baseline_infer_ms = None
        self._save(name, state)

    def probation_run(self, name: str, boot_id: str | None) -> int:
        """A daemon run starts (`boot_id`) or stops cleanly (None) judging the version on probation.
        Starting while another run's id is still recorded means that run died: it counts as a crash.
        Returns the crashes counted so far."""
        state = self.state(name)
        if state.pending is None or (boot_id is None and state.probation_boot is None):
            return state.probation_crashes if state.pending is not None else 0
        if boot_id is not None and state.probation_boot is not None:
            state.probation_crashes += 1
        state.probation_boot = boot_id
        self._save(name, state)
        return state.probation_crashes

    def mark_bad(self, name: str, version: int) -> None:
        """A version refused after staging (a failed golden check, say): never installed, never retried."""
        state = self.state(name)
        if version not in state.bad:
            state.bad.append(version)
            self._dir(name).mkdir(parents=True, exist_ok=True)
            self._save(name, state)

    def rollback(self, name: str, reason: str = "rolled back") -> tuple[int, int]:
        """current -> previous; the version that was current is marked bad. Returns (from, to)."""
        d = self._dir(name)
        cur, prev = self.pointer(name, "current"), self.pointer(name, "previous")
        state = self.state(name)
        if cur is None or prev is None or prev == cur or prev in state.bad:
            raise PackageError(f"model {name!r}: no previous version to roll back to", code=Code.NO_PREVIOUS)
        if cur not in state.bad:
            state.bad.append(cur)
        state.pending, state.probation_crashes, state.probation_since = None, 0, None
        state.probation_boot = state.baseline_infer_ms = None
        self._save(name, state)
        self._step("marked_bad")
        link_atomic(d / "current", f"versions/{prev}")
        self._step("rolled_back")
        (d / "previous").unlink()
        fsync_dir(d)
        return cur, prev

    def prune(self, name: str) -> list[int]:
        """Keep the newest `keep` versions; never current, previous or the one on probation."""
        protected = {self.pointer(name, "current"), self.pointer(name, "previous"), self.state(name).pending}
        versions = self.versions(name)
        extra = [v for v in versions[: max(0, len(versions) - self.keep)] if v not in protected]
        for v in extra:
            shutil.rmtree(self._dir(name) / "versions" / str(v))
        return extra
