"""What the benchmarks that push models to a real daemon share (bench/shadow.py, bench/swap.py): the command
line's --repeats and --out, a local mosquitto, a signing key the device trusts, the demo model packed as any
version (signed, as ``edged push`` sends it) and installed into a store, and the results file written."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from edged.models.demo import DemoAssets, default_dir, fetch_demo  # noqa: E402
from edged.models.package import pack_tar, write_package  # noqa: E402
from edged.models.signing import generate_key, load_signing_key  # noqa: E402
from tests.conftest import Broker  # noqa: E402

MODEL = "blazeface-back"


def parser(doc: str | None, result: str) -> argparse.ArgumentParser:
    """The script's parser: its docstring as the help, --repeats, and --out (default bench/results/`result`)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / result)
    return ap


def write_results(out: dict[str, Any], path: Path) -> None:
    """Print the results and write them to `path` as JSON."""
    print(json.dumps(out, indent=2))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")


class PackageRig:
    """A work folder (``prefix`` in the temp dir), a mosquitto on 127.0.0.1 (started; `close` stops it), a
    key in `trusted` (a device's ``model.keys_dir``), and the demo's MODEL packed as any version."""

    def __init__(self, prefix: str) -> None:
        self.demo: DemoAssets = fetch_demo(default_dir())
        src = self.demo.packages[MODEL]
        self.work = Path(tempfile.mkdtemp(prefix=prefix))
        self.broker = Broker(self.work)
        self.broker.start()
        key_path, pub = generate_key(self.work / "keys")
        self.trusted = self.work / "trusted"
        self.trusted.mkdir()
        (self.trusted / pub.name).write_text(pub.read_text())
        self._key = load_signing_key(key_path)
        self._fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
        self._files = {"model.onnx": src.model_path, "labels.txt": src.root / "labels.txt"}
        self._made: dict[int, Path] = {}

    def package(self, version: int, extra: dict[str, Path] | None = None) -> Path:
        """The signed package tar of `version`, with `extra` files beside the model (packed once a version)."""
        if version not in self._made:
            files = {**self._files, **(extra or {})}
            pkg = write_package(self.work / f"pkg-{version}", {**self._fields, "version": version}, files)
            self._made[version] = pack_tar(pkg, self.work / f"v{version}.tar", self._key.sign(pkg.manifest_bytes))
        return self._made[version]

    def install(self, version: int, cfg_path: Path) -> None:
        """``edged model install`` of `version` into the store of the config at `cfg_path`."""
        r = subprocess.run(
            [sys.executable, "-m", "edged", "model", "install", str(self.package(version)), "-c", str(cfg_path)],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        if r.returncode != 0:
            raise SystemExit(r.stderr)

    def close(self) -> None:
        self.broker.stop()
