"""Configuration: validated once, unknown keys rejected, errors name key path and file."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.daemon.config import load_config, load_mqtt_config
from edged.errors import ConfigError
from edged.models.demo import DemoAssets

from .conftest import REPO, edged_cli, write_config

MINIMAL = {
    "device_id": "cam-box",
    "model": {"package": "pkg"},
    "cameras": [{"name": "a", "uri": "synthetic://"}, {"name": "b", "uri": "file:///x.mp4"}],
}


def test_shipped_examples_validate() -> None:
    for name in ("edged.example.yaml", "demo.yaml"):
        cfg = load_config(REPO / "examples" / name, environ={})
        assert cfg.cameras


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    cfg = load_config(write_config(tmp_path / "c.yaml", MINIMAL), environ={})
    assert cfg.mqtt.port == 1883 and cfg.mqtt.qos == 1 and cfg.model.backend == "auto"
    assert cfg.model.package == tmp_path / "pkg"
    assert cfg.topic_root == "edged/cam-box"


def test_unknown_key_names_path_and_file(tmp_path: Path) -> None:
    doc = {**MINIMAL, "mqtt": {"hots": "x"}}
    path = write_config(tmp_path / "bad.yaml", doc)
    with pytest.raises(ConfigError, match=r"bad\.yaml: mqtt\.hots: unknown key"):
        load_config(path, environ={})


def test_bad_camera_uri_names_the_list_item(tmp_path: Path) -> None:
    doc = {**MINIMAL, "cameras": [{"name": "a", "uri": "synthetic://"}, {"name": "b", "uri": "ftp://x"}]}
    with pytest.raises(ConfigError, match=r"cameras\[1\]\.uri: scheme must be one of"):
        load_config(write_config(tmp_path / "c.yaml", doc), environ={})


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"device_id": "a/b"}, r"device_id: must be 1-64"),
        ({"mqtt": {"port": 70000}}, r"mqtt\.port: Input should be less than or equal to 65535"),
        ({"model": {}}, r"model: set exactly one of model\.package"),
        ({"cameras": []}, r"cameras: List should have at least 1 item"),
        ({"cameras": [{"name": "a", "uri": "synthetic://"}] * 2}, r"camera names must be unique; repeated: a"),
        ({"detection": {"score_threshold": 2}}, r"detection\.score_threshold"),
        ({"mqtt": {"tls": {"cert_file": "c.pem"}}}, r"mqtt\.tls\.ca_file: Field required"),
    ],
)
def test_invalid_values(tmp_path: Path, patch: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write_config(tmp_path / "c.yaml", {**MINIMAL, **patch}), environ={})


def test_not_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("device_id: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "a.yaml", environ={})
    (tmp_path / "b.yaml").write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(tmp_path / "b.yaml", environ={})
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml", environ={})


def test_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path / "c.yaml", MINIMAL)
    monkeypatch.setenv("EDGED_DEVICE_ID", "orin-07")
    monkeypatch.setenv("EDGED_MQTT__PORT", "8883")
    monkeypatch.setenv("EDGED_MQTT__HOST", "broker.site")
    monkeypatch.setenv("EDGED_CAMERAS__1__URI", "rtsp://10.0.0.5/s1")
    monkeypatch.setenv("EDGED_DETECTION__LABELS", "[face, person]")
    cfg = load_config(path)
    assert cfg.device_id == "orin-07" and cfg.mqtt.port == 8883 and cfg.mqtt.host == "broker.site"
    assert cfg.cameras[1].uri == "rtsp://10.0.0.5/s1" and cfg.cameras[0].uri == "synthetic://"
    assert cfg.detection.labels == ["face", "person"]


def test_environment_override_errors_name_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path / "c.yaml", MINIMAL)
    monkeypatch.setenv("EDGED_CAMERAS__5__URI", "synthetic://")
    with pytest.raises(ConfigError, match="EDGED_CAMERAS__5__URI: no list item 5"):
        load_config(path)
    monkeypatch.delenv("EDGED_CAMERAS__5__URI")
    monkeypatch.setenv("EDGED_MQTT__PROT", "1")
    with pytest.raises(ConfigError, match=r"mqtt\.prot: unknown key"):
        load_config(path)


def test_check_config_cli_exit_codes(tmp_path: Path) -> None:
    good = edged_cli("check-config", "-c", str(REPO / "examples" / "edged.example.yaml"), "--no-model")
    assert good.returncode == 0, good.stderr
    assert "config valid" in good.stdout
    bad = write_config(tmp_path / "bad.yaml", {**MINIMAL, "inference": {"max_wait": 5}})
    run = edged_cli("check-config", "-c", str(bad))
    assert run.returncode == 1
    assert "bad.yaml: inference.max_wait: unknown key" in run.stderr


def test_paths_take_environment_variables_such_as_systemd_credentials(tmp_path: Path) -> None:
    doc = {**MINIMAL, "mqtt": {"username": "cam", "password_file": "${CREDENTIALS_DIRECTORY}/mqtt_password"}}
    cfg = load_config(write_config(tmp_path / "c.yaml", doc), environ={"CREDENTIALS_DIRECTORY": "/run/credentials/e"})
    assert cfg.mqtt.password_file == Path("/run/credentials/e/mqtt_password")
    with pytest.raises(ConfigError, match=r"CREDENTIALS_DIRECTORY.*not set|not set.*CREDENTIALS_DIRECTORY"):
        load_config(tmp_path / "c.yaml", environ={})


def test_a_repeated_key_is_refused_naming_key_line_and_file(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(
        "device_id: cam-box\n"
        "mqtt:\n"
        "  host: broker.site\n"
        "  port: 8883\n"
        "model: {package: pkg}\n"
        "cameras: [{name: a, uri: 'synthetic://'}]\n"
        "mqtt:\n"  # a second section would have replaced the first, host and port gone
        "  keepalive_s: 60\n"
    )
    with pytest.raises(ConfigError, match=r"dup\.yaml: line 7: duplicate key 'mqtt' \(first at line 2\)"):
        load_config(path, environ={})
    # in a nested mapping too, and through the loader `edged push -c` uses
    path.write_text("device_id: x\nmqtt:\n  host: a\n  port: 1\n  host: b\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml: line 5: duplicate key 'host' \(first at line 3\)"):
        load_mqtt_config(path, environ={})
    # a merge key's values may be overridden: that is what merges are for
    path.write_text(
        "device_id: x\nmodel: {package: pkg}\n"
        "cameras:\n"
        "  - &cam {name: a, uri: 'synthetic://', fps_max: 5}\n"
        "  - {<<: *cam, name: b, fps_max: 7}\n"
    )
    cfg = load_config(path, environ={})
    assert [(c.name, c.fps_max) for c in cfg.cameras] == [("a", 5), ("b", 7)]


def test_an_empty_environment_override_is_refused_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path / "c.yaml", {**MINIMAL, "state_dir": "/var/lib/edged-test"})
    with pytest.raises(ConfigError, match=r"c\.yaml: environment variable EDGED_STATE_DIR is set but empty"):
        load_config(path, environ={"EDGED_STATE_DIR": ""})
    with pytest.raises(ConfigError, match="EDGED_MQTT__HOST is set but empty"):
        load_config(path, environ={"EDGED_MQTT__HOST": "  "})
    # null on purpose still means none
    assert load_config(path, environ={"EDGED_MQTT__CLIENT_ID": "null"}).mqtt.client_id is None
    # and through the real CLI: exit 1 with the variable named, nothing else taken as valid
    monkeypatch.setenv("EDGED_STATE_DIR", "")
    run = edged_cli("check-config", "-c", str(path), "--no-model")
    assert run.returncode == 1, run.stdout
    assert "environment variable EDGED_STATE_DIR is set but empty" in run.stderr
    assert "config valid" not in run.stdout


# --- errors of EDGED_* overrides name the variable, not the file --------------------------------------------


def test_a_bad_override_value_names_the_variable_not_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yaml", {**MINIMAL, "mqtt": {"port": 1883}})
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"EDGED_MQTT__PORT": "eighty"})
    text = str(err.value)
    assert text.startswith("environment variable EDGED_MQTT__PORT: mqtt.port:"), text
    assert "c.yaml" not in text  # the file says 1883, which is fine
    # a file error and a variable error together: each blamed on its source
    doc = {**MINIMAL, "inference": {"max_wait": 5}}
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path / "d.yaml", doc), environ={"EDGED_CAMERAS__0__FPS_MAX": "0"})
    text = str(err.value)
    assert "d.yaml: inference.max_wait: unknown key" in text, text
    assert "environment variable EDGED_CAMERAS__0__FPS_MAX: cameras[0].fps_max:" in text, text
    assert "d.yaml: cameras" not in text, text


def test_the_mqtt_section_alone_takes_its_overrides(tmp_path: Path) -> None:
    """What `edged push -c` and `edged watch -c` read: the same broker the daemon would use."""
    path = write_config(tmp_path / "c.yaml", {**MINIMAL, "mqtt": {"host": "file-broker", "port": 1883}})
    env = {"EDGED_MQTT__HOST": "site-broker", "EDGED_MQTT__PORT": "8883", "EDGED_CAMERAS__7__URI": "synthetic://"}
    mqtt = load_mqtt_config(path, environ=env)  # another section's variable is not this reader's business
    assert (mqtt.host, mqtt.port) == ("site-broker", 8883)
    with pytest.raises(ConfigError, match=r"^environment variable EDGED_MQTT__PORT: mqtt\.port:"):
        load_mqtt_config(path, environ={"EDGED_MQTT__PORT": "x"})


# --- check-config: every problem of the config, named by key and file, and no side effects ---------------


def test_check_config_names_missing_files_by_key_and_reports_every_camera(tmp_path: Path) -> None:
    doc = {
        **MINIMAL,
        "mqtt": {"tls": {"ca_file": "certs/ca.crt"}},
        "model": {"package": "nopkg"},
        "cameras": [{"name": "a", "uri": "file:///none/a.mp4"}, {"name": "b", "uri": "file:///none/b.mp4"}],
    }
    path = write_config(tmp_path / "c.yaml", doc)
    run = edged_cli("check-config", "-c", str(path))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "config valid" not in run.stdout, run.stdout
    assert f"c.yaml: mqtt.tls.ca_file: {tmp_path / 'certs' / 'ca.crt'}: no such file" in run.stderr, run.stderr
    assert f"c.yaml: model.package: {tmp_path / 'nopkg'}: no such file or folder" in run.stderr, run.stderr
    assert "camera a:" in run.stderr and "camera b:" in run.stderr, run.stderr  # both, and the model too
    # --no-model: the package is not looked at, the broker's files still are
    run = edged_cli("check-config", "-c", str(path), "--no-model")
    assert run.returncode == 1 and "mqtt.tls.ca_file" in run.stderr and "model.package" not in run.stderr


@pytest.mark.parametrize("uri", ["rtsp://user:secret@", "rtsp://user:secret@/stream", "http://user:secret@:8080/"])
def test_a_network_camera_without_a_host_is_refused_without_its_password(tmp_path: Path, uri: str) -> None:
    doc = {**MINIMAL, "cameras": [{"name": "a", "uri": uri}]}
    path = write_config(tmp_path / "c.yaml", doc)
    with pytest.raises(ConfigError, match=r"c\.yaml: cameras\[0\]\.uri: .*no host") as err:
        load_config(path, environ={})
    assert "secret" not in str(err.value)
    run = edged_cli("check-config", "-c", str(path), "--no-model")
    assert run.returncode == 1 and "no host" in run.stderr and "secret" not in run.stdout + run.stderr


def test_check_config_leaves_the_state_directory_alone(tmp_path: Path, demo: DemoAssets) -> None:
    """A daemon may be running on this state directory: checking a config unpacks a .tar package elsewhere."""
    import tarfile

    tar = tmp_path / "pkg.tar"
    with tarfile.open(tar, "w") as t:
        for f in demo.packages["blazeface-back"].root.iterdir():
            t.add(f, arcname=f.name)
    state = tmp_path / "state"
    (state / "staging").mkdir(parents=True)
    (state / "staging" / "in-use").write_text("a running daemon's\n")
    doc = {**MINIMAL, "state_dir": str(state), "model": {"package": str(tar)}}
    doc["cameras"] = [{"name": "a", "uri": "synthetic://"}]
    run = edged_cli("check-config", "-c", str(write_config(tmp_path / "c.yaml", doc)))
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (state / "staging").iterdir()) == ["in-use"]
    fresh = tmp_path / "fresh"
    doc["state_dir"] = str(fresh)
    assert edged_cli("check-config", "-c", str(write_config(tmp_path / "d.yaml", doc))).returncode == 0
    assert not fresh.exists()
