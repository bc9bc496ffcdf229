"""The plugin's pure parts, without a mount: volume names, endpoints, the mount table parser."""

from __future__ import annotations

from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")

from airfs.csi.mounts import mount_table  # noqa: E402
from airfs.csi.node import CsiError, VolumeRef, volume_ref  # noqa: E402
from airfs.csi.server import socket_path  # noqa: E402


def test_volume_ref_from_attributes_or_handle() -> None:
    attrs = {"catalog": "main", "schema": "default", "volume": "images", "other": "x"}
    assert volume_ref("whatever", attrs) == VolumeRef("main", "default", "images")
    assert volume_ref("main.default.images", {}).relpath == "main/default/images"


@pytest.mark.parametrize(
    ("volume_id", "attrs", "reason"),
    [
        ("a.b", {}, "not CATALOG.SCHEMA.VOLUME"),
        ("a.b.c.d", {}, "not CATALOG.SCHEMA.VOLUME"),
        ("a..c", {}, "'schema' is empty"),
        ("v", {"catalog": "main", "schema": "default"}, "volume missing"),
        ("v", {"catalog": "main", "schema": "..", "volume": "x"}, "schema='..' is not a plain"),
        ("v", {"catalog": "m\0", "schema": "s", "volume": "x"}, "is not a plain name"),
        ("v", {"catalog": ".", "schema": "s", "volume": "x"}, "is not a plain name"),
    ],
)
def test_volume_ref_refusals(volume_id: str, attrs: dict[str, str], reason: str) -> None:
    with pytest.raises(CsiError) as exc:
        volume_ref(volume_id, attrs)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in exc.value.message


def test_socket_path() -> None:
    assert socket_path("unix:///csi/csi.sock") == "/csi/csi.sock"
    assert socket_path("unix:/csi/csi.sock") == "/csi/csi.sock"
    assert socket_path("/csi/csi.sock") == "/csi/csi.sock"
    for bad in ("tcp://1.2.3.4:5", "unix://csi.sock", "csi.sock"):
        with pytest.raises(ValueError):
            socket_path(bad)


def test_mount_table_parses_escapes_and_optional_fields(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "36 35 0:42 / /Volumes rw,nosuid,nodev shared:7 - fuse.airfs /data rw,user_id=0\n"
        "40 36 0:42 /main/default/my\\040images /pods/p\\040a/mount ro,nosuid master:7 - "
        "fuse.airfs /data rw\n"
    )
    node, bind = mount_table(str(info))
    assert (node.mountpoint, node.root, node.device, node.readonly) == (
        "/Volumes",
        "/",
        "0:42",
        False,
    )
    assert node.options == {"rw", "nosuid", "nodev"} and node.fstype == "fuse.airfs"
    assert bind.root == "/main/default/my images" and bind.mountpoint == "/pods/p a/mount"
    assert bind.readonly and bind.source == "/data"
