"""``airfs csi serve``: the Kubernetes CSI node plugin (Identity and Node services on a Unix
socket), with the node's airfs mount run by it (``--origin``) or made by something else.

Only argparse is imported here: every ``airfs`` command builds the whole parser, and the
plugin's dependencies (the ``csi`` extra: grpcio, grpcio-tools) are imported when it serves.
Exit codes: 0 stopped by SIGTERM/SIGINT (the mount drained and unmounted); 1 could not start,
or the node's mount daemon died (the container restarts, and the next mount replays the
journal); 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from airfs.cli.options import positive_seconds


def _shell_words(text: str) -> list[str]:
    """``--mount-options``: a shell-quoted string split into arguments."""
    import shlex  # here: every airfs command builds this parser, and few serve

    try:
        return shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def register(sub: Any) -> None:
    """Add ``csi`` (with ``serve``) to the ``airfs`` subcommands ``sub``."""
    c = sub.add_parser(
        "csi",
        help="Kubernetes CSI node plugin",
        description="The Container Storage Interface node plugin that publishes "
        "/Volumes/CATALOG/SCHEMA/VOLUME into pods (see mount/kubernetes/).",
    )
    cs = c.add_subparsers(dest="csi_cmd", required=True, metavar="COMMAND")
    s = cs.add_parser(
        "serve",
        help="serve the CSI Identity and Node services",
        description="Serve CSI's Identity and Node services on a Unix socket for the "
        "kubelet. NodePublishVolume bind-mounts the volume named by the PersistentVolume's "
        "attributes catalog, schema and volume (or a volume handle CATALOG.SCHEMA.VOLUME) "
        "from the node's airfs mount onto the pod's target path, read-only when asked. With "
        "--origin the plugin runs that mount itself (airfs mount --foreground) and drains "
        "and unmounts it when stopped; without, it serves an airfs mount made otherwise and "
        "reports not ready until it is there. Exit 0 when stopped by SIGTERM; 1 if it cannot "
        "start or the mount's daemon dies.",
    )
    s.add_argument(
        "--endpoint",
        default=os.environ.get("CSI_ENDPOINT", "unix:///csi/csi.sock"),
        metavar="unix:///PATH",
        help="the socket to listen on (default $CSI_ENDPOINT, else unix:///csi/csi.sock)",
    )
    s.add_argument(
        "--node-id",
        default=os.environ.get("NODE_ID") or socket.gethostname(),
        metavar="NAME",
        help="this node's id in NodeGetInfo (default $NODE_ID, else the host name)",
    )
    s.add_argument(
        "--mountpoint",
        default="/Volumes",
        metavar="DIR",
        help="the node's airfs mount (default /Volumes)",
    )
    s.add_argument(
        "--driver-name",
        default="csi.airfs.io",
        metavar="NAME",
        help="the name in GetPluginInfo: the CSIDriver's (default csi.airfs.io)",
    )
    s.add_argument(
        "--origin",
        metavar="DIR|s3://BUCKET[/PREFIX]",
        help="run the node's mount of this origin (default: use a mount made otherwise)",
    )
    s.add_argument(
        "--mount-options",
        type=_shell_words,
        default=[],
        metavar="'OPTIONS'",
        help="with --origin: more airfs mount options, as one shell-quoted string "
        "(--mount-options='--cache-dir /cache --cache-size 50G')",
    )
    s.add_argument(
        "--mount-timeout",
        type=positive_seconds,
        default=120.0,
        metavar="SECONDS",
        help="with --origin: how long to wait for the mount (default 120)",
    )
    s.add_argument(
        "--drain-timeout",
        type=positive_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="with --origin: how long stopping waits for pending writes (default 3600)",
    )
    s.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """``airfs csi serve``; returns the exit code."""
    from .serve import serve  # grpc, only when serving

    return serve(args)
