"""Where a mount's control socket lives, and how messages are framed.

Framing: the client sends one JSON object on one line, ``{"op": NAME, ...args}``. The server
answers with zero or more progress lines ``{"progress": {...}}`` and then exactly one final
line: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": MESSAGE, "errno": N}``.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

MOUNT_TYPE = "fuse.airfs"


def runtime_dir() -> str:
    """Directory holding control sockets: ``/run/airfs`` for root, else under
    ``$XDG_RUNTIME_DIR`` (or ``/tmp/airfs-UID``)."""
    if os.geteuid() == 0:
        return "/run/airfs"
    base = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(base, "airfs") if base else f"/tmp/airfs-{os.geteuid()}"


def socket_path(mountpoint: str) -> str:
    """The control socket of the mount at ``mountpoint`` (any spelling of the path)."""
    key = hashlib.sha256(os.path.realpath(mountpoint).encode()).hexdigest()[:20]
    return os.path.join(runtime_dir(), f"{key}.sock")


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("control message is not a JSON object")
    return obj
