"""A side-by-side candidate's first batches run on a thread of lower scheduling priority (issue 18, the
swap gap): they take the CPU the serving model leaves, not the serving model's."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.app import Daemon
from edged.daemon.config import load_config
from edged.daemon.priority import CANDIDATE_NICE, yielding
from edged.models.demo import DemoAssets
from edged.models.package import Package
from edged.models.signing import SigningKey, TrustStore
from edged.models.store import Store
from tests.conftest import wait_until, write_config
from tests.test_ota import build, device_doc, install


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
def test_yielding_runs_at_a_lower_priority_on_its_own_thread_and_hands_back_results_and_errors() -> None:
    mine = _nice()
    seen: list[tuple[int, int]] = []

    def work() -> str:
        seen.append((threading.get_native_id(), _nice()))
        return "checked"

    assert yielding(work) == "checked"
    assert seen[0][0] != threading.get_native_id()
    assert seen[0][1] == min(19, mine + CANDIDATE_NICE)
    assert _nice() == mine  # the caller (the swap job) keeps its priority

    def fails() -> str:
        raise ValueError("golden check failed")

    with pytest.raises(ValueError, match="golden check failed"):
        yielding(fails)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
def test_a_side_by_side_swap_warms_its_candidate_up_below_the_serving_model(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker, subscribe
) -> None:
    """In the running daemon: every batch the candidate runs before it serves (warm-up, golden check)
    runs at a lower priority than the serving model's batches, which keep theirs."""
    cfg_path = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg_path, build(demo, tmp_path, signer, 1))
    cfg = load_config(cfg_path)
    sub = subscribe(broker, "edged/cam-01/#")
    daemon = Daemon(cfg)
    seen: list[tuple[str, int, int]] = []  # (thread name, nice, model version)
    opened = daemon.models._open_backend

    def recording(pkg: Package) -> Any:
        backend = opened(pkg)
        infer = backend.infer

        def recorded(feeds: Any) -> Any:
            seen.append((threading.current_thread().name, _nice(), pkg.manifest.version))
            return infer(feeds)

        backend.infer = recorded  # type: ignore[method-assign]
        return backend

    daemon.models._open_backend = recording
    t = threading.Thread(target=daemon.run, kwargs={"duration_s": 120, "install_signals": False})
    t.start()
    try:
        wait_until(lambda: len(sub.results()) > 3, 30, "results from version 1")
        _, stage = Store(cfg.state_dir).stage(build(demo, tmp_path, signer, 2), TrustStore.load(cfg.model.keys_dir))
        assert stage is not None
        assert daemon.models.install_staged(stage)["mode"] == "side_by_side"
        wait_until(lambda: any(r["model"]["version"] == 2 for r in sub.results()), 30, "results from version 2")
    finally:
        daemon.request_stop()
        t.join(30)
    base = _nice()
    before = [(name, nice) for name, nice, v in seen if v == 2 and name == "swap-warm-up"]
    serving = {nice for name, nice, v in seen if name != "swap-warm-up"}
    assert len(before) >= 2  # the warm-up batches (and the golden check, if the package has one)
    assert {nice for _, nice in before} == {min(19, base + CANDIDATE_NICE)}
    assert serving == {base}
