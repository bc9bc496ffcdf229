"""The node's airfs mount, run by the plugin: ``airfs mount --foreground`` as a child process
(its log goes to the plugin's stderr, the container's log), waited for until the mount answers,
watched while the plugin serves, and drained (``airfs umount``) when the plugin stops."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence


class NodeMount:
    """``airfs mount --foreground [mount_args] MOUNTPOINT`` in a child process."""

    def __init__(self, mountpoint: str, mount_args: Sequence[str]) -> None:
        self.mountpoint = mountpoint
        self.mount_args = list(mount_args)
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "airfs.cli",
            "mount",
            "--foreground",
            *self.mount_args,
            self.mountpoint,
        ]

    def start(
        self,
        ready: Callable[[], bool],
        timeout: float,
        *,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> str | None:
        """Start the daemon and wait until ``ready()`` (the mount answers); the reason it did
        not come up (it exited, ``cancelled()`` became true, or ``timeout`` seconds passed),
        or None. The daemon is in a session of its own: a terminal's ^C reaches the plugin,
        which decides when the mount drains."""
        os.makedirs(self.mountpoint, exist_ok=True)
        self.proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            problem = self.problem()
            if problem is not None:
                return problem
            if ready():
                return None
            if cancelled():
                return "stopped before the node's mount was ready"
            time.sleep(0.05)
        return f"the node's airfs mount on {self.mountpoint} was not ready within {timeout}s"

    def problem(self) -> str | None:
        """Why the mount is gone (its daemon exited), or None while it runs."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            return None
        return f"the node's airfs mount daemon exited with code {rc}"

    def stop(self, timeout: float) -> int | None:
        """``airfs umount`` (pending writes are committed first, within ``timeout``), then
        wait for the daemon; SIGTERM, then SIGKILL, if it does not exit. Its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run(
                    [sys.executable, "-m", "airfs.cli", "umount", "--quiet",
                     "--timeout", str(timeout), self.mountpoint],
                    timeout=timeout + 30,
                    check=False,
                )  # fmt: skip
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
