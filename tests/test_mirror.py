"""Packages over HTTP(S) from a real nginx (Debian's, started here on 127.0.0.1 with its own config and
prefix in a temporary folder, never the system service): `edged push --mirror`, real `edged run` daemons,
real stops of nginx and of the daemon mid-transfer, Range resume read from nginx's access log."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.config import OtaConfig
from edged.daemon.lifecycle.ota.download import Downloader, PartFile
from edged.deploy import certs
from edged.errors import Code, EdgedError
from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from tests.conftest import Broker, edged_cli, free_port, wait_until, write_config
from tests.nginx_dav import NginxServer
from tests.test_ota import MODEL, build, device_doc, install, push, start_push, wait_results

LOG_FORMAT = '$status $request_method $uri "$http_range" $body_bytes_sent'


class Nginx(NginxServer):
    """nginx serving `root` on 127.0.0.1 (TLS with `tls` = (cert, key)), at `limit_rate` per request; its
    access log has one `Request` per line."""

    def __init__(self, workdir: Path, root: Path, limit_rate: str = "0", tls: tuple[Path, Path] | None = None):
        super().__init__(workdir, "nginx", tls)
        self.root = root
        locations = f"""
        location /broken/ {{ return 503; }}
        location /moved/ {{ return 302 http://127.0.0.1:{self.port}/sha256/x; }}"""
        self.configure(LOG_FORMAT, root, limit_rate, locations)

    def requests(self) -> list[tuple[int, str, str, str, int]]:
        """(status, method, uri, range header, body bytes sent) per logged request."""
        out = []
        for line in self.log_lines():
            status, method, uri, rng, sent = line.split(" ")
            out.append((int(status), method, uri, rng.strip('"'), int(sent)))
        return out


@pytest.fixture
def nginx_factory(tmp_path: Path) -> Any:
    servers: list[Nginx] = []

    def make(root: Path, **kw: Any) -> Nginx:
        n = Nginx(tmp_path, root, **kw)
        n.start()
        servers.append(n)
        return n

    yield make
    for n in servers:
        n.stop()


def statuses(sub: Any) -> list[dict[str, Any]]:
    return [m.json() for m in sub.on("ota/status") if m.payload]


def blob(pkg_file: Path) -> str:
    return "sha256/" + hashlib.sha256(pkg_file.read_bytes()).hexdigest()


def test_a_device_downloads_from_nginx_and_resumes_after_nginx_and_the_daemon_restart(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon, nginx_factory
) -> None:
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["ota"].update(retry_s=0.5)
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    www = tmp_path / "www"
    web = nginx_factory(www, limit_rate="48k")  # ~13 s for the 590 KiB model: slow enough to cut twice
    v2 = build(demo, tmp_path, signer, 2)
    model = demo.packages[MODEL].model_path
    size, uri = model.stat().st_size, "/" + blob(model)
    p = start_push(broker, v2, "--device", "cam-01", "--mirror", str(www), "--mirror-url", web.url + "/")

    def at_least(n: int) -> bool:
        return any(s.get("state") == "downloading" and s.get("bytes", 0) >= n for s in statuses(sub))

    wait_until(lambda: at_least(100_000), 60, "the device to download 100 kB from nginx")
    assert (www / uri[1:]).read_bytes() == model.read_bytes()  # written under its hash
    web.stop()  # cut mid-transfer

    def refused() -> list[dict[str, Any]]:  # retries while nginx is down (the first one: the cut GET)
        return [s for s in statuses(sub) if "Connection refused" in (s.get("detail") or {}).get("error", "")]

    wait_until(lambda: bool(refused()), 30, "a retry refused while nginx is down")
    held = refused()[0]["detail"]["at"]
    assert 100_000 <= held < size, refused()[0]
    part = next((tmp_path / "cam-01" / "ota").glob("*/package/model.onnx.part"))
    assert part.stat().st_size == held  # nothing more arrives while nginx is down
    web.start()
    # the daemon stopped mid-transfer: at start it resumes from the bytes it persisted
    wait_until(lambda: at_least(held + 100_000), 60, "another 100 kB after the restart of nginx")
    assert d.stop() == 0, d.output()[-3000:]
    # what it persisted (fsynced at least every second): the bytes a restart trusts
    kept = json.loads(next((tmp_path / "cam-01" / "ota").glob("*/progress.json")).read_text())["model.onnx"]
    assert held < kept < size
    d = start_daemon(cfg)
    out, _ = p.communicate(timeout=240)
    assert p.returncode == 0, out + d.output()
    assert "1 of 1 device(s) succeeded" in out and "probation" in out and "served" not in out, out
    # nginx logs a request when it ends (not one its own fast shutdown cut): the GET resumed after nginx's
    # restart (cut by the daemon's stop) and the one resumed after the daemon's, each a 206 from the byte held
    gets = [r[:4] for r in web.requests() if r[1:3] == ("GET", uri)]
    assert gets == [(206, "GET", uri, f"bytes={held}-{size - 1}"), (206, "GET", uri, f"bytes={kept}-{size - 1}")]
    wait_results(sub, 2)
    assert d.stop() == 0


def test_a_corrupt_byte_and_a_404_on_the_mirror_fail_clearly_and_keep_the_running_model(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon, nginx_factory
) -> None:
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    www = tmp_path / "www"
    web = nginx_factory(www)
    v2 = build(demo, tmp_path, signer, 2)
    # the user uploads the files (here: written without devices, then one byte flipped on the server)
    r = push(broker, v2, "--mirror", str(www))
    assert r.returncode == 0 and "sha256/" in r.stdout, r.stderr
    model = demo.packages[MODEL].model_path
    served = www / blob(model)
    data = bytearray(served.read_bytes())
    data[len(data) // 2] ^= 0xFF
    served.write_bytes(bytes(data))
    r = push(broker, v2, "--device", "cam-01", "--mirror", web.url)
    assert r.returncode == 1 and "rejected (hash_mismatch:" in r.stderr, r.stderr
    assert not any((tmp_path / "cam-01" / "ota").iterdir()), "the refused bytes are discarded"
    # a 404: edged push checks first and offers nothing ...
    served.unlink()
    r = push(broker, v2, "--device", "cam-01", "--mirror", web.url)
    assert r.returncode == 1 and "HTTP 404 Not Found" in r.stderr and "nothing was offered" in r.stderr, r.stderr
    assert f"{web.url}/{blob(model)}" in r.stderr
    # ... and where only the devices reach the server, the device says it
    r = push(broker, v2, "--device", "cam-01", "--mirror", web.url, "--no-mirror-check")
    assert r.returncode == 1 and "failed (download_failed: GET" in r.stderr and "HTTP 404" in r.stderr, r.stderr
    failed = [s for s in statuses(sub) if s["state"] == "failed"][-1]
    assert failed["error"]["code"] == "download_failed" and "404" in failed["error"]["message"]
    n = len(sub.results())
    wait_until(lambda: len(sub.results()) > n + 3, 30, "version 1 still serving")
    assert {r["model"]["version"] for r in sub.results()} == {1}
    state = [m.json() for m in sub.on("model/state") if m.payload][-1]
    assert state["active"] == 1 and state["last"]["code"] == "download_failed", state
    assert d.stop() == 0


def downloader(**cfg: Any) -> Downloader:
    return Downloader(OtaConfig(**{"retry_s": 0.2, "give_up_s": 5, **cfg}), threading.Event())


def fill(dl: Downloader, urls: list[str], stage: Path, size: int) -> tuple[PartFile, list[str]]:
    stage.mkdir(exist_ok=True)
    part = PartFile(stage, "blob", size, 0)
    retries: list[str] = []
    try:
        dl.fetch(lambda: urls, part, lambda: None, lambda err, wait_s: retries.append(err))
    finally:
        part.close()
    return part, retries


def test_the_bandwidth_cap_tls_verification_and_mirrors_in_turn(tmp_path: Path, nginx_factory) -> None:
    www = tmp_path / "www"
    (www / "sha256").mkdir(parents=True)
    body = os.urandom(200 * 1024)
    (www / "sha256" / "x").write_bytes(body)
    web = nginx_factory(www)
    # the cap: 200 KiB at 400 KiB/s takes half a second (nginx itself sends at once)
    t0 = time.monotonic()
    part, retries = fill(downloader(http_rate_kib_s=400), [f"{web.url}/sha256/x"], tmp_path / "a", len(body))
    took = time.monotonic() - t0
    assert part.done == len(body) and part.digest.hexdigest() == hashlib.sha256(body).hexdigest()
    assert 0.45 <= took < 5, took
    # a dead mirror first: the next one is tried after a jittered wait
    dead = f"http://127.0.0.1:{free_port()}/sha256/x"
    part, retries = fill(downloader(), [dead, f"{web.url}/sha256/x"], tmp_path / "b", len(body))
    assert part.done == len(body) and len(retries) == 1 and "Connection refused" in retries[0]
    # a file of another size than the manifest's: refused at once, named
    with pytest.raises(EdgedError, match="the server's file is 204800 bytes, the manifest says 204801") as e:
        fill(downloader(), [f"{web.url}/sha256/x"], tmp_path / "c", len(body) + 1)
    assert e.value.code == Code.DOWNLOAD_FAILED
    # a server error is tried again, a bounded number of times; a dead server until give_up_s
    with pytest.raises(EdgedError, match="HTTP 503 Service Temporarily Unavailable \\(3 times in a row\\)") as e:
        fill(downloader(), [f"{web.url}/broken/x"], tmp_path / "f", len(body))
    assert e.value.code == Code.DOWNLOAD_FAILED
    with pytest.raises(EdgedError, match=r"no byte of blob for 1 s .*Connection refused") as e:
        fill(downloader(give_up_s=1), [dead], tmp_path / "g", len(body))
    assert e.value.code == Code.STALLED
    # TLS: trusted with ota.http_ca_file, refused against the system's CAs (no switch turns that off)
    pki = tmp_path / "pki"
    certs.make_ca(pki)
    crt = certs.make_cert(pki, "server", hosts=["127.0.0.1"])
    tls = nginx_factory(www, tls=(crt, pki / "server.key"))
    part, _ = fill(downloader(http_ca_file=pki / "ca.crt"), [f"{tls.url}/sha256/x"], tmp_path / "d", len(body))
    assert part.done == len(body)
    with pytest.raises(EdgedError, match=r"certificate verify failed.*trusting the system's CAs") as e:
        fill(downloader(), [f"{tls.url}/sha256/x"], tmp_path / "e", len(body))
    assert e.value.code == Code.DOWNLOAD_FAILED
    # a redirect from https to plain http is refused (the bytes would travel in clear)
    with pytest.raises(EdgedError, match=r"refused a redirect from https to http://127\.0\.0\.1") as e:
        fill(downloader(http_ca_file=pki / "ca.crt"), [f"{tls.url}/moved/x"], tmp_path / "h", len(body))
    assert e.value.code == Code.DOWNLOAD_FAILED


def test_the_mirror_layout_is_content_addressed_and_rewritten_only_when_wrong(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    from edged.deploy.mirror import Mirror, stage, write
    from edged.models.package import open_package
    from edged.protocol.ota import OfferArgs

    tar = build(demo, tmp_path, signer, 3)
    lines = stage(tar, tmp_path / "m", "https://cdn.example/edged/")
    model = demo.packages[MODEL].model_path
    assert f"model.onnx\thttps://cdn.example/edged/{blob(model)}" in lines and len(lines) == 2
    served = tmp_path / "m" / blob(model)
    assert served.read_bytes() == model.read_bytes()
    (tmp_path / "scratch").mkdir()
    pkg = open_package(tar, scratch=tmp_path / "scratch")
    files = {name: pkg.root / name for name in pkg.manifest.files}
    assert write(tmp_path / "m", pkg.manifest, files) == 0  # already there, hashes checked
    served.write_bytes(b"x" * served.stat().st_size)  # damaged on the mirror: written again
    assert write(tmp_path / "m", pkg.manifest, files) == 1 and served.read_bytes() == model.read_bytes()
    assert sorted(p.name for p in (tmp_path / "m" / "sha256").iterdir() if p.name.startswith(".")) == []
    # where the URLs come from, and what an offer may carry
    with pytest.raises(ValueError, match="needs --mirror-url BASE"):
        Mirror(str(tmp_path / "m"))
    with pytest.raises(ValueError, match="needs --mirror DIR"):
        Mirror("", "https://cdn.example/edged/")
    with pytest.raises(ValueError, match="not an http:// or https:// URL"):
        Mirror(str(tmp_path / "m"), "ftp://host/x")
    urls = Mirror("https://cdn.example/edged/").urls(pkg.manifest)
    assert urls["model.onnx"] == [f"https://cdn.example/edged/{blob(model)}"]
    for bad in (["file:///etc/passwd"], ["http://"], ["https://a/b"] * 5, []):
        with pytest.raises(ValueError):
            OfferArgs(transfer="t", manifest="", sig="", urls={"model.onnx": bad})
    r = edged_cli("push", str(tar), "--device", "cam-01", "--mirror", str(tmp_path / "m"))
    assert r.returncode == 2 and "needs --mirror-url BASE" in r.stderr, r.stderr
