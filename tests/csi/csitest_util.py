"""Helpers of the CSI plugin's tests: the plugin's services served in this process on a Unix
socket and a kubelet's view of them (:class:`Plugin`), and the clean-up of bind mounts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from airfs.csi import mounts
from airfs.csi.node import NodeService
from airfs.csi.server import IdentityServer, NodeServer, start_server
from airfs.csi.spec import protocol


def unmount_all_under(root: Path) -> None:
    """Unmount every mount under ``root``, deepest (latest) first."""
    real = os.path.realpath(root)
    for _ in range(64):
        below = [e for e in mounts.mount_table() if e.mountpoint.startswith(real + "/")]
        if not below:
            return
        mounts.unmount(below[-1].mountpoint)


@dataclass
class Plugin:
    """The plugin's services, in this process, and a kubelet's view of them."""

    node: NodeService
    identity_stub: Any
    node_stub: Any
    pb: Any
    pods: Path
    mountpoint: Path
    origin: Path

    def cap(self, *, mode: int = 1, block: bool = False, **mount: Any) -> Any:
        """A VolumeCapability: filesystem (``mount`` fields) or block, with access ``mode``."""
        vc = self.pb.VolumeCapability
        access = vc.AccessMode(mode=mode)
        if block:
            return vc(block=vc.BlockVolume(), access_mode=access)
        return vc(mount=vc.MountVolume(**mount), access_mode=access)

    def target(self, name: str = "pod-a") -> str:
        """A pod's target path (its parent exists, as the kubelet makes it)."""
        parent = self.pods / name / "volumes" / "kubernetes.io~csi" / "pv"
        parent.mkdir(parents=True, exist_ok=True)
        return str(parent / "mount")

    def publish(
        self,
        target: str,
        volume: str = "images",
        *,
        readonly: bool = False,
        cap: Any = None,
        volume_id: str | None = None,
        attrs: dict[str, str] | None = None,
    ) -> Any:
        if attrs is None:
            attrs = {"catalog": "main", "schema": "default", "volume": volume}
        req = self.pb.NodePublishVolumeRequest(
            volume_id=f"main.default.{volume}" if volume_id is None else volume_id,
            target_path=target,
            volume_capability=self.cap() if cap is None else cap,
            readonly=readonly,
            volume_context=attrs,
        )
        return self.node_stub.NodePublishVolume(req, timeout=30)

    def unpublish(self, target: str, volume_id: str = "main.default.images") -> Any:
        req = self.pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target)
        return self.node_stub.NodeUnpublishVolume(req, timeout=30)


def serve_plugin(node: NodeService, sock: Path, **identity: Any) -> tuple[Any, Any, Any]:
    """(server, channel, protocol) for ``node`` on the socket ``sock``."""
    ident = IdentityServer(
        name=identity.get("name", "csi.airfs.io"),
        version="0.1.0",
        not_ready=node.not_ready,
        problem=identity.get("problem", lambda: None),
    )
    server = start_server(f"unix://{sock}", ident.handler(), NodeServer(node, "node-1").handler())
    channel = grpc.insecure_channel(f"unix://{sock}")
    return server, channel, protocol()
