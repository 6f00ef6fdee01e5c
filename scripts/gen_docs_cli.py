"""docs/reference/cli.md and the man page docs/edged.1, from ``edged.cli.build_parser()``
(scripts/gen_docs.py): every verb and option in the parser's own order. argparse's own formatter is not
used, so neither COLUMNS nor the Python version changes a byte."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from gen_docs_markdown import GENERATED, anchor, md


def _parsers(p: argparse.ArgumentParser, name: str = "edged") -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(full command, parser, its one-line help) for the parser and every subcommand, in their own order."""
    yield name, p, ""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in action._choices_actions}
            for verb, sub in action.choices.items():
                for full, parser, h in _parsers(sub, f"{name} {verb}"):
                    yield full, parser, h or helps.get(verb, "")


def _metavar(a: argparse.Action) -> str:
    if a.metavar is not None:
        mv = a.metavar if isinstance(a.metavar, str) else " ".join(a.metavar)
    elif a.choices is not None:
        mv = "{" + ",".join(str(c) for c in a.choices) + "}"
    else:
        mv = a.dest.upper() if a.option_strings else a.dest
    if a.nargs == "+":
        return f"{mv} [{mv} ...]"
    if a.nargs == "*":
        return f"[{mv} ...]"
    if a.nargs == "?":
        return f"[{mv}]"
    return mv


def _takes_value(a: argparse.Action) -> bool:
    return a.nargs != 0 and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]


def _usage(full: str, p: argparse.ArgumentParser) -> str:
    parts = [full]
    for a in _options(p):
        if isinstance(a, argparse._HelpAction):
            continue
        if a.option_strings:
            flag = a.option_strings[-1] if len(a.option_strings[-1]) > 2 else a.option_strings[0]
            text = f"{flag} {_metavar(a)}" if _takes_value(a) else flag
            parts.append(text if a.required else f"[{text}]")
        else:
            parts.append(_metavar(a))
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            parts.append(f"{a.metavar or 'VERB'} ...")
    return " ".join(parts)


def _help(a: argparse.Action, prog: str) -> str:
    text = a.help or ""
    if "%(" in text:
        text = text % {**vars(a), "prog": prog, "default": a.default}
    if isinstance(a, argparse._VersionAction):
        text = text or "print the version and exit"
    return " ".join(text.split())


def _default(a: argparse.Action) -> str:
    if not _takes_value(a) or a.required or a.default in (None, argparse.SUPPRESS) or a.default == []:
        return ""
    return str(a.default)


def _parser() -> argparse.ArgumentParser:
    from edged.cli import build_parser

    return build_parser()


def cli_reference() -> str:
    lines = [
        "# Command-line reference",
        "",
        GENERATED,
        "",
        "Every verb and option of `edged`, from its argparse parser (`edged.cli.build_parser()`). The same",
        "text is the man page, [`edged.1`](../edged.1) (`man -l docs/edged.1`). Exit codes: 0 success, 1 a",
        "user-facing error (named in one line), 2 usage, 3 the daemon stopped itself for systemd to restart",
        "it (governor, or a probation rollback that needs a restart), 4 an accuracy gate failed (`edged quantize`).",
        "",
    ]
    cmds = list(_parsers(_parser()))
    lines += ["| command | what it does |", "|---|---|"]
    for full, _, h in cmds[1:]:
        lines.append(f"| [`{full}`](#{anchor(full)}) | {md(h)} |")
    lines.append("")
    for full, p, h in cmds:
        lines += [f"## {full}", "", "```", _usage(full, p), "```", ""]
        if p.description:
            lines += [md(p.description.strip()).replace("\\|", "|"), ""]
        elif h:
            lines += [md(h[0].upper() + h[1:] + "."), ""]
        opts = [a for a in _options(p) if not isinstance(a, argparse._HelpAction)]
        if opts:
            lines += ["| option | default | meaning |", "|---|---|---|"]
            for a in opts:
                names = ", ".join(a.option_strings) if a.option_strings else _metavar(a)
                arg = f" {_metavar(a)}" if a.option_strings and _takes_value(a) else ""
                req = " (required)" if a.required and a.option_strings else ""
                default = _default(a)
                text = md(_help(a, full))
                lines.append(f"| `{names}{arg}`{req} | {'`' + default + '`' if default else ''} | {text} |")
            lines.append("")
        if p.epilog:
            lines += ["```", p.epilog.rstrip(), "```", ""]
    return "\n".join(lines)


def _roff(text: str) -> str:
    """Text for a roff line: backslashes and hyphens escaped, no line starting with a control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def man_page() -> str:
    from edged import __version__

    cmds = list(_parsers(_parser()))
    root = cmds[0][1]
    out = [
        '.\\" generated by scripts/gen_docs.py from edged.cli.build_parser(); edit the code, then run it',
        f'.TH EDGED 1 "" "edged {__version__}" "User Commands"',
        ".SH NAME",
        "edged \\- " + _roff(root.description or "").rstrip("."),
        ".SH SYNOPSIS",
        ".B edged",
        "[\\fB\\-\\-version\\fR] [\\fB\\-v\\fR] \\fIVERB\\fR ...",
        ".SH DESCRIPTION",
        _roff("Each VERB below has its own options (edged VERB --help prints them)."),
        "The operator guide (docs/operator.md in the source, /opt/edged/docs/operator.md on a device",
        "installed from the deploy bundle) covers installing, systemd, the broker and troubleshooting.",
        ".SH COMMANDS",
    ]
    for full, p, h in cmds:
        if full != "edged":
            out += [".SS " + _roff(full)]
            if h:
                out += [_roff(h[0].upper() + h[1:] + ".")]
        out += [".PP", ".nf", _roff(_usage(full, p)), ".fi"]
        if p.description and full != "edged":
            out += [".PP", _roff(" ".join(p.description.split()))]
        for a in _options(p):
            if isinstance(a, argparse._HelpAction):
                continue
            names = ", ".join(f"\\fB{_roff(o)}\\fR" for o in a.option_strings) or f"\\fI{_roff(_metavar(a))}\\fR"
            arg = f" \\fI{_roff(_metavar(a))}\\fR" if a.option_strings and _takes_value(a) else ""
            text = _help(a, full)
            default = _default(a)
            if default:
                text += f" (default: {default})"
            out += [".TP", names + arg, _roff(text) if text else "\\&"]
    out += [
        ".SH EXIT STATUS",
        _roff(
            "0 success; 1 a user-facing error, named in one line; 2 usage; 3 the daemon stopped itself for "
            "systemd to restart it (governor, or a probation rollback that needs a restart); 4 an accuracy gate "
            "failed (edged quantize)."
        ),
        ".SH ENVIRONMENT",
        ".TP",
        "\\fBEDGED_\\fISECTION\\fB__\\fIKEY\\fR",
        _roff("overrides a configuration key, e.g. EDGED_MQTT__PORT=8883; levels joined by __, list items by index."),
        ".SH FILES",
        ".TP",
        "/etc/edged/edged.yaml",
        "the device's configuration (docs/reference/config.md lists every key)",
        ".TP",
        "/var/lib/edged",
        "the state directory: the spool and the model store",
        ".SH SEE ALSO",
        "\\fBsystemctl\\fR(1), \\fBjournalctl\\fR(1), \\fBmosquitto_sub\\fR(1)",
        "",
    ]
    return "\n".join(out)
