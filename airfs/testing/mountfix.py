"""Real mounts for tests and benchmarks: start ``airfs mount`` in a subprocess, wait for it,
and always tear it down (``fusermount3 -u -z``, then stop the daemon by its PID).

Teardown also judges the daemon, as s3ql's test plugin and pyfuse3's ``umount`` do: it raises
:class:`DaemonProblem` (an ``AssertionError``, so the test fails) when the daemon did not log a
clean exit (``daemon exits with code 0``) or when its log, from this mount's start, has an
``ERROR``/``CRITICAL`` line or a traceback. A test that provokes errors on purpose declares
them: ``m.expect_errors(r"origin .* unreachable", exit_codes={0, 3})``; a daemon killed on
purpose (:meth:`Mounted.kill9`) is not asked for an exit line.

Skips are the caller's business: :func:`fuse_available` says whether ``/dev/fuse`` and
``fusermount3`` are there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airfs.control import client

MOUNT_TYPE = "fuse.airfs"
#: how long one ``fusermount3`` call may take (a wedged mount must not hang the suite)
FUSERMOUNT_TIMEOUT = 30.0

_EXIT_LINE = re.compile(r"daemon exits with code (-?\d+)")
_BAD_LINE = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) |^Traceback|^\s*\+ Exception Group Traceback")


class DaemonProblem(AssertionError):
    """The daemon of a test mount exited badly or logged an unexpected error."""


def fusermount_unmount(mountpoint: str | Path) -> subprocess.CompletedProcess[str] | None:
    """``fusermount3 -u -z MOUNTPOINT`` with a timeout; None if it timed out."""
    try:
        return subprocess.run(
            ["fusermount3", "-u", "-z", str(mountpoint)],
            capture_output=True,
            text=True,
            timeout=FUSERMOUNT_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return None


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


def is_mounted(mountpoint: str | Path) -> bool:
    mp = os.path.realpath(mountpoint)
    with open("/proc/self/mounts", encoding="utf-8") as f:
        return any(
            len(p) > 2 and p[1].encode().decode("unicode_escape") == mp
            for p in (line.split() for line in f)
        )


def mount_from(work: str | Path) -> None:
    """Start every later mount of this process from ``work``, importing the airfs this
    process imported: ``python -m`` puts the current directory first on ``sys.path``, so a
    mount started from a checkout's root imports that checkout whatever ``PYTHONPATH`` says
    (a benchmark comparing two trees then measures one twice). ``PYTHONPATH`` is made
    absolute, this airfs's checkout first; a mount given its own ``PYTHONPATH`` (another
    tree) imports that tree."""
    import airfs

    here = str(Path(airfs.__file__).resolve().parents[1])
    old = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    given = [str(Path(p).resolve()) for p in old if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *given])
    os.chdir(work)


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
    #: size of the log when this mount started: only what comes after is this daemon's
    log_offset: int = 0
    #: regular expressions of log lines (ERROR, tracebacks) this test provokes on purpose
    expected_errors: list[str] = field(default_factory=list)
    #: exit codes accepted from the daemon
    exit_codes: set[int] = field(default_factory=lambda: {0})
    #: killed on purpose (no exit line to expect)
    killed: bool = False
    #: size of the log when this daemon was gone: later mounts on the cache dir append there
    log_end: int | None = None

    def expect_errors(self, *patterns: str, exit_codes: Iterable[int] | None = None) -> None:
        """Declare log lines (regular expressions, searched in each ERROR line or traceback
        line) and, optionally, exit codes that teardown must accept."""
        self.expected_errors.extend(patterns)
        if exit_codes is not None:
            self.exit_codes = set(exit_codes)

    @property
    def log(self) -> Path:
        return self.cache_dir / "airfs.log"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def own_log(self) -> str:
        """What this mount's daemon logged (from its start until it was gone)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.log_offset)
                n = -1 if self.log_end is None else max(0, self.log_end - self.log_offset)
                return f.read(n).decode(errors="replace")
        except OSError:
            return ""

    def _daemon_gone(self) -> None:
        if self.log_end is None:
            try:
                self.log_end = self.log.stat().st_size
            except OSError:
                self.log_end = self.log_offset

    def problems(self) -> list[str]:
        """Why this (stopped) daemon's run was not clean; empty when it was."""
        text = self.own_log()
        out: list[str] = []
        codes = [int(c) for c in _EXIT_LINE.findall(text)]
        if not self.killed:
            if not codes:
                out.append("the daemon logged no exit (crashed or was killed)")
            elif codes[-1] not in self.exit_codes:
                out.append(f"the daemon exited with code {codes[-1]}")
        expected = [re.compile(p) for p in self.expected_errors]
        lines = text.splitlines()
        bad = []
        for i, line in enumerate(lines):
            if not _BAD_LINE.search(line):
                continue
            # a traceback is judged with the lines around it (the exception is at its end)
            context = "\n".join(lines[max(0, i - 1) : i + 40]) if "Traceback" in line else line
            if not any(p.search(context) for p in expected):
                bad.append(line.strip())
        out += [f"unexpected in the daemon log: {line}" for line in bad[:5]]
        if len(bad) > 5:
            out.append(f"... and {len(bad) - 5} more such lines")
        return out

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

    def kill9(self, *, clear_mount: bool = True) -> None:
        """Simulate a crash: SIGKILL the daemon, then (unless not ``clear_mount``: a test of
        what the next mount does with a dead one) clear the dead mount."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        _wait_gone(self.pid, 10)
        self._daemon_gone()
        if clear_mount:
            fusermount_unmount(self.mountpoint)

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
    log = Path(cache_dir) / "airfs.log"
    try:
        offset = log.stat().st_size
    except FileNotFoundError:
        offset = 0
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if p.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise RuntimeError(f"airfs mount failed ({p.returncode}): {p.stderr.strip()}\n{tail}")
    pid = int(client.status(str(mountpoint))["pid"])
    return Mounted(Path(mountpoint), Path(cache_dir), origin, pid, env or {}, args, offset)


def teardown(m: Mounted, timeout: float = 20, *, check: bool = True) -> None:
    """Unmount lazily; the daemon then drains and exits by itself: wait ``timeout`` seconds
    for that, then stop it by PID (SIGTERM, and SIGKILL 10 s later). Then, with ``check``,
    raise :class:`DaemonProblem` if the daemon had to be killed, exited with a code not in
    ``m.exit_codes`` or logged an error not declared with :meth:`Mounted.expect_errors` (the
    mount is gone either way).

    (A SIGTERM sent at once would land while the daemon is already shutting down, after its
    signal handlers are gone, and kill it before it has written its cache index.)"""
    problems = []
    if fusermount_unmount(m.mountpoint) is None:
        problems.append(f"fusermount3 -u -z {m.mountpoint} took over {FUSERMOUNT_TIMEOUT}s")
    if not _wait_gone(m.pid, timeout):
        with contextlib.suppress(ProcessLookupError):
            os.kill(m.pid, signal.SIGTERM)
        if not _wait_gone(m.pid, 10):
            with contextlib.suppress(ProcessLookupError):
                os.kill(m.pid, signal.SIGKILL)
            _wait_gone(m.pid, 5)
            if not m.killed:
                problems.append(f"the daemon did not exit within {timeout + 10}s of unmount")
                m.killed = True
    m._daemon_gone()
    if check:
        problems += m.problems()
        if problems:
            raise DaemonProblem(
                f"mount {m.mountpoint} (pid {m.pid}): " + "; ".join(problems)
                + f"\n--- daemon log ({m.log}) ---\n" + m.own_log()[-6000:]
            )  # fmt: skip


def teardown_all(ms: Iterable[Mounted], timeout: float = 20) -> None:
    """:func:`teardown` every mount (all of them, even when one has a problem), then raise one
    :class:`DaemonProblem` naming every problem found."""
    problems = []
    for m in ms:
        try:
            teardown(m, timeout)
        except DaemonProblem as exc:
            problems.append(str(exc))
    if problems:
        raise DaemonProblem("\n\n".join(problems))


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
    except BaseException:
        teardown(m, check=False)  # the test's own failure is the one to report
        raise
    teardown(m)
