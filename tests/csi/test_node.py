"""The CSI Identity and Node services driven the way the kubelet drives them, over gRPC on a
Unix socket, against a real airfs mount: publish (real bind mounts, read-write and read-only),
idempotency, unpublish, stats, and refusals by the spec's codes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")

from csitest_util import Plugin, serve_plugin  # noqa: E402

from airfs.csi import mounts  # noqa: E402
from airfs.csi.node import NodeService, PublishRequest  # noqa: E402
from airfs.testing.mountfix import mount, teardown  # noqa: E402

pytestmark = pytest.mark.mount


def _entries(target: str) -> list[mounts.MountEntry]:
    return [e for e in mounts.mount_table() if e.mountpoint == target]


def _code(exc: pytest.ExceptionInfo[BaseException]) -> object:
    err = exc.value
    assert isinstance(err, grpc.RpcError)
    return err.code()  # type: ignore[attr-defined]


def _details(exc: pytest.ExceptionInfo[BaseException]) -> str:
    return str(exc.value.details())  # type: ignore[attr-defined]


def test_identity(plugin: Plugin) -> None:
    pb = plugin.pb
    info = plugin.identity_stub.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=10)
    assert (info.name, info.vendor_version) == ("csi.airfs.io", "0.1.0")
    caps = plugin.identity_stub.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest())
    assert list(caps.capabilities) == []  # no Controller service: static volumes
    probe = plugin.identity_stub.Probe(pb.ProbeRequest(), timeout=10)
    assert probe.HasField("ready") and probe.ready.value is True


def test_node_info_and_capabilities(plugin: Plugin) -> None:
    pb = plugin.pb
    info = plugin.node_stub.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=10)
    assert info.node_id == "node-1" and info.max_volumes_per_node == 0
    caps = plugin.node_stub.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest(), timeout=10)
    types = [c.rpc.type for c in caps.capabilities]
    assert types == [pb.NodeServiceCapability.RPC.GET_VOLUME_STATS]
    # not advertised, so not served: the spec's UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as exc:
        plugin.node_stub.NodeStageVolume(
            pb.NodeStageVolumeRequest(volume_id="v", staging_target_path="/x"), timeout=10
        )
    assert _code(exc) == grpc.StatusCode.UNIMPLEMENTED


def test_publish_read_write(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.publish(target)
    (entry,) = _entries(target)
    node = mounts.mount_at(str(plugin.mountpoint))
    assert node is not None
    want = (node.device, "/main/default/images", False)
    assert (entry.device, entry.root, entry.readonly) == want
    assert Path(target, "cat.jpg").read_bytes() == b"meow" * 100
    Path(target, "new.txt").write_bytes(b"from the pod")
    # the pod's write is the mount's: same file under /Volumes, and at the origin once flushed
    assert (plugin.mountpoint / "main/default/images/new.txt").read_bytes() == b"from the pod"
    plugin.unpublish(target)
    assert _entries(target) == [] and not os.path.exists(target)


def test_publish_on_a_target_with_odd_characters(plugin: Plugin) -> None:
    """mountinfo escapes spaces and backslashes: the publish must still recognise its bind."""
    target = plugin.target("pod with space\\x")
    plugin.publish(target, readonly=True)
    plugin.publish(target, readonly=True)  # idempotent: the escaped entry was recognised
    (entry,) = _entries(target)
    assert entry.root == "/main/default/images" and entry.readonly
    plugin.unpublish(target)
    assert _entries(target) == [] and not os.path.exists(target)


def test_publish_read_only(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.publish(target, readonly=True)
    (entry,) = _entries(target)
    assert entry.readonly and entry.root == "/main/default/images"
    assert Path(target, "cat.jpg").read_bytes() == b"meow" * 100
    with pytest.raises(OSError) as exc:
        Path(target, "nope.txt").write_bytes(b"x")
    assert exc.value.errno == errno.EROFS
    # only the bind is read-only: the node's mount still takes writes
    node = mounts.mount_at(str(plugin.mountpoint))
    assert node is not None and not node.readonly
    (plugin.mountpoint / "main/default/images/rw.txt").write_bytes(b"ok")
    assert Path(target, "rw.txt").read_bytes() == b"ok"


@pytest.mark.parametrize("how", ["reader-only mode", "ro mount flag"])
def test_publish_read_only_by_capability(plugin: Plugin, how: str) -> None:
    target = plugin.target()
    cap = plugin.cap(mode=3) if how == "reader-only mode" else plugin.cap(mount_flags=["ro"])
    plugin.publish(target, cap=cap)
    (entry,) = _entries(target)
    assert entry.readonly


def test_publish_is_idempotent(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.publish(target, readonly=True)
    plugin.publish(target, readonly=True)  # the kubelet's retry: OK, and no second mount
    assert len(_entries(target)) == 1
    # a restarted plugin (a new service, state only in the mount table) says the same
    again = NodeService(str(plugin.mountpoint))
    again.publish(
        PublishRequest(
            volume_id="main.default.images",
            target_path=target,
            has_capability=True,
            block=False,
            access_mode=1,
            fs_type="",
            mount_flags=(),
            readonly=True,
            attributes={},
        )
    )
    assert len(_entries(target)) == 1


def test_publish_conflicts_are_already_exists(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.publish(target, readonly=True)
    with pytest.raises(grpc.RpcError) as exc:
        plugin.publish(target, readonly=False)
    assert _code(exc) == grpc.StatusCode.ALREADY_EXISTS
    assert "read-only" in _details(exc)
    with pytest.raises(grpc.RpcError) as exc:
        plugin.publish(target, "models", readonly=True)
    assert _code(exc) == grpc.StatusCode.ALREADY_EXISTS
    assert "another mount" in _details(exc)
    (entry,) = _entries(target)  # the first publish is untouched
    assert entry.readonly and entry.root == "/main/default/images"


def test_volume_id_names_the_volume_without_attributes(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.publish(target, volume_id="main.default.models", attrs={})
    (entry,) = _entries(target)
    assert entry.root == "/main/default/models"


def test_unpublish(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.unpublish(target)  # never published (and absent): OK
    os.mkdir(target)
    plugin.unpublish(target)  # an empty directory, not a mount: OK, removed
    assert not os.path.exists(target)
    plugin.publish(target)
    plugin.unpublish(target)
    plugin.unpublish(target)  # again: OK
    assert _entries(target) == [] and not os.path.exists(target)
    # a non-empty directory that is not a mount is not ours: OK, and left as it is
    os.mkdir(target)
    Path(target, "keep").write_bytes(b"k")
    plugin.unpublish(target)
    assert Path(target, "keep").read_bytes() == b"k"
    # the volume's files were never touched by any of it
    assert (plugin.mountpoint / "main/default/images/cat.jpg").read_bytes() == b"meow" * 100


def test_unpublish_busy_target_is_detached(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.publish(target)
    fd = os.open(os.path.join(target, "cat.jpg"), os.O_RDONLY)
    try:
        plugin.unpublish(target)
        assert _entries(target) == []
        assert os.pread(fd, 4, 0) == b"meow"  # the open file keeps working
    finally:
        os.close(fd)


def test_volume_stats(plugin: Plugin) -> None:
    pb = plugin.pb
    target = plugin.target()
    plugin.publish(target)
    req = pb.NodeGetVolumeStatsRequest(volume_id="main.default.images", volume_path=target)
    stats = plugin.node_stub.NodeGetVolumeStats(req, timeout=10)
    by_unit = {u.unit: u for u in stats.usage}
    want = os.statvfs(target)
    assert by_unit[pb.VolumeUsage.BYTES].total == want.f_blocks * want.f_frsize
    assert by_unit[pb.VolumeUsage.INODES].total == want.f_files
    other = plugin.target("pod-b")
    os.mkdir(other)
    req = pb.NodeGetVolumeStatsRequest(volume_id="main.default.images", volume_path=other)
    with pytest.raises(grpc.RpcError) as exc:
        plugin.node_stub.NodeGetVolumeStats(req, timeout=10)
    assert _code(exc) == grpc.StatusCode.NOT_FOUND


BAD = {
    "no volume_id": ({"volume_id": ""}, "INVALID_ARGUMENT", "volume_id is required"),
    "no target": ({"target": ""}, "INVALID_ARGUMENT", "target_path is required"),
    "relative target": ({"target": "pods/x"}, "INVALID_ARGUMENT", "not an absolute path"),
    "no capability": ({"cap": "none"}, "INVALID_ARGUMENT", "volume_capability is required"),
    "block": ({"cap": "block"}, "INVALID_ARGUMENT", "block access is not supported"),
    "unknown mode": ({"cap": "mode0"}, "INVALID_ARGUMENT", "access mode 0"),
    "fs type": ({"cap": "ext4"}, "INVALID_ARGUMENT", "fs_type 'ext4'"),
    "mount flag": ({"cap": "noatime"}, "INVALID_ARGUMENT", "noatime"),
    "dot-dot": ({"volume": ".."}, "INVALID_ARGUMENT", "not a plain name"),
    "slash": ({"volume": "images/../../x"}, "INVALID_ARGUMENT", "not a plain name"),
    "empty name": ({"volume": ""}, "INVALID_ARGUMENT", "'volume' is empty"),
    "partial attrs": ({"attrs": {"catalog": "main"}}, "INVALID_ARGUMENT", "schema, volume"),
    "bad id": ({"attrs": {}, "volume_id": "images"}, "INVALID_ARGUMENT", "CATALOG.SCHEMA"),
    "missing volume": ({"volume": "nope"}, "NOT_FOUND", "main/default/nope does not exist"),
    "file, not volume": ({"volume": "notavolume"}, "NOT_FOUND", "is not a directory"),
    "symlink volume": ({"volume": "evil"}, "NOT_FOUND", "a file or a symbolic link"),
    "symlink schema": (
        {"attrs": {"catalog": "main", "schema": "linked", "volume": "images"}},
        "NOT_FOUND",
        "main/linked/images is not a directory",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_publish_requests(plugin: Plugin, case: str) -> None:
    change, code, reason = BAD[case]
    target = plugin.target()
    caps = {
        "none": None,
        "block": plugin.cap(block=True),
        "mode0": plugin.cap(mode=0),
        "ext4": plugin.cap(fs_type="ext4"),
        "noatime": plugin.cap(mount_flags=["noatime"]),
    }
    req = plugin.pb.NodePublishVolumeRequest(
        volume_id=change.get("volume_id", "main.default.images"),
        target_path=change.get("target", target),
        readonly=False,
        volume_context=change.get(
            "attrs",
            {"catalog": "main", "schema": "default", "volume": change.get("volume", "images")},
        ),
    )
    if change.get("cap") != "none":
        req.volume_capability.CopyFrom(caps.get(change.get("cap", "")) or plugin.cap())
    with pytest.raises(grpc.RpcError) as exc:
        plugin.node_stub.NodePublishVolume(req, timeout=10)
    assert _code(exc) == getattr(grpc.StatusCode, code)
    assert reason in _details(exc)
    assert not os.path.exists(target)  # nothing made, nothing mounted
    assert plugin.node.statistics().refusals == 1


@pytest.mark.parametrize("field", ["volume_id", "target_path"])
def test_bad_unpublish_requests(plugin: Plugin, field: str) -> None:
    fields = {"volume_id": "main.default.images", "target_path": plugin.target(), field: ""}
    with pytest.raises(grpc.RpcError) as exc:
        plugin.node_stub.NodeUnpublishVolume(
            plugin.pb.NodeUnpublishVolumeRequest(**fields), timeout=10
        )
    assert _code(exc) == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{field} is required" in _details(exc)


def test_not_ready_without_the_node_mount(tmp_path: Path) -> None:
    """A plugin whose node mount is not there: Probe says not ready, publish UNAVAILABLE."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    (tmp_path / "Volumes/main/default/images").mkdir(parents=True)  # a plain directory
    node = NodeService(str(tmp_path / "Volumes"))
    server, channel, proto = serve_plugin(node, tmp_path / "csi.sock")
    try:
        ident, stub, pb = proto.grpc.IdentityStub(channel), proto.grpc.NodeStub(channel), proto.pb
        assert ident.Probe(pb.ProbeRequest(), timeout=10).ready.value is False
        vc = pb.VolumeCapability
        req = pb.NodePublishVolumeRequest(
            volume_id="main.default.images",
            target_path=str(tmp_path / "t"),
            volume_capability=vc(mount=vc.MountVolume(), access_mode=vc.AccessMode(mode=1)),
        )
        with pytest.raises(grpc.RpcError) as exc:
            stub.NodePublishVolume(req, timeout=10)
        assert _code(exc) == grpc.StatusCode.UNAVAILABLE
        assert "is not up" in _details(exc)
        assert not (tmp_path / "t").exists()
    finally:
        channel.close()
        server.stop(grace=None).wait()


def test_publish_replaces_a_dead_bind_of_the_volume(plugin: Plugin, tmp_path: Path) -> None:
    """A target still bound to the volume of a node mount that died (the plugin restarted
    with a new mount, the kubelet retries the publish): the dead bind is replaced by one of
    the live mount, not refused."""
    origin = tmp_path / "origin2"
    (origin / "main" / "default" / "images").mkdir(parents=True)
    (tmp_path / "mnt2").mkdir()
    other = mount(str(origin), tmp_path / "mnt2", tmp_path / "cache2")
    try:
        target = plugin.target()
        os.mkdir(target)
        mounts.bind(str(tmp_path / "mnt2/main/default/images"), target, readonly=False)
        other.kill9()  # its daemon dies; the bind on the target stays, dead
        with pytest.raises(OSError) as exc:
            os.statvfs(target)
        assert exc.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        plugin.publish(target)
        (entry,) = _entries(target)
        node = mounts.mount_at(str(plugin.mountpoint))
        assert node is not None and entry.device == node.device
        assert Path(target, "cat.jpg").read_bytes() == b"meow" * 100
    finally:
        teardown(other)
