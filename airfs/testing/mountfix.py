"""Real mounts for tests and benchmarks: start ``airfs mount`` in a subprocess, wait for it,
and always tear it down (``fusermount3 -u -z``, then stop the daemon by its PID).

Skips are the caller's business: :func:`fuse_available` says whether ``/dev/fuse`` and
``fusermount3`` are there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airfs.control import client

MOUNT_TYPE = "fuse.airfs"


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


def is_mounted(mountpoint: str | Path) -> bool:
    mp = os.path.realpath(mountpoint)
    with open("/proc/self/mounts", encoding="utf-8") as f:
        return any(
            len(p) > 2 and p[1].encode().decode("unicode_escape") == mp
            for p in (line.split() for line in f)
        )


def airfs_cmd() -> list[str]:
    return [sys.executable, "-m", "airfs.cli"]


@dataclass
class Mounted:
    """A running mount. ``origin`` is what was passed to ``--origin`` (None: overlay)."""

    mountpoint: Path
    cache_dir: Path
    origin: str | None
    pid: int
    env: dict[str, str] = field(default_factory=dict)
    args: Sequence[str] = ()

    @property
    def log(self) -> Path:
        return self.cache_dir / "airfs.log"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def status(self) -> dict[str, Any]:
        return client.status(str(self.mountpoint))

    def flush(self, path: str | Path | None = None, timeout: float = 120) -> dict[str, Any]:
        return client.flush(str(self.mountpoint), str(path or self.mountpoint), timeout=timeout)

    def umount(self, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``airfs umount`` (drains first); returns the completed process."""
        return subprocess.run(
            [*airfs_cmd(), "umount", *extra, str(self.mountpoint)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env or None,
        )

    def kill9(self) -> None:
        """Simulate a crash: SIGKILL the daemon, then clear the dead mount."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        _wait_gone(self.pid, 10)
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)

    def alive(self) -> bool:
        return _alive(self.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return True
        time.sleep(0.05)
    return False


def mount(
    origin: str | None,
    mountpoint: str | Path,
    cache_dir: str | Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> Mounted:
    """Run ``airfs mount``; raise ``RuntimeError`` with its stderr and the log if it fails.
    ``--fuse $AIRFS_TEST_FUSE`` is added when that variable is set (and ``args`` has none)."""
    cmd = [*airfs_cmd(), "mount", "--cache-dir", str(cache_dir), "--quiet"]
    if origin is not None:
        cmd += ["--origin", origin]
    transport = os.environ.get("AIRFS_TEST_FUSE")
    if transport and "--fuse" not in args:
        cmd += ["--fuse", transport]
    cmd += [*args, str(mountpoint)]
    full_env = {**os.environ, **(env or {})}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if p.returncode != 0:
        log = Path(cache_dir) / "airfs.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise RuntimeError(f"airfs mount failed ({p.returncode}): {p.stderr.strip()}\n{tail}")
    pid = int(client.status(str(mountpoint))["pid"])
    return Mounted(Path(mountpoint), Path(cache_dir), origin, pid, env or {}, args)


def teardown(m: Mounted, timeout: float = 20) -> None:
    """Unmount lazily, then stop the daemon by PID (SIGTERM, then SIGKILL)."""
    subprocess.run(["fusermount3", "-u", "-z", str(m.mountpoint)], capture_output=True)
    if _alive(m.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(m.pid, signal.SIGTERM)
        if not _wait_gone(m.pid, timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(m.pid, signal.SIGKILL)
            _wait_gone(m.pid, 5)


@contextlib.contextmanager
def mounted(
    origin: str | None,
    mountpoint: str | Path,
    cache_dir: str | Path,
    *args: str,
    env: dict[str, str] | None = None,
) -> Iterator[Mounted]:
    """A mount for the duration of the block, always torn down."""
    m = mount(origin, mountpoint, cache_dir, *args, env=env)
    try:
        yield m
    finally:
        teardown(m)
