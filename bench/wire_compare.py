#!/usr/bin/env python3
"""Is the wire the same? Run two versions of edged through one script and compare every message.

    python bench/wire_compare.py --old /tmp/soakvenv/bin/python --new .venv/bin/python [--out bench/out/wire]

Each PYTHON is an interpreter whose ``python -m edged`` is one version (a venv with edged installed, or an
editable install of a checkout). For each, bench/wire_record.py starts a real mosquitto, runs the daemon as
its own process on the demo video (every frame inferred once, zones, tracking, object events, Home
Assistant discovery, the health endpoint), sends every verb of the command channel and some refusals
(wire_record.COMMANDS), reads /healthz, /readyz and /metrics, stops it with SIGTERM and keeps every message
the broker delivered. One daemon at a time.

Then, per message kind (the topic with its device, camera and verb levels generalised): the same count, the
same topics in the same order, the same QoS, retain flag and MQTT v5 properties, and payloads byte for byte
the same after replacing only the values that differ between any two runs (timestamps, ids drawn at start,
latencies, rates, memory: bench/wire_normalise.py lists each with its reason). The first difference of a kind
is shown as a unified diff of its JSON. ``edged --help`` and every subcommand's ``--help``, found by walking
the verbs each page lists, are compared byte for byte (at COLUMNS=100).

Exit status: 0 when everything is identical, 1 when something differs, 2 when a run failed. About 2 minutes
on a busy two-core machine (two daemon runs of ~40 s, 33 --help pages per version).

Trust it: a version compared with itself (--old X --new X) must come out identical, which shows the
normalisation is enough; and a deliberately changed copy must not. Without touching a checkout: copy an
installed ``site-packages/edged`` to DIR/edged, change a line (a key order in protocol/commands.py
reply_doc, say), and pass as --new a two-line wrapper script that runs ``PYTHONPATH=DIR exec PYTHON "$@"``.

Not exercised: an OTA transfer and group offers (``…/ota/*``, model installed/activated events: they need a
store, a signed package and ``edged push``), a command's ``expires_at`` refusal and the snapshot rate limit
(their messages carry a measured time), and periodic telemetry (only the stop's document is sent).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from wire_normalise import METRIC_VARYING, VARYING, normalise_metrics, normalise_payload
from wire_record import CAMERA, COMMANDS, DEVICE, IDLE, Message, Recording, record

_KIND_RULES = [
    (re.compile(rf"^edged/{DEVICE}/(results|snapshot|ha)/({CAMERA}|{IDLE})$"), r"\1/<camera>"),
    (re.compile(rf"^edged/{DEVICE}/cmd/[^/]+/reply$"), "cmd/<verb>/reply"),
    (re.compile(rf"^edged/{DEVICE}/reply/.+$"), "reply/<response topic>"),
    (re.compile(rf"^homeassistant/sensor/{DEVICE}/[^/]+/config$"), "homeassistant discovery config"),
    (re.compile(rf"^edged/{DEVICE}/(.+)$"), r"\1"),
]


def kind_of(topic: str) -> str:
    for rx, repl in _KIND_RULES:
        if rx.match(topic):
            return rx.sub(repl, topic)
    return topic


@dataclass
class KindResult:
    kind: str
    old_count: int
    new_count: int
    difference: str  # "" when identical

    @property
    def ok(self) -> bool:
        return not self.difference


def _pretty(payload: bytes) -> list[str]:
    try:
        return json.dumps(json.loads(payload), indent=1, ensure_ascii=False).splitlines()
    except ValueError:
        return [f"<{len(payload)} bytes, not JSON>"]


def _bytes_diff(a: bytes, b: bytes) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"byte {i} of {len(a)}/{len(b)}: old {a[max(0, i - 40) : i + 40]!r}\n    new {b[max(0, i - 40) : i + 40]!r}"


def message_diff(n: int, a: Message, b: Message) -> str:
    """'' when message `n` of a kind is the same in both runs; else what differs."""
    if a.topic != b.topic:
        return f"message {n}: topic {a.topic!r} != {b.topic!r}"
    head = f"message {n} on {a.topic}"
    if (a.qos, a.retain) != (b.qos, b.retain):
        return f"{head}: QoS/retain {a.qos}/{a.retain} != {b.qos}/{b.retain}"
    if a.props != b.props:
        return f"{head}: MQTT properties {a.props} != {b.props}"
    na, nb = normalise_payload(a.payload), normalise_payload(b.payload)
    if na == nb:
        return ""
    pa, pb = _pretty(na), _pretty(nb)
    if pa == pb or pa[0].startswith("<"):  # the same document written differently (or not JSON): show bytes
        return f"{head}: payload differs at {_bytes_diff(na, nb)}"
    diff = difflib.unified_diff(pa, pb, "old", "new", n=2, lineterm="")
    return f"{head}: payload differs (normalised JSON):\n" + "\n".join(list(diff)[:60])


def compare_messages(old: list[Message], new: list[Message]) -> list[KindResult]:
    kinds: dict[str, tuple[list[Message], list[Message]]] = {}
    for side, msgs in ((0, old), (1, new)):
        for m in msgs:
            kinds.setdefault(kind_of(m.topic), ([], []))[side].append(m)
    out = []
    for kind, (a, b) in kinds.items():
        why = ""
        if len(a) != len(b):
            why = f"count {len(a)} != {len(b)}"
            ta, tb = [m.topic for m in a], [m.topic for m in b]
            if ta != tb:
                why += "; topics:\n" + "\n".join(list(difflib.unified_diff(ta, tb, "old", "new", lineterm=""))[:30])
        for n, (x, y) in enumerate(zip(a, b, strict=False)):
            d = message_diff(n, x, y)
            if d:
                why = f"{why}; {d}" if why else d
                break
        out.append(KindResult(kind, len(a), len(b), why))
    return out


def compare_http(old: Recording, new: Recording) -> list[KindResult]:
    out = []
    for path in sorted(set(old.http) | set(new.http)):
        (ca, ta), (cb, tb) = old.http.get(path, (0, "")), new.http.get(path, (0, ""))
        if path == "/metrics":
            ta, tb = normalise_metrics(ta), normalise_metrics(tb)
        else:
            ta, tb = normalise_payload(ta.encode()).decode(), normalise_payload(tb.encode()).decode()
        why = f"status {ca} != {cb}" if ca != cb else ""
        if ta != tb:
            diff = difflib.unified_diff(ta.splitlines(), tb.splitlines(), "old", "new", n=1, lineterm="")
            why += ("; " if why else "") + "body differs:\n" + "\n".join(list(diff)[:40])
        out.append(KindResult(f"http {path}", 1, 1, why))
    return out


# --- --help ----------------------------------------------------------------------------------------------
HELP_WORKERS = 4  # `python -m edged X --help` processes at a time
_VERB_LINE = re.compile(r"^    ([a-z][a-z0-9_-]*)(?:\s{2,}|$)")


def subcommands(page: str) -> list[str]:
    """The verbs an argparse page lists: its "positional arguments:" section's lines indented four spaces
    (argparse's subparser choices; their help, when wrapped, is indented further)."""
    verbs: list[str] = []
    inside = False
    for line in page.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            inside = line == "positional arguments:"
            continue
        m = _VERB_LINE.match(line) if inside else None
        if m:
            verbs.append(m.group(1))
    return verbs


def _help(python: str, words: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(COLUMNS="100", LINES="50")
    r = subprocess.run(
        [python, "-m", "edged", *words, "--help"], capture_output=True, text=True, timeout=120, cwd="/", env=env
    )
    return f"exit {r.returncode}\n{r.stdout}{r.stderr}"


def help_pages(python: str) -> dict[str, str]:
    """Every page of `edged ... --help`: the top one, and each subcommand's, found from the verbs each page
    lists (`subcommands`)."""
    pages: dict[str, str] = {}
    level: list[list[str]] = [[]]
    with ThreadPoolExecutor(HELP_WORKERS) as pool:  # one level of the tree at a time, its pages in parallel
        while level:
            texts = list(pool.map(lambda words: _help(python, words), level))
            nxt: list[list[str]] = []
            for words, text in zip(level, texts, strict=True):
                pages[" ".join(["edged", *words])] = text
                nxt += [[*words, verb] for verb in subcommands(text)]
            level = nxt
    return pages


def compare_help(old: dict[str, str], new: dict[str, str]) -> list[KindResult]:
    out = []
    for cmd in sorted(set(old) | set(new)):
        a, b = old.get(cmd), new.get(cmd)
        if a is None or b is None:
            why = f"only in {'new' if a is None else 'old'}"
        elif a == b:
            why = ""
        else:
            why = "differs:\n" + "\n".join(
                list(difflib.unified_diff(a.splitlines(), b.splitlines(), "old", "new", n=1, lineterm=""))[:40]
            )
        out.append(KindResult(f"{cmd} --help", int(a is not None), int(b is not None), why))
    return out


# --- the report ------------------------------------------------------------------------------------------
def table(title: str, rows: list[KindResult]) -> list[str]:
    w = max([len(r.kind) for r in rows] + [10])
    lines = [title, f"  {'kind':<{w}}  {'old':>5}  {'new':>5}  result"]
    for r in rows:
        first = r.difference.splitlines()[0] if r.difference else ""
        lines.append(f"  {r.kind:<{w}}  {r.old_count:>5}  {r.new_count:>5}  {'identical' if r.ok else first}")
    details = [r for r in rows if not r.ok and "\n" in r.difference]
    for r in details:
        lines += ["", f"  --- {r.kind}: {r.difference}"]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the interpreter whose `python -m edged` is the old version")
    ap.add_argument("--new", required=True, help="the interpreter whose `python -m edged` is the new version")
    ap.add_argument("--out", type=Path, help="write the report to OUT.txt and OUT.json")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders (configs, logs, broker logs)")
    ap.add_argument("--no-help", action="store_true", help="skip the --help comparison")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edged-wire-"))
    t0 = time.monotonic()
    runs: dict[str, Recording] = {}
    for label, python in (("old", args.old), ("new", args.new)):
        print(f"{label}: {python}", flush=True)
        try:
            runs[label] = record(python, work / label, log=lambda s: print(s, flush=True))
        except (RuntimeError, TimeoutError, AssertionError, subprocess.TimeoutExpired) as exc:  # Broker: assert
            log = work / label / "daemon.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            print(f"{label}: the run failed: {exc}\n{tail}\n(files in {work / label})")
            return 2
        r = runs[label]
        print(f"    {r.version}: {len(r.messages)} messages, exit {r.exit_code}, {r.seconds:.1f} s", flush=True)
    old, new = runs["old"], runs["new"]
    sections = [
        ("MQTT, per message kind", compare_messages(old.messages, new.messages)),
        ("HTTP (health endpoint)", compare_http(old, new)),
        ("daemon exit status", [KindResult("exit status", old.exit_code, new.exit_code, "")]),
    ]
    if old.exit_code != new.exit_code:
        sections[-1][1][0].difference = f"exit {old.exit_code} != {new.exit_code}"
    if not args.no_help:
        print("--help pages ...", flush=True)
        sections.append(("--help pages", compare_help(help_pages(args.old), help_pages(args.new))))
    sent = ", ".join(dict.fromkeys(verb for verb, _, _ in COMMANDS))
    lines = [
        f"old: {args.old} ({old.version})",
        f"new: {args.new} ({new.version})",
        f"commands sent: {len(COMMANDS)}, verbs {sent} (nope: an unknown one; the list: wire_record.COMMANDS)",
        f"normalised keys: {', '.join(VARYING)}",
        "",
    ]
    for title, rows in sections:
        lines += table(title, rows)
    bad = sum(not r.ok for _, rows in sections for r in rows)
    total = sum(len(rows) for _, rows in sections)
    lines.append(f"{total - bad} of {total} identical, {bad} differ ({time.monotonic() - t0:.0f} s)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.txt").write_text(text + "\n")
        doc: dict[str, Any] = {
            "old": {"python": args.old, "version": old.version, "exit": old.exit_code, "seconds": old.seconds},
            "new": {"python": args.new, "version": new.version, "exit": new.exit_code, "seconds": new.seconds},
            "sections": {t: [r.__dict__ for r in rows] for t, rows in sections},
            "normalised_keys": VARYING,
            "normalised_metrics": METRIC_VARYING,
            "identical": bad == 0,
        }
        Path(f"{args.out}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}.txt and {args.out}.json")
    if not args.keep:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    else:
        print(f"runs kept in {work}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
