"""A real ``airfs catalog serve`` process for the REST API tests: started on a free loopback
port (``--listen 127.0.0.1:0``; the URL it prints), stopped by its PID, and failed when it
exits non-zero or logs a traceback or an ERROR line; plus tokens made with the real CLI and
raw HTTP for what clients would not send (traversal, malformed bodies)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cattest_util import Origin_

from airfs.testing.mountfix import airfs_cmd

_BAD = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) |Traceback")


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str]
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def raw(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request with ``path`` sent exactly as given (no normalising)."""
        u = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=60)
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def error(self, *args: Any, **kw: Any) -> tuple[int, str, str]:
        """(status, error_code, message) of a refused raw request."""
        status, _h, data = self.raw(*args, **kw)
        obj = json.loads(data)
        return status, obj["error_code"], obj["message"]


def token(o: Origin_, principal: str, *groups: str) -> str:
    argv = ["--json", "token", "create", "--principal", principal]
    for g in groups:
        argv += ["--group", g]
    code, out, err = o.catalog(*argv)
    assert code == 0, err
    return str(json.loads(out)["token"])


@contextlib.contextmanager
def serve(o: Origin_, log: Path, *extra: str) -> Iterator[Server]:
    """``airfs catalog --origin O serve --listen 127.0.0.1:0 -v EXTRA`` until the block ends."""
    cmd = [
        *airfs_cmd(),
        "catalog",
        "--origin",
        o.spec,
        *(o.args if o.kind == "s3" else []),
        "serve",
        "--listen",
        "127.0.0.1:0",
        "-v",
        *extra,
    ]
    env = {**os.environ, **o.env, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=logf, text=True, env=env)
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    line = ""
    deadline = time.monotonic() + 60
    while not line and time.monotonic() < deadline and proc.poll() is None:
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
    m = re.search(r"listening on (\S+)", line)
    if m is None:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"airfs catalog serve did not start: {line!r}\n{log.read_text()}")
    srv = Server(m.group(1), proc, log)
    try:
        yield srv
    finally:
        proc.send_signal(signal.SIGTERM)  # nothing if the test already stopped it
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stacks = _stacks(proc.pid)
            proc.kill()
            proc.wait()
            raise AssertionError(
                f"airfs catalog serve did not stop within 60 s of SIGTERM; its threads:\n"
                f"{stacks}\nits log:\n{log.read_text(errors='replace')[-3000:]}"
            ) from None
        finally:
            proc.stdout.close()
        text = log.read_text(errors="replace")
        bad = [ln for ln in text.splitlines() if _BAD.search(ln)]
        assert rc == 0, f"airfs catalog serve exited {rc}:\n{text[-3000:]}"
        assert not bad, "unexpected in the server log:\n" + "\n".join(bad[:10])


def _stacks(pid: int) -> str:
    """``py-spy dump`` of a process that hangs (what each of its threads is doing)."""
    spy = Path(sys.executable).parent / "py-spy"
    try:
        p = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(py-spy dump failed: {exc})"
    return p.stdout + p.stderr


def serve_fails(o: Origin_, *extra: str, tmpdir: Path | None = None) -> tuple[int, str]:
    """Run ``serve`` expecting it to refuse to start: (exit code, stderr); ``tmpdir``: its
    ``TMPDIR`` (where its staging directory goes)."""
    cmd = [
        *airfs_cmd(),
        "catalog",
        "--origin",
        o.spec,
        *(o.args if o.kind == "s3" else []),
        "serve",
        *extra,
    ]
    env = {**os.environ, **o.env, **({"TMPDIR": str(tmpdir)} if tmpdir else {})}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    return p.returncode, p.stderr
