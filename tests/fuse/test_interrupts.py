"""Signals and interrupted requests through a real mount.

The kernel sends FUSE_INTERRUPT for a request whose caller got any signal while it waited;
what the daemon answers is what the caller's system call returns. A caller that handles the
signal (torch's DataLoader handles SIGCHLD) must get its result, never EINTR; a caller being
killed is let go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airfs.testing.fixtures import Volume

# the rule is the transport's, not the origin's: one origin is enough
pytestmark = [pytest.mark.mount, pytest.mark.parametrize("origin_spec", ["posix"], indirect=True)]

_LISTER = """
import os, signal, sys
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
print("ready", flush=True)
for _ in range(int(sys.argv[2])):
    names = sorted(e.name for e in os.scandir(sys.argv[1]))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # none while it exits
print(len(got), ",".join(names), flush=True)
"""


def _start(root: Path, rounds: int) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", _LISTER, str(root / "d"), str(rounds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_a_handled_signal_gets_the_result_and_a_killed_caller_is_let_go(make_volume) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--emulate-latency", "0.3")  # every listing waits for the origin
    (v.root / "d").mkdir()
    for i in range(3):
        (v.root / "d" / f"f{i}").write_bytes(b"x")
    p = _start(v.root, 3)
    while p.poll() is None:  # signals while its opendirs wait for the origin
        os.kill(p.pid, signal.SIGUSR1)
        time.sleep(0.05)
    out, _ = p.communicate()
    assert p.returncode == 0, "the listing failed (EINTR?)"
    got, names = out.split()
    assert names == "f0,f1,f2" and int(got) > 0
    kernel = "interrupts" in v.m.status()["fuse"]
    if kernel:
        fuse = v.m.status()["fuse"]
        assert fuse["interrupts_ignored"] > 0 and fuse["interrupts"] == 0
    # killed inside a listing that waits for the origin: let go, and the mount goes on
    p = _start(v.root, 1000)
    time.sleep(0.2)
    p.kill()
    assert p.wait(timeout=30) == -signal.SIGKILL
    assert p.stdout is not None
    p.stdout.close()
    if kernel:
        after = v.m.status()["fuse"]
        assert after["interrupts"] + after["interrupts_ignored"] > fuse["interrupts_ignored"]
        assert after["interrupts_ignored"] == fuse["interrupts_ignored"]  # none while dying
    assert sorted(os.listdir(v.root / "d")) == ["f0", "f1", "f2"]
