"""The uploader (daemon/delivery/upload.py) against a real nginx with WebDAV PUT on 127.0.0.1 (tests/nginx_dav.py):
files land with their bytes, nginx stopped mid-queue and started again loses nothing, a new uploader over the
same state directory resumes the queue, the bounds refuse, a 4xx other than 408/429 is a permanent failure,
a bearer token is sent."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.config import UploadConfig, load_config
from edged.daemon.delivery.upload import QUEUE_FILE, Uploader
from edged.errors import ConfigError
from edged.models.demo import DemoAssets
from tests.conftest import base_config, wait_until, write_config
from tests.nginx_dav import DavServer


@pytest.fixture
def uploaders() -> Iterator[list[Uploader]]:
    made: list[Uploader] = []
    yield made
    for u in made:
        u.stop()


def make(made: list[Uploader], state: Path, url: str, **kw: Any) -> Uploader:
    cfg = UploadConfig(url=url, retry_min_s=0.05, retry_max_s=0.5, timeout_s=5, **kw)
    u = Uploader(cfg, state, threading.Event())
    made.append(u)
    return u


def files(folder: Path, n: int, size: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = folder / f"{folder.name}-{i:03d}.bin"
        p.write_bytes(os.urandom(size))
        out.append(p)
    return out


def landed(dav: DavServer, sub: str, sources: list[Path]) -> bool:
    return all((dav.root / sub / p.name).is_file() for p in sources)


def test_an_upload_lands_with_the_same_bytes_and_says_so(tmp_path: Path, dav: DavServer, uploaders) -> None:
    u = make(uploaders, tmp_path / "state", dav.url + "/dav/")
    u.start()
    src = files(tmp_path / "clips", 1, 300_000)[0]
    done: list[tuple[str, bool]] = []
    assert u.enqueue(src, "clips/cam1/" + src.name, "video/mp4", lambda name, ok: done.append((name, ok)))
    wait_until(lambda: bool(done), 30, "the upload to end")
    assert done == [("clips/cam1/" + src.name, True)]
    assert (dav.root / "dav/clips/cam1" / src.name).read_bytes() == src.read_bytes()
    s = u.stats()
    assert (s["queued"], s["uploaded"], s["bytes_uploaded"], s["failed"]) == (0, 1, 300_000, 0)
    assert [(st, m) for st, m, uri, _ in dav.requests()] == [(201, "PUT")]
    assert json.loads((tmp_path / "state/uploads" / QUEUE_FILE).read_text())["queue"] == []


def test_nginx_stopped_mid_queue_and_started_again_every_file_arrives(
    tmp_path: Path, dav: DavServer, uploaders
) -> None:
    u = make(uploaders, tmp_path / "state", dav.url + "/dav")
    u.start()
    first = files(tmp_path / "a", 3, 50_000)
    for p in first:
        assert u.enqueue(p, "up/" + p.name, "application/octet-stream")
    wait_until(lambda: landed(dav, "dav/up", first), 30, "the first files")
    dav.stop()
    rest = files(tmp_path / "b", 8, 80_000)
    for p in rest:
        assert u.enqueue(p, "up/" + p.name, "application/octet-stream")
    wait_until(lambda: u.stats()["failed_attempts"] >= 3, 30, "tries refused while nginx is down")
    assert u.stats()["queued"] == len(rest)
    dav.start()
    wait_until(lambda: u.stats()["queued"] == 0, 60, "the queue to drain after nginx is back")
    for p in first + rest:
        assert (dav.root / "dav/up" / p.name).read_bytes() == p.read_bytes()
    s = u.stats()
    assert (s["uploaded"], s["failed"], s["dropped"]) == (11, 0, 0)


def test_a_new_uploader_over_the_same_state_resumes_the_queue(tmp_path: Path, dav: DavServer, uploaders) -> None:
    state = tmp_path / "state"
    dav.stop()
    before = make(uploaders, state, dav.url + "/dav")
    before.start()
    src = files(tmp_path / "clips", 5, 20_000)
    for p in src:
        assert before.enqueue(p, "r/" + p.name, "video/mp4")
    wait_until(lambda: before.stats()["failed_attempts"] >= 1, 30, "a refused try")
    before.stop()  # a daemon stop with five files waiting
    dav.start()
    after = make(uploaders, state, dav.url + "/dav")
    assert after.stats()["queued"] == 5
    after.start()
    wait_until(lambda: landed(dav, "dav/r", src), 60, "the resumed queue to arrive")
    for p in src:
        assert (dav.root / "dav/r" / p.name).read_bytes() == p.read_bytes()


def test_the_bounds_refuse_and_count(tmp_path: Path, dav: DavServer, uploaders) -> None:
    u = make(uploaders, tmp_path / "state", dav.url + "/dav", max_queue=3, max_mb=0.25)  # not started: all wait
    src = files(tmp_path / "f", 5, 100_000)
    assert u.enqueue(src[0], "b/0", "x/y")
    assert u.enqueue(src[1], "b/1", "x/y")
    assert not u.enqueue(src[2], "b/2", "x/y")  # 300,000 bytes > 0.25 MiB
    assert u.enqueue(src[0], "b/0", "x/y")  # the same file to the same name: already waiting
    small = files(tmp_path / "s", 3, 10)
    assert u.enqueue(small[0], "b/s0", "x/y")
    assert not u.enqueue(small[1], "b/s1", "x/y")  # 3 entries
    assert not u.enqueue(tmp_path / "nothing-here", "b/n", "x/y")
    s = u.stats()
    assert (s["queued"], s["queued_bytes"], s["dropped"]) == (3, 200_010, 3)
    with pytest.raises(ValueError, match="remote name"):
        u.enqueue(small[2], "../etc/passwd", "x/y")
    assert u.forget(src[1]) == 1
    assert u.stats()["queued"] == 2


def test_a_4xx_fails_for_good_a_5xx_is_tried_again_and_the_bearer_token_goes(
    tmp_path: Path, dav: DavServer, uploaders
) -> None:
    src = files(tmp_path / "f", 1, 1000)[0]
    token = tmp_path / "token"
    token.write_text(dav.token + "\n")
    good = make(uploaders, tmp_path / "s1", dav.url + "/auth", token_file=token)
    good.start()
    ok: list[bool] = []
    assert good.enqueue(src, "t/a.bin", "x/y", lambda _, r: ok.append(r))
    wait_until(lambda: bool(ok), 30, "the authorised upload")
    assert ok == [True] and (dav.root / "auth/t/a.bin").read_bytes() == src.read_bytes()

    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    refused = make(uploaders, tmp_path / "s2", dav.url + "/auth", token_file=wrong)
    refused.start()
    res: list[bool] = []
    assert refused.enqueue(src, "t/b.bin", "x/y", lambda _, r: res.append(r))
    wait_until(lambda: bool(res), 30, "the refusal")
    assert res == [False]
    s = refused.stats()
    assert (s["failed"], s["failed_kept"], s["queued"], s["failed_attempts"]) == (1, 1, 0, 0)
    assert "HTTP 401" in refused.failed()[0]["error"]
    assert refused.state_of(src) == "failed"
    assert not (dav.root / "auth/t/b.bin").exists()

    busy = make(uploaders, tmp_path / "s3", dav.url + "/busy")
    busy.start()
    assert busy.enqueue(src, "c.bin", "x/y")
    wait_until(lambda: busy.stats()["failed_attempts"] >= 3, 30, "three tries of a 503")
    assert (busy.stats()["queued"], busy.stats()["failed"]) == (1, 0)
    assert [st for st, *_ in dav.requests()].count(503) >= 3


def test_a_corrupt_queue_file_is_set_aside(tmp_path: Path, uploaders) -> None:
    state = tmp_path / "state"
    (state / "uploads").mkdir(parents=True)
    (state / "uploads" / QUEUE_FILE).write_text("{not json")
    u = make(uploaders, state, "http://127.0.0.1:9/dav")
    assert u.stats()["queued"] == 0
    assert (state / "uploads" / (QUEUE_FILE + ".corrupt")).read_text() == "{not json"


def test_the_upload_section_is_checked_with_key_paths(tmp_path: Path, demo: DemoAssets) -> None:
    class At:
        host, port = "127.0.0.1", 1883

    cams = [{"name": "door", "uri": "synthetic://"}]

    def doc(**extra: Any) -> Any:
        return load_config(write_config(tmp_path / "edged.yaml", base_config(At(), demo, tmp_path, cams, **extra)))

    cfg = doc(upload={"url": "https://dav.example/edged/", "token_file": "secrets/token"})
    assert cfg.upload is not None and cfg.upload.url == "https://dav.example/edged"
    assert cfg.upload.token_file == tmp_path / "secrets/token"  # relative to the config file's folder
    for bad, why in (
        ({"url": "ftp://x/"}, "upload.url.*http"),
        ({"url": "http://u:p@x/"}, "upload.url.*credentials"),
        ({"url": "http://x/?a=1"}, "upload.url.*query"),
        ({"url": "http://x/", "username": "u"}, "upload.*password_file"),
        ({"url": "http://x/", "token_file": "t", "username": "u", "password_file": "p"}, "upload.*not both"),
        ({"url": "http://x/", "max_queue": 0}, "upload.max_queue"),
    ):
        with pytest.raises(ConfigError, match=why):
            doc(upload=bad)
    with pytest.raises(ConfigError, match=r"labelling\.upload needs an upload"):
        doc(labelling={"enabled": True, "upload": True})
    assert not doc(labelling={"enabled": True}).labelling.sampling
    assert doc(labelling={"enabled": True, "near_threshold": 0.1}).labelling.sampling


def test_a_307_from_a_signer_is_followed_without_our_token_and_a_301_is_not(
    tmp_path: Path, dav: DavServer, uploaders
) -> None:
    src = files(tmp_path / "f", 2, 5000)
    token = tmp_path / "token"
    token.write_text("a-bearer-for-the-signer-only")
    u = make(uploaders, tmp_path / "s", dav.url + "/signer", token_file=token)
    u.start()
    res: list[tuple[str, bool]] = []
    assert u.enqueue(src[0], "cam/a.mp4", "video/mp4", lambda n, ok: res.append((n, ok)))
    wait_until(lambda: bool(res), 30, "the redirected upload")
    assert res == [("cam/a.mp4", True)]
    assert (dav.root / "presigned/signer/cam/a.mp4").read_bytes() == src[0].read_bytes()
    assert [(st, uri) for st, m, uri, _ in dav.requests()] == [
        (307, "/signer/cam/a.mp4"),
        (201, "/presigned/signer/cam/a.mp4"),
    ]
    moved = make(uploaders, tmp_path / "m", dav.url + "/moved")
    moved.start()
    out: list[bool] = []
    assert moved.enqueue(src[1], "b.mp4", "video/mp4", lambda _, ok: out.append(ok))
    wait_until(lambda: bool(out), 30, "the refused redirect")
    assert out == [False] and "HTTP 301" in moved.failed()[0]["error"]
    assert not (dav.root / "dav/b.mp4").exists()


def test_stop_cuts_a_put_that_a_server_never_reads_and_the_file_stays_queued(tmp_path: Path) -> None:
    import socket
    import time

    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never reads: the PUT blocks on a full buffer
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(64 * 1024 * 1024))
    cfg = UploadConfig(url=f"http://127.0.0.1:{port}/dav", timeout_s=120)
    u = Uploader(cfg, tmp_path / "state", threading.Event())
    u.start()
    try:
        assert u.enqueue(big, "big.bin", "application/octet-stream")
        wait_until(lambda: u.state_of(big) == "uploading" and bool(held), 30, "the PUT to start")
        t0 = time.monotonic()
        u.stop()
        assert time.monotonic() - t0 < 5.0
        assert u._thread is not None and not u._thread.is_alive()
    finally:
        for s in held:
            s.close()
        listener.close()
    again = Uploader(cfg, tmp_path / "state", threading.Event())
    assert again.stats()["queued"] == 1 and again.state_of(big) == "queued"


def test_tls_is_checked_against_ca_file_and_never_downgraded(tmp_path: Path, uploaders) -> None:
    from edged.deploy import certs

    pki = tmp_path / "pki"
    certs.make_ca(pki)
    crt = certs.make_cert(pki, "server", hosts=["127.0.0.1"])
    server = DavServer(tmp_path, tls=(crt, pki / "server.key"))
    server.start()
    try:
        src = files(tmp_path / "f", 1, 20_000)[0]
        ok: list[bool] = []
        trusted = make(uploaders, tmp_path / "a", server.url + "/dav", ca_file=pki / "ca.crt")
        trusted.start()
        assert trusted.enqueue(src, "tls/a.bin", "x/y", lambda _, r: ok.append(r))
        wait_until(lambda: bool(ok), 30, "the upload over TLS")
        assert ok == [True] and (server.root / "dav/tls/a.bin").read_bytes() == src.read_bytes()
        system = make(uploaders, tmp_path / "b", server.url + "/dav")  # the system's CAs: our CA is not one
        system.start()
        assert system.enqueue(src, "tls/b.bin", "x/y")
        wait_until(lambda: system.stats()["failed_attempts"] >= 2, 30, "refused handshakes")
        assert system.stats()["queued"] == 1 and not (server.root / "dav/tls/b.bin").exists()
        down: list[bool] = []
        downgrade = make(uploaders, tmp_path / "c", server.url + "/downgrade", ca_file=pki / "ca.crt")
        downgrade.start()
        assert downgrade.enqueue(src, "c.bin", "x/y", lambda _, r: down.append(r))
        wait_until(lambda: bool(down), 30, "the refused downgrade")
        assert down == [False] and "refused a redirect from https to http://" in downgrade.failed()[0]["error"]
    finally:
        server.stop()


def test_files_gone_before_their_turn_are_dropped_without_delaying_the_next(
    tmp_path: Path, dav: DavServer, uploaders
) -> None:
    import time

    cfg = UploadConfig(url=dav.url + "/dav/", retry_min_s=2.0, retry_max_s=30.0, timeout_s=5)
    u = Uploader(cfg, tmp_path / "state", threading.Event())
    uploaders.append(u)
    for p in files(tmp_path / "gone", 4, 100):
        assert u.enqueue(p, "gone/" + p.name, "application/octet-stream")
        p.unlink()
    good = files(tmp_path / "good", 1, 1000)[0]
    done: list[bool] = []
    assert u.enqueue(good, "good/" + good.name, "application/octet-stream", lambda _n, ok: done.append(ok))
    t0 = time.monotonic()
    u.start()
    wait_until(lambda: bool(done), 30, "the good file to go")
    # four missing files with a 2 s back-off each would hold the good one for 8 s or more (at least 2 s)
    assert time.monotonic() - t0 < 2.0
    assert done == [True] and landed(dav, "dav/good", [good])
    s = u.stats()
    assert (s["dropped"], s["failed_attempts"], s["uploaded"], s["queued"]) == (4, 0, 1, 0)
