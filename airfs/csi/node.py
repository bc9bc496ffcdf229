"""What the CSI Node service does, without gRPC: a volume's request checked field by field, its
directory under the node's airfs mount found, and that directory bind-mounted on (or removed
from) the pod's target path. Every refusal is a :class:`CsiError` carrying the spec's gRPC code
(``INVALID_ARGUMENT`` for a missing or malformed field or a block volume, ``NOT_FOUND`` for a
volume that does not exist, ``ALREADY_EXISTS`` for a target published with other options,
``UNAVAILABLE`` while the node's mount is not up).

The published state lives in the kernel's mount table, not in this process: a publish is
recognised by the bind on the target (same device as the node's mount, same root
``/<catalog>/<schema>/<volume>``, same read-only flag), so a restarted plugin answers the
kubelet's retries exactly as the first one would.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass

import grpc

from . import mounts

#: access modes (``VolumeCapability.AccessMode.Mode``) that publish read-only
READER_ONLY_MODES = frozenset({2, 3})  # SINGLE_NODE_READER_ONLY, MULTI_NODE_READER_ONLY
#: the modes defined by the spec (1.12: 1-5, and the alpha 6-7); 0 is UNKNOWN
KNOWN_MODES = frozenset(range(1, 8))
#: ``fsType`` values accepted (Kubernetes passes the PV's ``csi.fsType``, usually empty)
FS_TYPES = frozenset({"", "fuse.airfs", "airfs"})
#: mount flags accepted (a PV's ``mountOptions``); anything else is refused, not ignored
MOUNT_FLAGS = frozenset({"ro", "rw"})
#: the volume attributes (a PV's ``csi.volumeAttributes``) naming the volume
ATTRIBUTES = ("catalog", "schema", "volume")
AIRFS_FSTYPE = "fuse.airfs"


class CsiError(Exception):
    """A refused or failed request: ``code`` is the gRPC status the spec names for it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class VolumeRef:
    """``/Volumes/<catalog>/<schema>/<volume>``: three plain names (no ``/``, not ``.``/``..``,
    no NUL, not empty)."""

    catalog: str
    schema: str
    volume: str

    @property
    def relpath(self) -> str:
        return f"{self.catalog}/{self.schema}/{self.volume}"


def _name(kind: str, value: str) -> str:
    if not value:
        raise _invalid(f"volume attribute {kind!r} is empty")
    if value in (".", "..") or "/" in value or "\0" in value:
        raise _invalid(f"volume attribute {kind}={value!r} is not a plain name")
    return value


def volume_ref(volume_id: str, attributes: dict[str, str]) -> VolumeRef:
    """The volume a request names: its ``catalog``/``schema``/``volume`` attributes, or,
    when it has none of them, a ``volume_id`` of the form ``catalog.schema.volume``."""
    given = [k for k in ATTRIBUTES if k in attributes]
    if given:
        missing = [k for k in ATTRIBUTES if k not in attributes]
        if missing:
            raise _invalid(f"volume attributes {', '.join(missing)} missing (give all three)")
        return VolumeRef(*(_name(k, attributes[k]) for k in ATTRIBUTES))
    parts = volume_id.split(".")
    if len(parts) != 3:
        raise _invalid(
            f"volume {volume_id!r}: no catalog/schema/volume attributes, and the id is not "
            "CATALOG.SCHEMA.VOLUME"
        )
    return VolumeRef(*(_name(k, v) for k, v in zip(ATTRIBUTES, parts, strict=True)))


@dataclass(frozen=True)
class PublishRequest:
    """A NodePublishVolume request's fields, unpacked from the protocol."""

    volume_id: str
    target_path: str
    #: False when no volume_capability was sent
    has_capability: bool
    block: bool
    access_mode: int
    fs_type: str
    mount_flags: tuple[str, ...]
    readonly: bool
    attributes: dict[str, str]


@dataclass(frozen=True)
class VolumeStats:
    """NodeGetVolumeStats' answer: bytes and inodes of the filesystem behind a published path."""

    bytes_total: int
    bytes_available: int
    bytes_used: int
    inodes_total: int
    inodes_free: int
    inodes_used: int


