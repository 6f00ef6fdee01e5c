"""Progress with an estimate of the time left (edged/progress.py) in the long offline steps: `edged quantize`'s
calibration, search and evaluation, and `edged bundle build`.

The rules are checked on a clock the test moves; a real (small) `edged quantize` run on the demo's BlazeFace
shows its lines on stderr, each estimate the rate measured so far times what is left (no timing is asserted:
what is checked is the tool's own arithmetic on its own printed measurements, so a busy machine, whose batches
slow down as the step goes on, cannot fail it)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from edged.cli import main as cli_main
from edged.models.demo import DemoAssets
from edged.progress import Eta, format_duration

LINE = re.compile(
    r"^quantize: (?P<what>.+?): (?P<done>\d+)/(?P<total>\d+) (?P<unit>\w+), (?P<so_far>[\d.:]+(?: s)?) so far"
    r"(?:, (?:about|at most) (?P<left>[\d.:]+(?: s)?) left|, (?P<end>done))$"
)


def seconds(text: str) -> float:
    if text.endswith(" s"):
        return float(text[:-2])
    parts = [int(p) for p in text.split(":")]
    return float(sum(p * 60**i for i, p in enumerate(reversed(parts))))


def rounding(text: str) -> float:
    """How far a printed duration may be from the one it was printed from: 0.05 s as "4.2 s", 0.5 s as "1:02"."""
    return 0.05 if text.endswith(" s") else 0.5


def check_estimate(m: re.Match[str]) -> None:
    """The line's estimate is elapsed / done x left, from the line's own figures, within their printing."""
    done, total = int(m["done"]), int(m["total"])
    expected = seconds(m["so_far"]) / done * (total - done)
    slack = rounding(m["so_far"]) * (total - done) / done + rounding(m["left"]) + 1e-6
    assert abs(seconds(m["left"]) - expected) <= slack, (m.group(0), expected)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_per_tenth_or_interval_with_the_measured_rate() -> None:
    clock, said = Clock(), list[str]()
    eta = Eta(said.append, "calibrating", 100, "batches", every_s=30, clock=clock)
    for _ in range(25):
        clock.now += 2.0  # 2 s a batch
        eta.advance()
    # a line at each tenth crossed (10, 20), none per batch in between
    assert said == [
        "calibrating: 10/100 batches, 20.0 s so far, about 3:00 left",
        "calibrating: 20/100 batches, 40.0 s so far, about 2:40 left",
    ]
    clock.now += 31  # a slow stretch within one tenth: a line once `every_s` passed
    eta.advance()
    assert said[-1] == "calibrating: 26/100 batches, 1:21 so far, about 3:51 left"
    eta.advance(74)
    assert said[-1] == "calibrating: 100/100 batches, 1:21 so far, done"
    assert eta.left_s() == 0


def test_a_step_that_may_end_early_says_at_most() -> None:
    clock, said = Clock(), list[str]()
    eta = Eta(said.append, "search", 10, "candidates", upper_bound=True, clock=clock)
    clock.now += 40
    eta.advance()
    assert said == ["search: 1/10 candidates, 40.0 s so far, at most 6:00 left"]
    assert format_duration(3725) == "1:02:05" and format_duration(4.25) == "4.2 s"
    with pytest.raises(ValueError, match="total must be at least 1"):
        Eta(said.append, "x", 0)


def test_quantize_prints_progress_at_the_rate_measured_so_far(
    demo: DemoAssets, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pkg = demo.packages["blazeface-back"].root
    args = ["quantize", str(pkg), "--calib", str(demo.video), "--eval", str(demo.video), "--out", str(tmp_path / "q")]
    rc = cli_main([*args, "--calib-frames", "16", "--eval-frames", "16", "--no-search", "--threads", "1"])
    assert rc in (0, 4)  # the gate's verdict on 16 frames is not this test's business
    steps: dict[str, list[re.Match[str]]] = {}
    for line in capsys.readouterr().err.splitlines():
        if m := LINE.match(line):
            steps.setdefault(m["what"], []).append(m)
    # calibration (4 batches of 4 frames) and the evaluation of both models (4 batches each)
    assert set(steps) == {"calibrating", "model.onnx on 16 frames"}, list(steps)
    calib = steps["calibrating"]
    assert [int(m["done"]) for m in calib] == [1, 2, 3, 4] and calib[-1]["end"] == "done"
    evaluation = steps["model.onnx on 16 frames"]  # the float model, then the int8 one
    assert [int(m["done"]) for m in evaluation] == [1, 2, 3, 4, 1, 2, 3, 4]
    for run in (calib, evaluation[:4], evaluation[4:]):
        assert run[-1]["end"] == "done" and all(m["left"] for m in run[:-1]), [m.group(0) for m in run]
        for m in run[:-1]:  # 3 batches left, then 2, then 1: each at the rate measured so far
            check_estimate(m)


def test_bundle_pip_steps_say_distributions_collected_with_an_estimate(tmp_path: Path) -> None:
    """`edged bundle build`'s long steps are pip's: its "Collecting" lines are counted against an estimate of
    the requirements' closure (from the metadata installed here), which grows when pip finds more. A real
    subprocess speaks pip's lines here; tests/test_bundle.py runs the real pip."""
    from edged.deploy.bundle import _pip, estimate_distributions
    from edged.errors import EdgedError

    assert estimate_distributions(["pydantic<3,>=2.5"]) >= 3  # pydantic, pydantic-core, typing-extensions, ...
    assert estimate_distributions(["no-such-distribution==1"]) == 1
    script = "for n in ('a', 'b', 'c'): print('Collecting', n)\nprint('Processing /wheels/d.whl')\nprint('Saved a')"
    said: list[str] = []
    _pip([sys.executable, "-c", script], ["no-such-distribution"], "downloading wheels", said.append)
    done = [re.match(r"downloading wheels: (\d+)/(\d+) distributions \(estimated\)", s) for s in said]
    assert all(done), said
    assert [int(m[1]) for m in done if m] == [1, 2, 3, 4, 4] and said[-1].endswith(", done"), said
    with pytest.raises(EdgedError, match=r"failed: .*no index here"):
        _pip([sys.executable, "-c", "print('no index here'); raise SystemExit(1)"], [], "x", said.append)
