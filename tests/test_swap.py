"""Stop-the-world swaps, in process: the daemon's memory reading is the seam (a swap is planned from it),
everything else is real: the daemon, ONNX Runtime, the store, mosquitto."""

from __future__ import annotations

import threading
from pathlib import Path

import onnx
import pytest

from edged.daemon.app import Daemon
from edged.daemon.config import load_config
from edged.daemon.lifecycle.manager import estimate_mb
from edged.errors import EngineLoadError
from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey, TrustStore
from edged.models.store import Store
from tests.conftest import wait_until, write_config
from tests.test_ota import MODEL, build, device_doc, install


def test_stop_the_world_swap_and_reload_of_the_old_model_when_the_new_one_fails(
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    broker,
    subscribe,
) -> None:
    cfg_path = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg_path, build(demo, tmp_path, signer, 1))
    cfg = load_config(cfg_path)
    sub = subscribe(broker, "edged/cam-01/#")
    daemon = Daemon(cfg)
    t = threading.Thread(target=daemon.run, kwargs={"duration_s": 120, "install_signals": False})
    t.start()
    try:
        wait_until(lambda: len(sub.results()) > 5, 30, "results from version 1")
        store = Store(cfg.state_dir)
        trust = TrustStore.load(cfg.model.keys_dir)
        current_mb = daemon.models.active.backend.memory_bytes / 2**20
        # memory in use such that the two models together are over the budget, one at a time is not
        _, stage = store.stage(build(demo, tmp_path, signer, 2), trust)
        assert stage is not None
        new_mb = estimate_mb(daemon.package) + 0.01
        daemon.models._rss_mb = lambda: cfg.memory.budget_mb - new_mb + current_mb / 2
        done = daemon.models.install_staged(stage)
        assert done["mode"] == "stop_the_world"
        wait_until(lambda: any(r["model"]["version"] == 2 for r in sub.results()), 30, "results from version 2")
        # a version that verifies but does not load: the old one is loaded again and keeps serving
        garbage = tmp_path / "garbage.onnx"  # the same graph (and memory estimate), an operator nothing implements
        model = onnx.load(str(demo.packages[MODEL].model_path))
        model.graph.node[len(model.graph.node) // 2].op_type = "NoSuchOp"
        onnx.save(model, str(garbage))
        _, stage = store.stage(build(demo, tmp_path, signer, 3, model=garbage), trust)
        assert stage is not None
        with pytest.raises(EngineLoadError):
            daemon.models.install_staged(stage)
        n = len(sub.results())
        wait_until(lambda: len(sub.results()) > n + 5, 30, "version 2 serving again")
        assert {r["model"]["version"] for r in sub.results()[n:]} == {2}
        assert store.pointer(MODEL, "current") == 2 and 3 in store.state(MODEL).bad
        events = [m.json() for m in sub.on("events")]
        assert any(e["type"] == "model_rejected" and e["model"]["version"] == 3 for e in events)
    finally:
        daemon.request_stop()
        t.join(30)
