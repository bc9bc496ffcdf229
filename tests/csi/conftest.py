"""Fixtures of the CSI plugin's tests: one real airfs mount for the module (an origin with two
volumes, ``main/default/images`` and ``main/default/models``), and the plugin's gRPC services on
a Unix socket in this process with the clients a kubelet would hold. Every bind mount left
under the test's directory is unmounted in teardown."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc")
pytest.importorskip("grpc_tools")

from csitest_util import Plugin, serve_plugin, unmount_all_under

from airfs.csi.node import NodeService
from airfs.testing.mountfix import Mounted, fuse_available, mounted


@pytest.fixture(scope="module")
def node_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")
    base = tmp_path_factory.mktemp("csi-node")
    origin = base / "origin"
    for vol in ("images", "models"):
        (origin / "main" / "default" / vol).mkdir(parents=True)
    (origin / "main" / "default" / "images" / "cat.jpg").write_bytes(b"meow" * 100)
    (origin / "main" / "default" / "notavolume").write_bytes(b"x")
    # symbolic links at the origin: to the node's root, and a schema reached through one
    (origin / "main" / "default" / "evil").symlink_to("/")
    (origin / "main" / "linked").symlink_to("default")
    (base / "mnt").mkdir()
    with mounted(str(origin), base / "mnt", base / "cache") as m:
        yield m


@pytest.fixture
def plugin(node_mount: Mounted, tmp_path: Path) -> Iterator[Plugin]:
    node = NodeService(str(node_mount.mountpoint))
    server, channel, proto = serve_plugin(node, tmp_path / "csi" / "csi.sock")
    pods = tmp_path / "pods"
    pods.mkdir()
    try:
        yield Plugin(
            node=node,
            identity_stub=proto.grpc.IdentityStub(channel),
            node_stub=proto.grpc.NodeStub(channel),
            pb=proto.pb,
            pods=pods,
            mountpoint=node_mount.mountpoint,
            origin=Path(str(node_mount.origin)),
        )
    finally:
        channel.close()
        server.stop(grace=None).wait()
        unmount_all_under(tmp_path)
