"""Shadow evaluation (issue 29 items 1-2, the device side), the pure parts on values: detections matched by
label and IoU (daemon/lifecycle/agreement.py) with hand-made boxes of known overlap, the figures and the
verdict they give (no detection, or a threshold's figure undefined: no evidence, never a pass nor a failure), the
thresholds' grammar, the report's schema (protocol/shadow.py), and the verdicts' counter as /metrics renders it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from edged.daemon.decoders import Detection
from edged.daemon.health import shadow_verdicts
from edged.daemon.lifecycle.admission import shadow_fits
from edged.daemon.lifecycle.agreement import MISSED, NONE, Tally, iou, pairs
from edged.daemon.lifecycle.shadow import Verdicts
from edged.errors import Code, SwapError
from edged.protocol.ota import OfferArgs, offer_args, offer_payload
from edged.protocol.schemas import SHADOW_SCHEMA, schema
from edged.protocol.shadow import (
    DEFAULT_PROMOTE_IF,
    ShadowAsk,
    judgement,
    parse_promote_if,
    report_doc,
    verdict,
)

EVIDENCE = dict(frames=1, detections=1, elapsed_s=0.5, min_frames=1, min_detections=1, min_s=0, max_s=900, skipped=0)


def det(label: str, box: tuple[float, float, float, float], score: float = 0.9) -> Detection:
    return Detection(label, 0, score, box)


def test_iou_of_boxes_with_known_overlap() -> None:
    assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)  # half overlaps: 1/3
    assert iou((0, 0, 10, 10), (0, 0, 10, 5)) == pytest.approx(0.5)  # inside, half its area
    assert iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0  # touching edges
    assert iou((0, 0, 0, 10), (0, 0, 10, 10)) == 0.0  # no area


def test_pairs_are_greedy_by_iou_same_label_and_one_to_one() -> None:
    serving = [det("face", (0, 0, 10, 10)), det("face", (100, 100, 110, 110))]
    candidate = [
        det("face", (1, 0, 11, 10)),  # IoU 90/110 = 0.818 with serving[0]
        det("face", (0, 0, 10, 10)),  # IoU 1.0 with serving[0]: wins it
        det("face", (100, 100, 110, 104)),  # IoU 0.4 with serving[1]: under 0.5
        det("person", (100, 100, 110, 110)),  # IoU 1.0 with serving[1], another label
    ]
    got = pairs(serving, candidate)
    assert [(i, j) for i, j, _ in got] == [(0, 1)]
    assert got[0][2] == 1.0
    # whatever the label: serving[1] pairs with the person box
    assert sorted((i, j) for i, j, _ in pairs(serving, candidate, same_label=False)) == [(0, 1), (1, 3)]


def test_tally_figures_on_values() -> None:
    t = Tally()
    # frame 1: two faces, the candidate finds one (shifted a little: IoU 0.818) with a lower score, plus a
    # false one; frame 2: both see nothing; frame 3: one face each, the candidate calls it a person
    f1 = t.add(
        [det("face", (0, 0, 10, 10), 0.9), det("face", (50, 50, 60, 60), 0.8)],
        [det("face", (1, 0, 11, 10), 0.7), det("face", (200, 200, 210, 210), 0.6)],
    )
    assert (f1.serving, f1.candidate, f1.matched) == (2, 2, 1)
    assert f1.disagreement == pytest.approx(0.5)
    f2 = t.add([], [])
    assert f2.disagreement == 0.0
    t.add([det("face", (0, 0, 10, 10))], [det("person", (0, 0, 10, 10))])
    t.serving_ms.extend([10.0, 12.0, 14.0])
    t.candidate_ms.extend([15.0, 18.0, 21.0])
    fig = t.figures()
    assert fig["frames"] == 3
    assert (fig["serving_detections"], fig["candidate_detections"], fig["matched"]) == (3, 3, 1)
    assert fig["agreement"] == pytest.approx(1 / 3, abs=1e-4)
    assert fig["recall"] == pytest.approx(1 / 3, abs=1e-4)
    assert fig["precision"] == pytest.approx(1 / 3, abs=1e-4)
    assert fig["score_shift"] == pytest.approx(0.2)
    assert fig["label_confusion"] == {
        "face": {"face": 1, MISSED: 1, "person": 1},
        NONE: {"face": 1},
    }
    assert (fig["serving_ms"], fig["candidate_ms"]) == (12.0, 18.0)
    assert fig["latency_ratio"] == pytest.approx(1.5)
    assert verdict(fig, {"agreement": 0.3, "latency": 1.5}) == []
    assert verdict(fig, {"recall": 0.95, "latency": 1.2}) == ["recall 0.333 < 0.95", "latency 1.500 > 1.2"]
    assert judgement(fig, {"agreement": 0.3, "latency": 1.5}) == ("passed", [])
    assert judgement(fig, {"recall": 0.95}) == ("failed", ["recall 0.333 < 0.95"])


def test_identical_detections_agree_fully_and_empty_frames_give_no_figures() -> None:
    t = Tally()
    boxes = [det("face", (10 * k, 0, 10 * k + 8, 8), 0.5 + k / 20) for k in range(5)]
    for _ in range(4):
        t.add(boxes, list(reversed(boxes)))
    fig = t.figures()
    assert fig["agreement"] == fig["recall"] == fig["precision"] == 1.0 and fig["score_shift"] == 0.0
    assert fig["label_confusion"] == {"face": {"face": 20}}
    empty = Tally()
    empty.add([], [])
    fig = empty.figures()
    assert fig["recall"] is None and fig["precision"] is None and fig["latency_ratio"] is None
    assert verdict(fig, {"recall": 0.5}) == []  # no figure: nothing out of bounds, and nothing to pass on


def test_no_detection_or_an_undefined_figure_is_no_evidence_never_a_pass_nor_a_failure() -> None:
    dark = Tally()
    for _ in range(40):
        dark.add([], [])
    dark.serving_ms.append(5.0)
    dark.candidate_ms.append(5.0)
    fig = dark.figures()
    assert fig["agreement"] == 1.0 and fig["latency_ratio"] == 1.0  # vacuous figures, defined
    why = ["neither model detected anything in 40 frames: no evidence either way"]
    assert judgement(fig, {"agreement": 0.95, "latency": 1.5}) == ("no_evidence", why)  # was: passed
    assert judgement(fig, DEFAULT_PROMOTE_IF) == ("no_evidence", why)  # was: failed (model_rejected, marked bad)
    # the serving model sees nothing, the candidate 3 boxes: recall has no figure
    ghost = Tally()
    ghost.add([], [det("face", (0, 0, 10, 10)), det("face", (20, 0, 30, 10))])
    ghost.add([], [det("face", (0, 0, 10, 10))])
    fig = ghost.figures()
    assert fig["recall"] is None and fig["precision"] == 0.0 and fig["agreement"] == 0.0
    assert judgement(fig, {"recall": 0.9}) == (
        "no_evidence",
        ["recall: no figure (the serving model detected nothing)"],
    )
    # a figure that is there and fails decides it: the candidate's 3 boxes that the serving model lacks
    assert judgement(fig, {"recall": 0.9, "precision": 0.9}) == ("failed", ["precision 0.000 < 0.9"])
    assert judgement(fig, {"score_shift": 0.1}) == ("no_evidence", ["score_shift: no figure (no matched pair)"])


def test_merged_tallies_are_the_sum_of_the_cameras() -> None:
    a, b = Tally(), Tally()
    a.add([det("face", (0, 0, 10, 10))], [det("face", (0, 0, 10, 10))])
    b.add([det("face", (0, 0, 10, 10))], [])
    total = Tally()
    total.merge(a)
    total.merge(b)
    fig = total.figures()
    assert (fig["frames"], fig["serving_detections"], fig["candidate_detections"], fig["matched"]) == (2, 2, 1, 1)
    assert fig["recall"] == 0.5 and fig["precision"] == 1.0
    assert fig["label_confusion"] == {"face": {"face": 1, MISSED: 1}}


def test_both_models_must_fit_the_budget_or_the_offer_is_refused() -> None:
    shadow_fits(40.0, 40.0, 300.0, 340.0)  # 300 in use (the serving model's 40 in it) + 40: fits exactly
    with pytest.raises(SwapError, match=r"candidate \(40.0 MB\).*over the 339 MB budget") as caught:
        shadow_fits(40.0, 40.0, 300.0, 339.0)
    assert caught.value.code == Code.OVER_BUDGET and "without shadow" in str(caught.value)


def test_promote_if_grammar() -> None:
    assert parse_promote_if("agreement>=0.95, recall>=0.98,latency<=1.2") == {
        "agreement": 0.95,
        "recall": 0.98,
        "latency": 1.2,
    }
    for text, why in [
        ("agreement>0.9", "FIGURE>=NUMBER"),
        ("speed>=0.9", "not a figure"),
        ("latency>=1.2", "takes <="),
        ("recall<=0.9", "takes >="),
        ("recall>=1.5", "between 0 and 1"),
        ("recall>=0.9,recall>=0.8", "twice"),
        (" , ", "no threshold"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_promote_if(text)


def test_the_ask_on_the_wire_defaults_and_bounds() -> None:
    ask = ShadowAsk()
    assert ask.promote_if == DEFAULT_PROMOTE_IF and ask.sample_fps == 1.0 and ask.min_frames == 100
    with pytest.raises(ValidationError, match="not a figure"):
        ShadowAsk(promote_if={"speed": 1.0})
    with pytest.raises(ValidationError, match="min_s"):
        ShadowAsk(min_s=100, max_s=10)
    with pytest.raises(ValidationError):
        ShadowAsk(sample_fps=0)
    with pytest.raises(ValidationError, match=r"0 is under 1: a verdict needs detections"):
        ShadowAsk(min_detections=0)
    assert ShadowAsk(min_detections=1).min_detections == 1
    args = offer_args("t1", b"{}", b"sig", shadow=ShadowAsk(sample_fps=2, promote_if={"recall": 0.9}))
    back = OfferArgs.model_validate_json(offer_payload(args))
    assert back.shadow is not None and back.shadow.sample_fps == 2 and back.shadow.promote_if == {"recall": 0.9}
    wire = jsonschema.Draft202012Validator(schema("edged.ota_offer/1"))
    wire.validate(json.loads(offer_payload(args)))
    assert OfferArgs.model_validate_json(offer_payload(offer_args("t1", b"{}", b"s"))).shadow is None


def test_a_report_validates_against_its_schema() -> None:
    t = Tally()
    t.add([det("face", (0, 0, 10, 10))], [det("face", (0, 0, 10, 9))])
    t.serving_ms.append(5.0)
    t.candidate_ms.append(6.0)
    ask = ShadowAsk(min_frames=1, min_detections=1, min_s=0)
    doc = report_doc(
        device="cam-01",
        transfer="t1",
        state="passed",
        serving=("faces", 1),
        candidate=("faces", 2),
        started=1.0,
        totals=t.figures(),
        per_camera={"lobby": t.figures()},
        memory_mb={"serving": 10.0, "candidate": 11.0, "budget": 4096.0},
        ask=ask,
        evidence=EVIDENCE,
        reasons=[],
    )
    doc["hold_ms"] = {"p50": 6.0, "max": 6.0, "batches": 1}
    assert doc["schema"] == SHADOW_SCHEMA
    jsonschema.Draft202012Validator(schema(SHADOW_SCHEMA)).validate(doc)
    with pytest.raises(ValueError, match="shadow state"):
        report_doc(**{**_kw(doc, ask), "state": "maybe"})


def _kw(doc: dict[str, Any], ask: ShadowAsk) -> dict[str, Any]:
    keys = ("device", "transfer", "state", "started", "totals", "per_camera", "memory_mb", "evidence", "reasons")
    kw = {k: doc[k] for k in keys}
    return {**kw, "serving": ("faces", 1), "candidate": ("faces", 2), "ask": ask}


def test_the_verdicts_counter_as_metrics_renders_it() -> None:
    verdicts = Verdicts()
    for v in ("passed", "failed", "failed", "no_evidence"):
        verdicts.count(v)
    with pytest.raises(ValueError, match="shadow verdict 'stopped'"):
        verdicts.count("stopped")

    class Collector:
        def collect(self) -> Any:
            yield shadow_verdicts(verdicts.counts())

    registry = CollectorRegistry()
    registry.register(Collector())
    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert {k: v for k, v in samples.items() if k[0] == "edged_shadow_verdicts_total"} == {
        ("edged_shadow_verdicts_total", (("verdict", "passed"),)): 1.0,
        ("edged_shadow_verdicts_total", (("verdict", "failed"),)): 2.0,
        ("edged_shadow_verdicts_total", (("verdict", "no_evidence"),)): 1.0,
        ("edged_shadow_verdicts_total", (("verdict", "refused"),)): 0.0,
    }
    assert "# TYPE edged_shadow_verdicts_total counter" in text and "refused (never shadowed: over_budget" in text
