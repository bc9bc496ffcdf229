"""The two ways requests reach the core, behind one small interface the daemon drives:
``mount()`` (before the loop: touches the mountpoint), ``await main()`` (serve until
unmounted or terminated), ``terminate()``, ``close()`` (unmount), ``statistics()``.

* ``kernel``: :mod:`airfs.fuse.kernel` (the FUSE protocol spoken directly on /dev/fuse);
* ``pyfuse3``: :class:`airfs.fuse.ops.FuseOps` over libfuse (the fallback).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from airfs.core.fs import Filesystem
from airfs.fuse import TRANSPORTS

if TYPE_CHECKING:
    from airfs.fuse.kernel.handover import TakenOver
    from airfs.fuse.kernel.session import SessionStats
    from airfs.fuse.kernel.takeover import KernelState, StateLog, TakeoverRefused

__all__ = [
    "TRANSPORTS",
    "Pyfuse3Stats",
    "Transport",
    "TransportError",
    "TransportOptions",
    "TransportStats",
    "make_transport",
]

log = logging.getLogger(__name__)


class TransportError(Exception):
    """Mounting failed (one-line reason)."""


class TransportStats(Protocol):
    """A transport's statistics record (frozen), shown flat by ``airfs status --json``
    under ``fuse``; its ``transport`` key names the transport."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Pyfuse3Stats:
    """``Pyfuse3Transport.statistics()``: libfuse counts nothing for us."""

    def to_dict(self) -> dict[str, Any]:
        return {"transport": "pyfuse3"}


class Transport(Protocol):
    def mount(self, mountpoint: str) -> None: ...
    async def main(self) -> None: ...
    def terminate(self) -> None: ...
    def close(self) -> None: ...
    def statistics(self) -> TransportStats: ...


@dataclass(frozen=True)
class TransportOptions:
    """What every transport is given besides the core: the mount's name in /proc/mounts,
    ``allow_other``, verbose protocol logging, and the callback for the kernel's INIT."""

    fsname: str
    allow_other: bool
    debug: bool
    on_init: Callable[[], None]
    #: kernel transport: pass local bytes through where the kernel and privileges allow
    passthrough: bool = True
    #: kernel transport: record what the kernel holds in this cache dir, so that another
    #: daemon can take the connection over (None: not recorded)
    state_dir: str | None = None
    #: kernel transport, with passthrough: drop the page cache behind sequential readers
    drop_behind: bool = True


