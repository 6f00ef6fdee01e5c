"""A real nginx (Debian's) on 127.0.0.1 for the tests: `NginxServer`, its own prefix, config and port in a
temporary folder, never the system service, kept across `stop()` and `start()` so a test can take it down
mid-transfer and bring it back (tests/test_mirror.py serves packages with it); and `DavServer`, the same
nginx with its http_dav_module taking HTTP PUT, for the uploader's tests:

    /dav/       PUT (create_full_put_path): the files land under `root`
    /auth/      PUT only with ``Authorization: Bearer <token>`` (else 401), files under `root`/auth
    /forbidden/ 403 to everything (a permanent refusal)
    /busy/      503 to everything (a server error: tried again)
    /moved/     301 to /dav/ (a redirect a PUT does not follow: a permanent failure)
    /downgrade/ 307 to http:// on the same port (what an https upload must refuse)
    /signer/    307 to /presigned/<same path>?X-Amz-Signature=…, as a signer in front of S3 answers
    /presigned/ PUT only without an Authorization header (else 400), as S3 takes a presigned URL
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_until

NGINX = Path("/usr/sbin/nginx")
LOG_FORMAT = "$status $request_method $uri $request_length"


class NginxServer:
    """A real nginx on 127.0.0.1, in its own prefix `workdir`/`name`-<port> (config, logs, temp folders, pid),
    never the system service; TLS with `tls` = (certificate, key). A subclass writes its server block with
    `configure` and reads its own access log format back from `log_lines`. The port is kept across `stop()`
    and `start()`, so a test can take it down mid-transfer and bring it back."""

    def __init__(self, workdir: Path, name: str, tls: tuple[Path, Path] | None = None) -> None:
        if not NGINX.exists():
            pytest.fail("nginx is not installed (apt-get install nginx-light); scripts/setup.sh installs it")
        self.port = free_port()
        self.prefix = workdir / f"{name}-{self.port}"
        self.prefix.mkdir(parents=True)
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.conf = self.prefix / "nginx.conf"
        self.proc: subprocess.Popen[bytes] | None = None

    def configure(self, log_format: str, root: Path, limit_rate: str, locations: str, http: str = "") -> None:
        """Write nginx.conf: one server on our port serving `root` at `limit_rate` per request with
        `locations`; `http` adds directives to the http block."""
        ssl = f"ssl_certificate {self.tls[0]}; ssl_certificate_key {self.tls[1]};" if self.tls else ""
        kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        temp = " ".join(f"{k}_temp_path {self.prefix}/{k};" for k in kinds)
        self.conf.write_text(f"""
daemon off;
worker_processes 1;
pid {self.prefix}/nginx.pid;
error_log {self.prefix}/error.log info;
{"user root;" if os.geteuid() == 0 else ""}
events {{ worker_connections 64; }}
http {{
    log_format r '{log_format}';
    access_log {self.prefix}/access.log r;
    default_type application/octet-stream;
    {http}
    {temp}
    server {{
        listen 127.0.0.1:{self.port}{" ssl" if self.tls else ""};
        {ssl}
        root {root};
        limit_rate {limit_rate};
        {locations}
    }}
}}
""")

    def start(self) -> None:
        cmd = [str(NGINX), "-p", str(self.prefix), "-c", str(self.conf), "-e", str(self.prefix / "error.log")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._up, 15, f"nginx on port {self.port}")
        assert self.proc.poll() is None, _read(self.prefix / "error.log")[-2000:]

    def _up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            return True
        return "start worker process" in _read(self.prefix / "error.log") and _connects(self.port)

    def stop(self) -> None:
        """A fast shutdown (SIGTERM): connections are cut, as a crash or a restart of the host would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        self.proc = None
        (self.prefix / "error.log").write_text("")  # the next start() waits on its own "start worker process"

    def log_lines(self) -> list[str]:
        """The access log's lines, in the format given to `configure`."""
        return _read(self.prefix / "access.log").splitlines()


class DavServer(NginxServer):
    def __init__(
        self,
        workdir: Path,
        token: str = "s3cret-token",
        limit_rate: str = "0",
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """`tls`: (certificate, key) to serve https."""
        super().__init__(workdir, "nginx-dav", tls)
        self.root = self.prefix / "www"
        (self.root / "dav").mkdir(parents=True)
        (self.root / "auth").mkdir()
        (self.root / "presigned").mkdir()
        self.token = token
        port = self.port
        locations = f"""
        location /dav/ {{
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
        location /auth/ {{
            if ($http_authorization != "Bearer {token}") {{ return 401; }}
            dav_methods PUT;
            create_full_put_path on;
        }}
        location /forbidden/ {{ return 403; }}
        location /busy/ {{ return 503; }}
        location /moved/ {{ return 301 http://127.0.0.1:{port}/dav$uri; }}
        location /downgrade/ {{ return 307 http://127.0.0.1:{port}/dav$uri; }}
        location /signer/ {{ return 307 http://127.0.0.1:{port}/presigned$uri?X-Amz-Signature=0123abcd; }}
        location /presigned/ {{
            if ($http_authorization != "") {{ return 400; }}
            dav_methods PUT;
            create_full_put_path on;
        }}"""
        self.configure(LOG_FORMAT, self.root, limit_rate, locations, http="client_max_body_size 0;")

    def requests(self) -> list[tuple[int, str, str, int]]:
        """(status, method, uri, request length) per logged request."""
        out = []
        for line in self.log_lines():
            status, method, uri, length = line.split(" ")
            out.append((int(status), method, uri, int(length)))
        return out


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def dav(tmp_path: Path) -> Iterator[DavServer]:
    """A WebDAV nginx of the test's own, started, stopped after it."""
    server = DavServer(tmp_path)
    server.start()
    yield server
    server.stop()
