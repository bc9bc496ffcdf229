"""Mount propagation as the DaemonSet sets it up: the plugin's mounts are made in a shared
subtree (``mountPropagation: Bidirectional``, the kubelet's pods directory), and a pod's
mount namespace, a slave of it (``HostToContainer``), sees a volume published after the pod's
namespace was made. Here: a tmp directory made a shared mount, a child in
``unshare -m --propagation slave``, and the plugin's NodePublishVolume in this namespace."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")

from csitest_util import Plugin, unmount_all_under  # noqa: E402

from airfs.csi import mounts  # noqa: E402

pytestmark = pytest.mark.mount

#: the child: says it is ready, waits for a line, then shows what it sees
CHILD = """
echo ready
read _
if cat "$1/pod/volumes/pv/mount/cat.jpg" 2>/dev/null; then echo; else echo MISSING; fi
grep -c " $1/pod/volumes/pv/mount " /proc/self/mountinfo || true
read _
"""


@pytest.fixture
def shared_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory that is a shared mount of its own (a peer group of one), unmounted after."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1)")
    d = tmp_path / "kubelet"
    d.mkdir()
    subprocess.run(["mount", "--bind", str(d), str(d)], check=True)
    try:
        subprocess.run(["mount", "--make-rshared", str(d)], check=True)
        yield d
    finally:
        unmount_all_under(d)
        mounts.unmount(str(d))


@contextlib.contextmanager
def _child(propagation: str, shared_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """The child shell in a new mount namespace with ``propagation``; killed if still there."""
    cmd = ["unshare", "-m", "--propagation", propagation, "sh", "-c", CHILD, "sh", str(shared_dir)]
    with subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as child:
        try:
            yield child
        finally:
            if child.poll() is None:
                child.kill()


def _shared(path: Path) -> bool:
    """Whether the mount on ``path`` is in a shared peer group (``shared:N`` in mountinfo)."""
    real = os.path.realpath(path)
    found = False
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            parts = line.split(" - ")[0].split()
            if parts[4] == real:
                found = any(p.startswith("shared:") for p in parts[6:])
    return found


def test_slave_namespace_sees_a_volume_published_after_it_started(
    plugin: Plugin, shared_dir: Path
) -> None:
    assert _shared(shared_dir)
    with _child("slave", shared_dir) as child:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"  # its namespace exists now
        target = shared_dir / "pod" / "volumes" / "pv" / "mount"
        target.parent.mkdir(parents=True)
        plugin.publish(str(target), readonly=True)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "meow" * 100
        assert child.stdout.readline().strip() == "1"  # one mount there, in its namespace
        # and unpublishing reaches it too
        plugin.unpublish(str(target))
        grep = ["grep", "-c", f" {target} ", "/proc/self/mountinfo"]
        seen = subprocess.run(
            ["nsenter", "-t", str(child.pid), "-m", *grep],
            capture_output=True,
            text=True,
        )
        assert seen.stdout.strip() == "0", seen
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0


def test_private_namespace_does_not_see_it(plugin: Plugin, shared_dir: Path) -> None:
    """The control: without propagation (``--propagation private``) the same publish stays
    invisible to the child, so the test above shows propagation, not a shared view."""
    with _child("private", shared_dir) as child:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        target = shared_dir / "pod" / "volumes" / "pv" / "mount"
        target.parent.mkdir(parents=True)
        plugin.publish(str(target), readonly=True)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "MISSING"
        assert child.stdout.readline().strip() == "0"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
