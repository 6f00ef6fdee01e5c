"""``edged diagnose DEVICE``'s ask: the ``diagnose`` command, its parts, the document printed.

The first ask (``{"lines": N}``) makes the device build its document and answer part 0; each further part is
asked by the document's id (``{"id": …, "part": k}``) and the parts are joined and checked against their
SHA-256 (`edged.protocol.commands.join_parts`). Replies come to a response topic under the device's own
``…/reply/`` with correlation data, through the one asker (cli/ask.py). Nothing of the device runtime is loaded.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from edged.protocol.client import MqttSettings
from edged.protocol.commands import DIAGNOSE_VERB, join_parts

from .ask import Asker


def ask(
    cfg: MqttSettings, device: str, lines: int, timeout_s: float = 60.0, part_chars: int | None = None
) -> dict[str, Any]:
    """The device's diagnostics document (edged.diagnose/1), every part asked for and joined."""
    with Asker(cfg, device, "diagnose", timeout_s) as asker:
        asked: dict[str, Any] = {"lines": lines} | ({"part_chars": part_chars} if part_chars else {})
        first = asker.ask(DIAGNOSE_VERB, asked, f"diagnose {asked}")
        results = [first]
        for k in range(1, int(first["parts"])):
            again = {"id": first["id"], "part": k}
            results.append(asker.ask(DIAGNOSE_VERB, again, f"diagnose {again}"))
        return join_parts(results)


def show(doc: dict[str, Any], as_json: bool = False, out: TextIO = sys.stdout) -> None:
    """The document as JSON, or as a report: the doctor's lines, model, spool, config, logs."""
    if as_json:
        print(json.dumps(doc, indent=2), file=out)
        return
    print(
        f"diagnose {doc.get('device')}: edged {doc.get('version')}, up {doc.get('uptime_s')} s, boot "
        f"{str(doc.get('boot_id'))[:8]}, at {doc.get('ts')}",
        file=out,
    )
    doctor = doc.get("doctor") or {}
    print(f"\ndoctor ({'ok' if doctor.get('ok') else 'a check failed'}, {doctor.get('took_s')} s):", file=out)
    for c in doctor.get("checks") or []:
        status = {"fail": "FAIL"}.get(c.get("status"), c.get("status"))
        fix = f"  (fix: {c['fix']})" if c.get("fix") and c.get("status") != "ok" else ""
        print(f"  {status:<4} {c.get('name'):<10} {c.get('detail')}{fix}", file=out)
    store = doc.get("store") or {}
    st = store.get("state") or {}
    prob = st.get("probation")
    print(f"\nmodel: {store.get('package')}" + (f", on probation ({prob})" if prob else ""), file=out)
    spool = doc.get("spool") or {}
    print(
        f"spool: {spool.get('spool_rows')} rows, {spool.get('spool_state')}, file {spool.get('file_bytes')} bytes; "
        f"broker {'connected' if spool.get('connected') else 'not connected'}"
        + (f", last error: {spool['last_error']}" if spool.get("last_error") else ""),
        file=out,
    )
    print("\nconfig (in force, secrets removed):", file=out)
    print("  " + json.dumps(doc.get("config"), indent=2).replace("\n", "\n  "), file=out)
    logs = doc.get("logs") or {}
    lines = logs.get("lines") or []
    print(f"\nlog (the newest {len(lines)} of {logs.get('seen')} lines since the start):", file=out)
    for line in lines:
        print(f"  {line}", file=out)
