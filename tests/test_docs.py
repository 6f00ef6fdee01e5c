"""The docs against the code: generated pages regenerate byte-identical, the config reference names every
key, every relative link in the README and docs/ lands on a file (and heading) that exists, and the man
page renders."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from edged.daemon.config import load_config
from tests.nspawn import from_zero

REPO = Path(__file__).resolve().parent.parent


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_docs = _gen_docs()


def test_every_generated_page_regenerates_byte_identical() -> None:
    pages = gen_docs.render()
    assert {"docs/reference/config.md", "docs/reference/cli.md", "docs/edged.1"} <= set(pages)
    drifted = [rel for rel, text in pages.items() if (REPO / rel).read_text(encoding="utf-8") != text]
    assert not drifted, f"drifted from the code: {drifted}; run python scripts/gen_docs.py and commit"


def test_check_mode_names_the_page_that_drifted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for rel in gen_docs.render():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    monkeypatch.setattr(gen_docs, "REPO", tmp_path)
    assert gen_docs.main(["--check"]) == 0
    page = tmp_path / "docs" / "reference" / "config.md"
    page.write_text(page.read_text() + "a hand edit\n")
    assert gen_docs.main(["--check"]) == 1
    assert "docs/reference/config.md: drifted" in capsys.readouterr().err
    assert page.read_text().endswith("a hand edit\n")  # --check writes nothing


def test_the_generator_is_independent_of_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    before = gen_docs.render()
    monkeypatch.setenv("COLUMNS", "37")
    assert gen_docs.render() == before


def test_every_config_key_is_in_the_config_reference() -> None:
    text = (REPO / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    keys = [path for path, _ in gen_docs.config_keys()]
    assert "cameras[].reconnect_max_s" in keys and "mqtt.tls.ca_file" in keys
    missing = [k for k in keys if f"`{k}`" not in text and f"`{k}[]`" not in text]  # a list section: `cameras[]`
    assert not missing


def test_every_config_field_has_a_description() -> None:
    assert [path for path, field in gen_docs.config_keys() if not field.description] == []


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.replace("`", "").strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _prose(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks, inline code removed."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return out


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            slug = _slug(line.lstrip("#"))
            n, candidate = 0, slug
            while candidate in found:
                n += 1
                candidate = f"{slug}-{n}"
            found.add(candidate)
    return found


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_lands(page: Path) -> None:
    broken = []
    for line in _prose(page):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto, man:
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{target}: no file {dest}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_guides_start_with_their_audience_and_contents() -> None:
    for name in ("operator", "subscriber", "models", "benchmarks"):
        head = (REPO / "docs" / f"{name}.md").read_text(encoding="utf-8")[:2500]
        assert "**For**" in head and "Contents:" in head, name


def test_readme_is_short_and_keeps_the_two_commands() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_the_man_page_renders() -> None:
    out = subprocess.run(
        ["man", "-l", str(REPO / "docs" / "edged.1")],
        capture_output=True,
        text=True,
        env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin", "MANPAGER": "cat", "PAGER": "cat"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "edged run" in out.stdout and "--config" in out.stdout
    assert "warning" not in out.stderr.lower(), out.stderr


def test_the_example_config_shows_every_key_with_the_codes_default() -> None:
    """examples/edged.example.yaml is the third place defaults are written: every key is in it (commented
    out where it is an alternative), and every value it sets is the code's default, except the keys a
    config must fill in."""
    import yaml

    text = (REPO / "examples" / "edged.example.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    filled_in = {"model.package"}  # one of model.package / model.name must be set
    missing, differ = [], []
    for path, field in gen_docs.config_keys():
        node = doc
        for part in path.split("."):
            node = node.get(part.removesuffix("[]"), KeyError) if isinstance(node, dict) else KeyError
            node = node[0] if part.endswith("[]") and isinstance(node, list) else node
        leaf = path.rsplit(".", 1)[-1].removesuffix("[]")
        if node is KeyError:
            if not re.search(rf"^\s*#?\s*-?\s*{re.escape(leaf)}:", text, re.MULTILINE):
                missing.append(path)
            continue
        if field.is_required() or path in filled_in or isinstance(node, dict):
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, Path):
            default = str(default)
        if node != default:
            differ.append(f"{path}: example {node!r}, code {default!r}")
    assert not missing, f"keys missing from the example: {missing}"
    assert not differ, differ


# docs/operator.md "A secured site from zero": tests/test_nspawn.py runs these blocks verbatim in a
# container under a real systemd (minutes, root only); these checks fail fast when an edit breaks the list


def _from_zero() -> list[from_zero.Step]:
    return from_zero.steps((REPO / "docs" / "operator.md").read_text(encoding="utf-8"))


def test_the_secured_site_from_zero_has_its_six_steps() -> None:
    steps = _from_zero()
    assert [s.title for s in steps] == [
        "Name the site",
        "On the admin machine, make the site's certificates",
        "On the broker host",
        "On the device",
        "Start the daemon",
        "Check from the admin machine, with the backend's certificate",
    ]
    _, certs, broker, device, start, check = (s.code for s in steps)
    assert from_zero.names(steps[0]) == ["BROKER", "BROKER_IP", "DEVICE", "SRC"]  # what test_nspawn.py sets
    for verb in ("ca", "server", "backend", "device", "status"):
        assert f"edged certs {verb} " in certs, verb
    for line in ('mosquitto/edged.conf" /etc/mosquitto/conf.d/', 'mosquitto/edged.acl" /etc/mosquitto/'):
        assert line in broker, line
    assert "install -m 0640 -g mosquitto pki/server.key" in broker and "systemctl restart mosquitto" in broker
    assert "systemctl restart edged" in start
    assert "mosquitto_sub" in check
    assert "-p 8883 --cafile pki/ca.crt --cert pki/backend.crt --key pki/backend.key" in check
    # the drop-in's credentials are the unit's commented lines, every one of them
    unit = (REPO / "systemd" / "edged.service").read_text(encoding="utf-8")
    commented = re.findall(r"^#(LoadCredential=tls_.*)$", unit, re.M)
    assert len(commented) == 3
    assert re.findall(r"^(LoadCredential=.*)$", device, re.M) == commented


def test_the_drop_in_of_step_4_configures_the_broker_the_daemon_reads(tmp_path: Path) -> None:
    """Step 4's heredoc, expanded by bash as on the device, read as systemd reads Environment= (no
    expansion), then applied to the config install.sh writes: the broker and credential paths land."""
    device = _from_zero()[3].code
    heredoc = re.search(r"^cat > \S+ <<EOF\n(.*?^EOF\n)", device, re.S | re.M)
    assert heredoc is not None
    text = subprocess.run(
        ["bash", "-c", f"BROKER=broker.test\ncat <<EOF\n{heredoc.group(1)}"], capture_output=True, text=True, check=True
    ).stdout
    env = {"CREDENTIALS_DIRECTORY": "/run/credentials/edged.service"}
    for line in text.splitlines():
        if line.startswith("Environment="):
            for item in shlex.split(line.removeprefix("Environment=")):
                key, _, value = item.partition("=")
                env[key] = value
    assert "${CREDENTIALS_DIRECTORY}" in env["EDGED_MQTT__TLS__KEY_FILE"]  # left for edged to expand
    cfg = load_config(REPO / "deploy" / "edged.yaml", env)
    assert (cfg.mqtt.host, cfg.mqtt.port) == ("broker.test", 8883)
    assert cfg.mqtt.tls is not None
    creds = Path("/run/credentials/edged.service")
    assert (cfg.mqtt.tls.ca_file, cfg.mqtt.tls.cert_file, cfg.mqtt.tls.key_file) == (
        creds / "tls_ca.crt",
        creds / "tls_device.crt",
        creds / "tls_device.key",
    )


def test_the_from_zero_script_runs_every_block_verbatim_and_parses() -> None:
    doc = (REPO / "docs" / "operator.md").read_text(encoding="utf-8")
    script = from_zero.script(doc, {"BROKER": "localhost", "DEVICE": "e2e-01"})
    assert all(step.code in script for step in _from_zero())
    assert "\nBROKER=localhost\nDEVICE=e2e-01\n" in script  # after step 1's own values
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    with pytest.raises(ValueError, match=r"step 1 does not name \['CAMERA'\]"):
        from_zero.script(doc, {"CAMERA": "x"})


def test_the_extractor_refuses_a_broken_list() -> None:
    doc = (REPO / "docs" / "operator.md").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="no heading"):
        from_zero.steps(doc.replace(from_zero.HEADING, "## A site"))
    block = "   ```sh\n   systemctl restart edged\n   systemctl is-active edged\n   ```\n"
    assert block in doc
    with pytest.raises(ValueError, match="step 5 has 0 sh blocks"):
        from_zero.steps(doc.replace(block, ""))
    with pytest.raises(ValueError, match=r"steps numbered \[1, 2, 3, 4, 6, 6\]"):
        from_zero.steps(doc.replace("5. Start the daemon", "6. Start the daemon"))
