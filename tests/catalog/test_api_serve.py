"""``airfs catalog serve`` itself: HTTPS with ``--tls-cert``/``--tls-key``, loopback only
without TLS unless ``--allow-insecure-remote``, and a clear refusal to start without a
catalog or with half a TLS configuration."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from apitest_util import serve, serve_fails, token
from cattest_util import Origin_, site

CAT = "/api/2.1/unity-catalog"


@pytest.fixture
def origin() -> Iterator[tuple[Origin_, Path]]:
    with site("posix") as s:
        code, _out, err = s.origin.catalog("init", "--admin", "ops")
        assert code == 0, err
        yield s.origin, s.base


def test_https_with_a_certificate(origin: tuple[Origin_, Path]) -> None:
    o, base = origin
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a certificate")
    cert, key = base / "cert.pem", base / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    with serve(o, base / "tls.log", "--tls-cert", str(cert), "--tls-key", str(key)) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        tok = token(o, "ops")
        r = requests.get(
            f"{srv.url}{CAT}/catalogs",
            headers={"Authorization": f"Bearer {tok}"},
            verify=str(cert),
            timeout=30,
        )
        assert (r.status_code, r.json()) == (200, {"catalogs": []})
        with pytest.raises(requests.exceptions.SSLError):  # the certificate is checked
            requests.get(f"{srv.url}{CAT}/catalogs", timeout=30)
        with pytest.raises(requests.exceptions.ConnectionError):  # no plain HTTP on it
            requests.get(srv.url.replace("https", "http") + f"{CAT}/catalogs", timeout=30)
        # the server goes on after those
        r = requests.get(
            f"{srv.url}{CAT}/catalogs",
            headers={"Authorization": f"Bearer {tok}"},
            verify=str(cert),
            timeout=30,
        )
        assert r.status_code == 200


def test_loopback_only_without_tls(origin: tuple[Origin_, Path]) -> None:
    o, base = origin
    code, err = serve_fails(o, "--listen", "0.0.0.0:0")
    assert code == 1 and "not a loopback address" in err and "--tls-cert" in err
    with serve(o, base / "remote.log", "--listen", "0.0.0.0:0", "--allow-insecure-remote") as srv:
        assert srv.url.startswith("http://0.0.0.0:")
        port = srv.url.rsplit(":", 1)[1]
        r = requests.get(f"http://127.0.0.1:{port}{CAT}/catalogs", timeout=30)
        assert (r.status_code, r.json()["error_code"]) == (401, "UNAUTHENTICATED")
    code, err = serve_fails(o, "--tls-cert", str(base / "cert.pem"))
    assert code == 2 and "--tls-cert and --tls-key together" in err


def test_refuses_to_start_without_a_catalog(tmp_path: Path) -> None:
    with site("posix") as s:
        code, err = serve_fails(s.origin, "--listen", "127.0.0.1:0", tmpdir=tmp_path)
        assert code == 1 and "no catalog" in err
    assert list(tmp_path.iterdir()) == []  # its staging directory went with it


def test_a_stop_does_not_wait_for_idle_kept_alive_connections(
    origin: tuple[Origin_, Path],
) -> None:
    """SIGTERM with a client holding a kept-alive connection open (answered, then silent):
    the server exits at once, without waiting out the connection's 120 s idle timeout
    (its connection threads are daemon threads, never joined)."""
    o, base = origin
    with serve(o, base / "idle.log") as srv:
        host, port = srv.url.split("://", 1)[1].rsplit(":", 1)
        idle = http.client.HTTPConnection(host, int(port), timeout=60)
        idle.request("GET", f"{CAT}/catalogs")
        r = idle.getresponse()
        r.read()
        assert r.status == 401 and not r.will_close  # the connection stays open
        os.kill(srv.proc.pid, signal.SIGTERM)
        started = time.monotonic()
        rc = srv.proc.wait(timeout=60)
        waited = time.monotonic() - started
    assert rc == 0
    assert waited < 30, f"the stop waited {waited:.1f}s for an idle connection"
    idle.close()
