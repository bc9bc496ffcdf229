"""``airfs csi serve`` as the DaemonSet runs it: a process that mounts the origin itself
(``--origin``), serves the kubelet on its socket, and on SIGTERM stops serving, drains and
unmounts (exit 0); one whose mount daemon dies exits 1 (the container restarts); bad
arguments are refused with their reason."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from airfs.control import client  # noqa: E402
from airfs.csi.spec import protocol  # noqa: E402
from airfs.testing.mountfix import airfs_cmd, fuse_available, fusermount_unmount, is_mounted  # noqa: E402

pytestmark = pytest.mark.mount


class Serve:
    def __init__(self, tmp: Path, *extra: str, mount_options: str = "") -> None:
        self.tmp = tmp
        self.sock = tmp / "csi" / "csi.sock"
        self.mnt = tmp / "Volumes"
        self.origin = tmp / "origin"
        (self.origin / "main" / "default" / "images").mkdir(parents=True, exist_ok=True)
        (self.origin / "main" / "default" / "images" / "a.txt").write_text("A")
        self.cmd = [
            *airfs_cmd(),
            "csi",
            "serve",
            "--endpoint",
            f"unix://{self.sock}",
            "--node-id",
            "node-7",
            "--mountpoint",
            str(self.mnt),
            "--origin",
            str(self.origin),
            f"--mount-options=--cache-dir {tmp / 'cache'} --cache-size 64M {mount_options}",
            *extra,
        ]
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def wait_serving(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _, err = self.proc.communicate()
                raise AssertionError(f"airfs csi serve exited {self.proc.returncode}: {err}")
            if self.sock.exists():
                return
            time.sleep(0.05)
        raise AssertionError("airfs csi serve did not listen in time")

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, err

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        if is_mounted(self.mnt):
            fusermount_unmount(self.mnt)


def publish(serve: Serve, node: Any) -> Path:
    """Publish ``main.default.images`` read-write into a pod's target, as the kubelet does."""
    pb = protocol().pb
    target = serve.tmp / "pods" / "p" / "mount"
    target.parent.mkdir(parents=True)
    vc = pb.VolumeCapability
    node.NodePublishVolume(
        pb.NodePublishVolumeRequest(
            volume_id="main.default.images",
            target_path=str(target),
            volume_capability=vc(mount=vc.MountVolume(), access_mode=vc.AccessMode(mode=5)),
        ),
        timeout=30,
    )
    return target


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    if not fuse_available() or os.geteuid() != 0:
        pytest.skip("needs /dev/fuse, fusermount3 and root")
    s = Serve(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()


def test_serve_mounts_publishes_and_drains_on_sigterm(serve: Serve) -> None:
    serve.wait_serving()
    assert is_mounted(serve.mnt)
    proto = protocol()
    pb = proto.pb
    with grpc.insecure_channel(f"unix://{serve.sock}") as ch:
        ident, node = proto.grpc.IdentityStub(ch), proto.grpc.NodeStub(ch)
        assert ident.Probe(pb.ProbeRequest(), timeout=10).ready.value is True
        assert node.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=10).node_id == "node-7"
        target = publish(serve, node)
        (target / "b.txt").write_text("B")  # a pod's write, pending in the node's mount
        node.NodeUnpublishVolume(
            pb.NodeUnpublishVolumeRequest(volume_id="main.default.images", target_path=str(target)),
            timeout=30,
        )
    code, err = serve.stop()
    assert code == 0, err
    assert "Traceback" not in err and " ERROR " not in err, err
    assert not is_mounted(serve.mnt)
    # drained: the pod's write is at the origin
    assert (serve.origin / "main/default/images/b.txt").read_text() == "B"
    assert not serve.sock.exists() or not is_mounted(serve.mnt)


def test_serve_exits_1_when_the_mount_daemon_dies(serve: Serve) -> None:
    serve.wait_serving()
    pid = int(client.status(str(serve.mnt))["pid"])
    os.kill(pid, signal.SIGKILL)
    _, err = serve.proc.communicate(timeout=60)
    assert serve.proc.returncode == 1, err
    assert "the node's airfs mount daemon exited with code -9" in err


def test_a_restartable_node_mount_survives_its_daemon(tmp_path: Path) -> None:
    """The DaemonSet's mount is ``--restartable``: when its daemon dies, the holder's next
    daemon takes the mount over; a pod's open file in its published volume reads on, the
    plugin keeps serving (Probe ready) and still drains on SIGTERM."""
    if not fuse_available() or os.geteuid() != 0:
        pytest.skip("needs /dev/fuse, fusermount3 and root")
    serve = Serve(tmp_path, mount_options="--restartable")
    try:
        serve.wait_serving()
        proto = protocol()
        pb = proto.pb
        with grpc.insecure_channel(f"unix://{serve.sock}") as ch:
            ident, node = proto.grpc.IdentityStub(ch), proto.grpc.NodeStub(ch)
            target = publish(serve, node)
            with open(target / "a.txt", "rb", buffering=0) as f:
                old = int(client.status(str(serve.mnt))["pid"])
                os.kill(old, signal.SIGKILL)
                deadline = time.monotonic() + 60
                pid = old
                while pid == old and time.monotonic() < deadline:
                    time.sleep(0.05)
                    with contextlib.suppress(Exception):
                        pid = int(client.status(str(serve.mnt))["pid"])
                assert pid != old, "no daemon took the mount over"
                assert os.pread(f.fileno(), 10, 0) == b"A"  # the pod's open file reads on
            assert (target / "a.txt").read_text() == "A"
            assert ident.Probe(pb.ProbeRequest(), timeout=10).ready.value is True
            assert serve.proc.poll() is None, "the plugin exited"
            node.NodeUnpublishVolume(
                pb.NodeUnpublishVolumeRequest(
                    volume_id="main.default.images", target_path=str(target)
                ),
                timeout=30,
            )
        code, err = serve.stop()
        assert code == 0, err
        assert "died (code -9): taking over" in err
        assert "Traceback" not in err and " ERROR " not in err, err
        assert not is_mounted(serve.mnt)
    finally:
        serve.cleanup()


def test_serve_refuses_a_missing_origin(tmp_path: Path) -> None:
    if not fuse_available() or os.geteuid() != 0:
        pytest.skip("needs /dev/fuse, fusermount3 and root")
    cmd = [
        *airfs_cmd(), "csi", "serve", "--endpoint", f"unix://{tmp_path}/csi.sock",
        "--mountpoint", str(tmp_path / "Volumes"), "--origin", str(tmp_path / "nope"),
        "--mount-timeout", "30",
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert f"origin {tmp_path / 'nope'} does not exist" in p.stderr
    assert not (tmp_path / "csi.sock").exists()


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--endpoint", "tcp://0.0.0.0:9000"], "only unix:// sockets are served"),
        (["--endpoint", "unix://relative.sock"], "the socket path must be absolute"),
    ],
)
def test_serve_refuses_bad_endpoints(tmp_path: Path, args: list[str], reason: str) -> None:
    cmd = [*airfs_cmd(), "csi", "serve", "--mountpoint", str(tmp_path), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and reason in p.stderr, p.stderr


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--mount-timeout", "-1"], "--mount-timeout"),
        (["--mount-options=--cache-dir '/x"], "No closing quotation"),
    ],
)
def test_serve_refuses_bad_usage(args: list[str], reason: str) -> None:
    cmd = [*airfs_cmd(), "csi", "serve", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and reason in p.stderr, p.stderr
