"""The CSI Identity and Node services over gRPC: each RPC unpacks its request, calls
:class:`~airfs.csi.node.NodeService` and packs the answer; a :class:`~airfs.csi.node.CsiError`
becomes the gRPC status it names. No state here.

What is advertised (the spec's capabilities): no plugin capability (no Controller service: the
volumes exist in the catalog, and Kubernetes uses them as static PersistentVolumes); the Node
capability ``GET_VOLUME_STATS`` only (no ``STAGE_UNSTAGE_VOLUME``: there is nothing to stage
per volume, the node's mount serves them all; NodeStageVolume and NodeUnstageVolume answer
``UNIMPLEMENTED``, as do the Controller's RPCs).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from concurrent import futures
from typing import Any, NoReturn

import grpc
from google.protobuf import wrappers_pb2

from .node import CsiError, NodeService, PublishRequest
from .spec import Method, handler, protocol

log = logging.getLogger(__name__)

#: the driver name (the CSIDriver object's name, the PersistentVolumes' ``csi.driver``)
DRIVER_NAME = "csi.airfs.io"
#: the Node capability enum's GET_VOLUME_STATS
GET_VOLUME_STATS = 2


def _abort(context: grpc.ServicerContext, exc: CsiError) -> NoReturn:
    context.abort(exc.code, exc.message)
    raise AssertionError("unreachable: abort raises")


def _guarded(name: str, fn: Method) -> Method:
    """``fn`` with its :class:`CsiError` turned into the gRPC status it names (logged as a
    warning: the kubelet retries, and the reason belongs in the plugin's log too)."""

    def run(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(request, context)
        except CsiError as exc:
            log.warning("%s refused: %s (%s)", name, exc.message, exc.code.name)
            _abort(context, exc)

    return run


class IdentityServer:
    """GetPluginInfo, GetPluginCapabilities, Probe. ``problem`` says why the plugin is
    broken (the node's mount daemon died: Probe then fails, so the kubelet's liveness probe
    restarts the container), ``not_ready`` why it is not ready yet (Probe: ``ready=false``)."""

    def __init__(
        self,
        *,
        name: str,
        version: str,
        not_ready: Callable[[], str | None],
        problem: Callable[[], str | None],
    ) -> None:
        self.name, self.version = name, version
        self.not_ready, self.problem = not_ready, problem

    def GetPluginInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return protocol().pb.GetPluginInfoResponse(name=self.name, vendor_version=self.version)

    def GetPluginCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        return protocol().pb.GetPluginCapabilitiesResponse()

    def Probe(self, request: Any, context: grpc.ServicerContext) -> Any:
        problem = self.problem()
        if problem is not None:
            _abort(context, CsiError(grpc.StatusCode.FAILED_PRECONDITION, problem))
        ready = self.not_ready() is None
        return protocol().pb.ProbeResponse(ready=wrappers_pb2.BoolValue(value=ready))

    def handler(self) -> grpc.GenericRpcHandler:
        return handler(
            "Identity",
            {
                "GetPluginInfo": self.GetPluginInfo,
                "GetPluginCapabilities": self.GetPluginCapabilities,
                "Probe": self.Probe,
            },
        )


class NodeServer:
    """NodePublishVolume, NodeUnpublishVolume, NodeGetVolumeStats, NodeGetCapabilities,
    NodeGetInfo over ``node``, for the node ``node_id``."""

    def __init__(self, node: NodeService, node_id: str) -> None:
        self.node, self.node_id = node, node_id

    def NodePublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        cap = request.volume_capability
        has_cap = request.HasField("volume_capability")
        self.node.publish(
            PublishRequest(
                volume_id=request.volume_id,
                target_path=request.target_path,
                has_capability=has_cap,
                block=has_cap and cap.WhichOneof("access_type") == "block",
                access_mode=int(cap.access_mode.mode),
                fs_type=str(cap.mount.fs_type),
                mount_flags=tuple(str(f) for f in cap.mount.mount_flags),
                readonly=bool(request.readonly),
                attributes={str(k): str(v) for k, v in request.volume_context.items()},
            )
        )
        log.info("published %s on %s", request.volume_id, request.target_path)
        return protocol().pb.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.node.unpublish(request.volume_id, request.target_path)
        log.info("unpublished %s from %s", request.volume_id, request.target_path)
        return protocol().pb.NodeUnpublishVolumeResponse()

    def NodeGetVolumeStats(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb = protocol().pb
        s = self.node.volume_stats(request.volume_id, request.volume_path)
        usage = [
            pb.VolumeUsage(
                unit=pb.VolumeUsage.BYTES,
                total=s.bytes_total,
                available=s.bytes_available,
                used=s.bytes_used,
            ),
            pb.VolumeUsage(
                unit=pb.VolumeUsage.INODES,
                total=s.inodes_total,
                available=s.inodes_free,
                used=s.inodes_used,
            ),
        ]
        return pb.NodeGetVolumeStatsResponse(usage=usage)

    def NodeGetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb = protocol().pb
        cap = pb.NodeServiceCapability(rpc=pb.NodeServiceCapability.RPC(type=GET_VOLUME_STATS))
        return pb.NodeGetCapabilitiesResponse(capabilities=[cap])

    def NodeGetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        # max_volumes_per_node 0: no limit (binds cost nothing); no topology (every node
        # reaches the same origin)
        return protocol().pb.NodeGetInfoResponse(node_id=self.node_id)

    def handler(self) -> grpc.GenericRpcHandler:
        methods: dict[str, Method] = {
            "NodePublishVolume": self.NodePublishVolume,
            "NodeUnpublishVolume": self.NodeUnpublishVolume,
            "NodeGetVolumeStats": self.NodeGetVolumeStats,
            "NodeGetCapabilities": self.NodeGetCapabilities,
            "NodeGetInfo": self.NodeGetInfo,
        }
        return handler("Node", {k: _guarded(k, v) for k, v in methods.items()})


def socket_path(endpoint: str) -> str:
    """The Unix socket of an endpoint ``unix:///csi/csi.sock``, ``unix:/csi/csi.sock`` or
    ``/csi/csi.sock`` (``ValueError`` for anything else: CSI plugins listen on Unix sockets)."""
    path = endpoint
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://") :]
    elif endpoint.startswith("unix:"):
        path = endpoint[len("unix:") :]
    elif "://" in endpoint:
        raise ValueError(f"endpoint {endpoint!r}: only unix:// sockets are served")
    if not path.startswith("/"):
        raise ValueError(f"endpoint {endpoint!r}: the socket path must be absolute")
    return path


def start_server(endpoint: str, *handlers: grpc.GenericRpcHandler) -> grpc.Server:
    """A started gRPC server on ``endpoint``'s Unix socket, serving ``handlers``. A socket
    file left by a previous run is removed first (the spec asks plugins to); any other file
    there is a ``FileExistsError``."""
    path = socket_path(endpoint)
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
        else:
            raise FileExistsError(f"{path} exists and is not a socket")
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(handlers)
    if server.add_insecure_port(f"unix:{path}") == 0:
        raise OSError(f"cannot listen on {path}")
    server.start()
    return server