class GoneRequestReplies(logging.Filter):
    """libfuse logs ``fuse_<op>(): fuse_reply_* failed with No such file or directory`` as an
    error when the kernel no longer waits for a reply: the request was interrupted, or it
    was an asynchronous RELEASE/RELEASEDIR answered while the file system was being
    unmounted. Nothing is lost (the kernel transport ignores ENOENT on a reply for the same
    reason): the line is kept at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if (
            record.levelno >= logging.ERROR
            and "fuse_reply_" in msg
            and msg.endswith("No such file or directory")
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


class Pyfuse3Transport:
    """libfuse through pyfuse3 (options as libfuse spells them)."""

    def __init__(self, fs: Filesystem, ttl: float, opts: TransportOptions) -> None:
        from airfs.fuse.ops import FuseOps

        gone = logging.getLogger("pyfuse3")
        if not any(isinstance(f, GoneRequestReplies) for f in gone.filters):
            gone.addFilter(GoneRequestReplies())

        self.ops = FuseOps(fs, ttl, on_init=opts.on_init)
        self.options = {
            "fsname=" + opts.fsname,
            "subtype=airfs",
            "default_permissions",
            "noatime",
        }
        if opts.allow_other:
            self.options.add("allow_other")
        if opts.debug:
            self.options.add("debug")
        self.mounted = False

    def mount(self, mountpoint: str) -> None:
        import pyfuse3

        try:
            pyfuse3.init(self.ops, mountpoint, self.options)
        except RuntimeError as exc:
            raise TransportError(f"cannot mount on {mountpoint}: {exc}") from None
        self.mounted = True

    async def main(self) -> None:
        import pyfuse3

        await pyfuse3.main()

    def terminate(self) -> None:
        import pyfuse3

        pyfuse3.terminate()

    def close(self) -> None:
        import pyfuse3

        if self.mounted:
            self.mounted = False
            with contextlib.suppress(Exception):
                pyfuse3.close(unmount=True)

    def statistics(self) -> Pyfuse3Stats:
        return Pyfuse3Stats()


class KernelTransport:
    """The kernel protocol on /dev/fuse (mount(2) as root, fusermount3 otherwise). The
    session is made at :meth:`mount`, complete with the device it serves."""

    def __init__(self, fs: Filesystem, ttl: float, opts: TransportOptions) -> None:
        from airfs.fuse.kernel import mount as kmount
        from airfs.fuse.kernel.negotiate import max_pages_limit
        from airfs.fuse.kernel.session import Session

        self._kmount = kmount
        self.fs = fs
        self.fsname = opts.fsname
        self.allow_other = opts.allow_other
        self.mountpoint: str | None = None
        self.fd: int | None = None
        #: close() leaves the file system mounted (another daemon takes the connection over)
        self.keep_mount = False
        self.session: Session | None = None
        self.state: StateLog | None = None
        if opts.state_dir is not None:
            from airfs.fuse.kernel.takeover import StateLog

            self.state = StateLog(opts.state_dir)
            fs.inodes.log = self.state
        self._session_on = functools.partial(
            Session,
            fs=fs,
            ttl=ttl,
            on_init=lambda _neg: opts.on_init(),
            pages_limit=max_pages_limit(),
            passthrough=opts.passthrough and kmount.has_cap_sys_admin(),
            state=self.state,
            drop_behind=opts.drop_behind,
        )
        if opts.debug:
            logging.getLogger("airfs.fuse.kernel").setLevel(logging.DEBUG)

    def mount(self, mountpoint: str) -> None:
        try:
            self.fd = self._kmount.mount(
                mountpoint, fsname=self.fsname, allow_other=self.allow_other
            )
        except (self._kmount.MountFailed, OSError) as exc:
            raise TransportError(f"cannot mount on {mountpoint}: {exc}") from None
        self.mountpoint = mountpoint
        self.session = self._session_on(self.fd)

    async def take_over(
        self,
        fd: int,
        mountpoint: str,
        cache_dir: str,
        saved: KernelState | TakeoverRefused | None = None,
    ) -> TakenOver:
        """Serve the live connection ``fd`` (mounted on ``mountpoint``) that a previous
        daemon served, from the state it left in ``cache_dir`` (``saved``: that state, or
        why it cannot be used, read already); instead of :meth:`mount`. Raises
        :class:`~airfs.fuse.kernel.takeover.TakeoverRefused` (one line) when it cannot: the
        caller then clears the mount and mounts again."""
        from airfs.fuse.kernel.handover import read_state, take_over
        from airfs.fuse.kernel.takeover import StateLog, TakeoverRefused

        if isinstance(saved, TakeoverRefused):
            raise saved
        state = read_state(cache_dir) if saved is None else saved
        if self.state is None:
            self.state = StateLog(cache_dir)
            self._session_on.keywords["state"] = self.state
        self.fd = fd
        self.mountpoint = mountpoint
        self.session = self._session_on(fd)
        return await take_over(self.session, self.fs, state, self.state)

    def abandon(self, fd: int, mountpoint: str) -> None:
        """Give up a connection that cannot be taken over: unmount it (lazily: its users
        get errors once the holder closes its descriptor) and close ``fd``."""
        self.session = None
        self.fd, self.mountpoint, self.keep_mount = fd, mountpoint, False
        self.close()

    async def retire(self, grace: float) -> int:
        """Stop reading requests, let those being served finish (at most ``grace`` s);
        :meth:`close` then leaves the mount in place for the next daemon. Returns how many
        requests were left unanswered (the next daemon has the kernel resend them)."""
        self.keep_mount = True
        if self.session is None:
            return 0
        return await self.session.retire(grace)

    async def main(self) -> None:
        if self.session is None:
            raise TransportError("the kernel transport serves nothing before mount()")
        await self.session.run()

    def terminate(self) -> None:
        if self.session is not None:
            self.session.stop()

    def close(self) -> None:
        if self.state is not None:
            with contextlib.suppress(OSError):
                self.state.close()
        if self.mountpoint is not None and not self.keep_mount:
            mp, self.mountpoint = self.mountpoint, None
            try:
                self._kmount.unmount(mp)
            except self._kmount.MountFailed as exc:
                log.error("%s", exc)
        if self.fd is not None:
            fd, self.fd = self.fd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def statistics(self) -> SessionStats:
        if self.session is not None:
            return self.session.statistics()
        from airfs.fuse.kernel.session import SessionStats

        return SessionStats.before_mount(self.fs.passthrough.statistics())


def make_transport(kind: str, fs: Filesystem, ttl: float, opts: TransportOptions) -> Transport:
    """Build the transport named ``kind`` (one of :data:`TRANSPORTS`)."""
    if kind == "kernel":
        return KernelTransport(fs, ttl, opts)
    if kind == "pyfuse3":
        return Pyfuse3Transport(fs, ttl, opts)
    raise TransportError(f"unknown FUSE transport {kind!r} (use kernel or pyfuse3)")