@dataclass(frozen=True)
class NodeStatistics:
    """Counts since the plugin started."""

    publishes: int
    unpublishes: int
    refusals: int


def _target(path: str) -> str:
    if not path:
        raise _invalid("target_path is required")
    if not os.path.isabs(path) or "\0" in path:
        raise _invalid(f"target_path {path!r} is not an absolute path")
    return os.path.normpath(path)


class NodeService:
    """Publishes volumes of the airfs mount on ``mountpoint`` (which must be a mount of type
    ``fstype``; ``None`` accepts any mountpoint, for tools that mount another way). Calls are
    serialised: the kubelet retries concurrently, and a check-then-mount must not interleave."""

    def __init__(self, mountpoint: str, *, fstype: str | None = AIRFS_FSTYPE) -> None:
        self.mountpoint = os.path.realpath(mountpoint)
        self.fstype = fstype
        self._lock = threading.Lock()
        self._publishes = 0
        self._unpublishes = 0
        self._refusals = 0

    def statistics(self) -> NodeStatistics:
        return NodeStatistics(self._publishes, self._unpublishes, self._refusals)

    def node_mount(self) -> mounts.MountEntry | None:
        """The node's mount when it is up and answering, else None."""
        entry = mounts.mount_at(self.mountpoint)
        if entry is None or (self.fstype is not None and entry.fstype != self.fstype):
            return None
        try:
            os.statvfs(self.mountpoint)
        except OSError:
            return None
        return entry

    def not_ready(self) -> str | None:
        """Why volumes cannot be published now, or None."""
        if self.node_mount() is None:
            return f"the node's airfs mount on {self.mountpoint} is not up"
        return None

    def publish(self, req: PublishRequest) -> None:
        """Bind the volume's directory on ``req.target_path`` (created if missing), read-only
        when ``req.readonly``, a read-only access mode or an ``ro`` mount flag asks for it.
        Publishing again what is already there is OK (idempotent)."""
        try:
            with self._lock:
                self._publish(req)
                self._publishes += 1
        except CsiError:
            with self._lock:
                self._refusals += 1
            raise

    def _publish(self, req: PublishRequest) -> None:
        if not req.volume_id:
            raise _invalid("volume_id is required")
        target = _target(req.target_path)
        if not req.has_capability:
            raise _invalid("volume_capability is required")
        if req.block:
            raise _invalid("airfs volumes are filesystems: block access is not supported")
        if req.access_mode not in KNOWN_MODES:
            raise _invalid(f"access mode {req.access_mode} is not supported")
        if req.fs_type not in FS_TYPES:
            raise _invalid(f"fs_type {req.fs_type!r}: airfs volumes are fuse.airfs")
        bad = [f for f in req.mount_flags if f not in MOUNT_FLAGS]
        if bad:
            raise _invalid(f"mount flags not supported: {', '.join(bad)} (only ro, rw)")
        ref = volume_ref(req.volume_id, req.attributes)
        readonly = req.readonly or req.access_mode in READER_ONLY_MODES or "ro" in req.mount_flags
        node = self.node_mount()
        if node is None:
            raise CsiError(grpc.StatusCode.UNAVAILABLE, f"{self.not_ready()}; retry later")
        # the volume's directory, opened name by name without following a symlink (one at
        # the origin could point anywhere on the node, / included), and bound through that
        # fd: what is checked is what is mounted
        try:
            fd = mounts.open_beneath(self.mountpoint, ref.relpath.split("/"))
        except FileNotFoundError:
            raise CsiError(
                grpc.StatusCode.NOT_FOUND, f"volume {ref.relpath} does not exist on the mount"
            ) from None
        except NotADirectoryError:
            raise CsiError(
                grpc.StatusCode.NOT_FOUND,
                f"volume {ref.relpath} is not a directory (a file or a symbolic link)",
            ) from None
        except PermissionError:
            raise CsiError(
                grpc.StatusCode.PERMISSION_DENIED, f"volume {ref.relpath}: permission denied"
            ) from None
        except OSError as exc:
            raise CsiError(grpc.StatusCode.INTERNAL, f"volume {ref.relpath}: {exc}") from None
        try:
            self._bind(fd, target, ref, node, readonly)
        finally:
            os.close(fd)

    def _bind(
        self, fd: int, target: str, ref: VolumeRef, node: mounts.MountEntry, readonly: bool
    ) -> None:
        """Bind the directory open as ``fd`` on ``target``, or check what is there."""
        current = mounts.mount_at(target)
        root = "/" + ref.relpath if node.root == "/" else f"{node.root}/{ref.relpath}"
        if current is not None and self._dead_bind(current, node, root):
            # the same volume from a node mount that is gone (its daemon died or the plugin
            # restarted with a new one): replaced by a bind of the live mount
            try:
                mounts.unmount(target)
            except OSError as exc:
                raise CsiError(
                    grpc.StatusCode.INTERNAL, f"unmount the dead bind on {target}: {exc.strerror}"
                ) from None
            current = mounts.mount_at(target)
        if current is not None:
            if current.device != node.device or current.root != root:
                raise CsiError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"{target} already has another mount ({current.source} {current.root})",
                )
            if current.readonly != readonly:
                raise CsiError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"volume {ref.relpath} is already published on {target} "
                    f"{'read-only' if current.readonly else 'read-write'}",
                )
            return
        try:
            os.makedirs(target, exist_ok=True)
        except OSError as exc:
            raise CsiError(grpc.StatusCode.INTERNAL, f"cannot create {target}: {exc}") from None
        try:
            mounts.bind(f"/proc/self/fd/{fd}", target, readonly=readonly)
        except OSError as exc:
            raise CsiError(
                grpc.StatusCode.INTERNAL, f"bind {ref.relpath} on {target}: {exc.strerror}"
            ) from None

    @staticmethod
    def _dead_bind(current: mounts.MountEntry, node: mounts.MountEntry, root: str) -> bool:
        """Whether ``current`` is a bind of the volume ``root`` from another airfs mount
        that no longer answers (ENOTCONN/ECONNABORTED)."""
        if current.device == node.device or current.fstype != node.fstype:
            return False
        if current.root != root:
            return False
        try:
            os.statvfs(current.mountpoint)
        except OSError as exc:
            return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        return False

    def unpublish(self, volume_id: str, target_path: str) -> None:
        """Unmount what :meth:`publish` mounted on ``target_path`` and remove the directory
        (only when empty: what is under a target that is not a mount is not ours). A target
        that is not published, or gone, is OK."""
        if not volume_id:
            self._refusals += 1
            raise _invalid("volume_id is required")
        try:
            target = _target(target_path)
        except CsiError:
            self._refusals += 1
            raise
        with self._lock:
            for _ in range(16):  # a target published twice by hand has two mounts stacked
                if mounts.mount_at(target) is None:
                    break
                try:
                    mounts.unmount(target)
                except OSError as exc:
                    raise CsiError(
                        grpc.StatusCode.INTERNAL, f"unmount {target}: {exc.strerror}"
                    ) from None
            try:
                os.rmdir(target)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.ENOTDIR):
                    raise CsiError(
                        grpc.StatusCode.INTERNAL, f"remove {target}: {exc.strerror}"
                    ) from None
            self._unpublishes += 1

    def volume_stats(self, volume_id: str, volume_path: str) -> VolumeStats:
        """Space and inodes behind a published ``volume_path`` (``NOT_FOUND`` when it is not
        a mount of this node's airfs mount)."""
        if not volume_id:
            raise _invalid("volume_id is required")
        if not volume_path:
            raise _invalid("volume_path is required")
        path = os.path.normpath(volume_path)
        node = self.node_mount()
        entry = mounts.mount_at(path)
        if entry is None or node is None or entry.device != node.device:
            raise CsiError(
                grpc.StatusCode.NOT_FOUND, f"{volume_path} is not a published airfs volume"
            )
        try:
            s = os.statvfs(path)
        except OSError as exc:
            raise CsiError(grpc.StatusCode.INTERNAL, f"statfs {path}: {exc.strerror}") from None
        total, free = s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize
        return VolumeStats(
            bytes_total=total,
            bytes_available=free,
            bytes_used=max(0, total - s.f_bfree * s.f_frsize),
            inodes_total=s.f_files,
            inodes_free=s.f_ffree,
            inodes_used=max(0, s.f_files - s.f_ffree),
        )
