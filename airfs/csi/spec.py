"""The CSI protocol (``csi.proto``, vendored beside this module) as Python classes, compiled
when first asked for: :func:`protocol` runs ``grpc.protos_and_services`` (grpcio-tools' protoc,
in this process; about half a second) once per process. Nothing generated is written to disk or
kept in the repository.

The generated classes are untyped (``Any``); the servers in :mod:`airfs.csi.server` build
typed handlers around them with :func:`handler`, from the service descriptors, so no generated
servicer class is subclassed.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message_factory

#: the proto's name on the import path: the package root is put first on ``sys.path`` while it
#: is compiled (an editable install imports ``airfs`` through a finder, not a path entry)
PROTO = "airfs/csi/csi.proto"
_ROOT = str(Path(__file__).resolve().parents[2])
_lock = threading.Lock()


@dataclass(frozen=True)
class Protocol:
    """The compiled protocol: ``pb`` holds the message classes (``pb.NodePublishVolumeRequest``),
    ``grpc`` the generated stubs (``grpc.NodeStub``, used by clients and tests)."""

    pb: Any
    grpc: Any


@functools.cache
def protocol() -> Protocol:
    """The CSI messages and stubs, compiled on the first call (raises ``ImportError`` naming
    grpcio-tools when it is not installed)."""
    with _lock:
        # first on the path, so that no other copy of the proto is compiled in its place
        sys.path.insert(0, _ROOT)
        try:
            pb, services = grpc.protos_and_services(PROTO)
        except NotImplementedError as exc:  # grpc says so when grpc_tools is missing
            raise ImportError(f"the CSI plugin needs grpcio-tools: {exc}") from exc
        finally:
            sys.path.remove(_ROOT)  # the first occurrence: the one put there
    return Protocol(pb=pb, grpc=services)


#: a unary method's implementation: (request message, gRPC context) → response message
Method = Callable[[Any, grpc.ServicerContext], Any]


def handler(service: str, methods: dict[str, Method]) -> grpc.GenericRpcHandler:
    """A gRPC handler for the CSI ``service`` (``"Identity"``, ``"Node"``) serving ``methods``
    (by RPC name); the service's other RPCs answer ``UNIMPLEMENTED``, as the spec wants for
    what a plugin does not advertise. An unknown RPC name raises ``KeyError``."""
    desc = protocol().pb.DESCRIPTOR.services_by_name[service]
    table = {}
    for name, fn in methods.items():
        m = desc.methods_by_name[name]
        req = message_factory.GetMessageClass(m.input_type)
        resp = message_factory.GetMessageClass(m.output_type)
        table[name] = grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
        )
    return grpc.method_handlers_generic_handler(desc.full_name, table)
