"""The plugin's process: the node's mount (started by it with ``--origin``), the gRPC server,
and the wait for SIGTERM or the mount's death; then the server stops and the mount is drained.

Upgrading the plugin restarts this process; with ``--origin`` that unmounts and remounts the
node's mount, which pods' binds do not survive (they see ENOTCONN until re-published). The
daemon handover (``airfs restart``) is what makes such an upgrade seamless.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from .node import NodeService
from .server import IdentityServer, NodeServer, socket_path, start_server
from .supervisor import NodeMount

log = logging.getLogger(__name__)

VERSION = "0.1.0"


def _say(msg: str) -> None:
    print(f"airfs csi: {msg}", file=sys.stderr, flush=True)


def serve(args: argparse.Namespace) -> int:
    """Run the plugin until SIGTERM/SIGINT (exit 0) or the node mount's death (exit 1). A
    signal while the mount is starting stops it and exits 0."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        socket_path(args.endpoint)
    except ValueError as exc:
        _say(str(exc))
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _serve(args, stop)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _serve(args: argparse.Namespace, stop: threading.Event) -> int:
    node = NodeService(args.mountpoint)
    mount = None
    if args.origin is not None:
        mount = NodeMount(args.mountpoint, ["--origin", args.origin, *args.mount_options])
        reason = mount.start(
            lambda: node.not_ready() is None, args.mount_timeout, cancelled=stop.is_set
        )
        if reason is not None:
            mount.stop(args.drain_timeout)
            _say(reason)
            return 0 if stop.is_set() else 1
        _say(f"mounted {args.origin} on {args.mountpoint}")
    identity = IdentityServer(
        name=args.driver_name,
        version=VERSION,
        not_ready=node.not_ready,
        problem=mount.problem if mount is not None else lambda: None,
    )
    try:
        server = start_server(
            args.endpoint, identity.handler(), NodeServer(node, args.node_id).handler()
        )
    except (OSError, ValueError) as exc:
        _say(f"cannot serve on {args.endpoint}: {exc}")
        if mount is not None:
            mount.stop(args.drain_timeout)
        return 1
    _say(f"serving {args.driver_name} on {args.endpoint} (node {args.node_id})")
    code = 0
    try:
        while not stop.wait(0.5):
            problem = mount.problem() if mount is not None else None
            if problem is not None:
                _say(problem)
                code = 1
                break
    finally:
        server.stop(grace=5).wait()
        if mount is not None:
            rc = mount.stop(args.drain_timeout)
            if code == 0 and rc not in (0, None):
                _say(f"the node's airfs mount daemon exited with code {rc}")
                code = 1
    _say("stopped")
    return code
