#!/usr/bin/env python3
"""A bare, read-only pyfuse3 pass-through filesystem: the baseline "what FUSE in Python costs".

    .venv/bin/python scripts/bench/passthrough.py SOURCE_DIR MOUNTPOINT [--ttl 1.0]

Serves ``SOURCE_DIR`` on ``MOUNTPOINT`` with the least work per request: lookups and attributes
from ``os.lstat``, one ``os.open`` per FUSE open, ``os.pread`` on that fd straight into the reply
(on the event loop, no threads), ``keep_cache`` on every open (repeat reads stay in the kernel's
page cache) and the mount's ``read_ahead_kb`` raised to 1024, as airfs does
(``airfs.daemon.process.raise_read_ahead``), so that the kernel sends 1 MiB read requests. Entry and
attribute timeouts are ``--ttl`` (airfs's default is 1 s). Runs in the foreground until
unmounted (``fusermount3 -u``) or SIGTERM/SIGINT. Benchmarks only.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys

import pyfuse3
import trio

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
from airfs.daemon.process import raise_read_ahead


class Passthrough(pyfuse3.Operations):
    def __init__(self, root: str, ttl: float) -> None:
        super().__init__()
        self.root = os.path.realpath(root)
        self.ttl = ttl
        self.paths: dict[int, str] = {pyfuse3.ROOT_INODE: self.root}
        self.inodes: dict[str, int] = {self.root: pyfuse3.ROOT_INODE}
        self.next_ino = pyfuse3.ROOT_INODE + 1
        self.fds: dict[int, int] = {}

    def _ino(self, path: str) -> int:
        ino = self.inodes.get(path)
        if ino is None:
            ino = self.inodes[path] = self.next_ino
            self.paths[ino] = path
            self.next_ino += 1
        return ino

    def _attr(self, path: str, ino: int) -> pyfuse3.EntryAttributes:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = st.st_mode
        a.st_nlink = st.st_nlink
        a.st_uid = st.st_uid
        a.st_gid = st.st_gid
        a.st_size = st.st_size
        a.st_blksize = 1 << 20
        a.st_blocks = st.st_blocks
        a.st_atime_ns = st.st_atime_ns
        a.st_mtime_ns = st.st_mtime_ns
        a.st_ctime_ns = st.st_ctime_ns
        a.attr_timeout = self.ttl
        a.entry_timeout = self.ttl
        a.generation = 0
        return a

    async def lookup(self, parent_inode, name, ctx=None):  # type: ignore[no-untyped-def]
        path = os.path.join(self.paths[parent_inode], os.fsdecode(name))
        return self._attr(path, self._ino(path))

    async def getattr(self, inode, ctx=None):  # type: ignore[no-untyped-def]
        return self._attr(self.paths[inode], inode)

    async def forget(self, inode_list):  # type: ignore[no-untyped-def]
        pass  # keep the maps: the benchmark's trees are small

    async def opendir(self, inode, ctx):  # type: ignore[no-untyped-def]
        return inode

    async def readdir(self, fh, start_id, token):  # type: ignore[no-untyped-def]
        base = self.paths[fh]
        names = sorted(os.listdir(base))
        for i, name in enumerate(names[start_id:], start_id):
            path = os.path.join(base, name)
            if not pyfuse3.readdir_reply(
                token, os.fsencode(name), self._attr(path, self._ino(path)), i + 1
            ):
                break

    async def releasedir(self, fh):  # type: ignore[no-untyped-def]
        pass

    async def open(self, inode, flags, ctx):  # type: ignore[no-untyped-def]
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise pyfuse3.FUSEError(errno.EROFS)
        path = self.paths[inode]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        self.fds[fd] = inode
        return pyfuse3.FileInfo(fh=fd, keep_cache=True)

    async def read(self, fh, off, size):  # type: ignore[no-untyped-def]
        return os.pread(fh, size, off)

    async def release(self, fh):  # type: ignore[no-untyped-def]
        self.fds.pop(fh, None)
        os.close(fh)

    async def statfs(self, ctx):  # type: ignore[no-untyped-def]
        st = os.statvfs(self.root)
        s = pyfuse3.StatvfsData()
        for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                  "f_favail", "f_namemax"):  # fmt: skip
            setattr(s, k, getattr(st, k))
        return s


async def _main(args: argparse.Namespace) -> None:
    ops = Passthrough(args.source, args.ttl)
    mp = os.path.realpath(args.mountpoint)
    pyfuse3.init(ops, mp, {"fsname=passthrough", "subtype=passthrough", "default_permissions"})
    try:
        ok = raise_read_ahead(mp, args.read_ahead_kb)
        print(f"passthrough: mounted {ops.root} on {mp} (read_ahead raised: {ok})", flush=True)

        async with trio.open_nursery() as n:

            async def stop_on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                    async for _ in sigs:
                        pyfuse3.terminate()
                        return

            n.start_soon(stop_on_signal)
            await pyfuse3.main()
            n.cancel_scope.cancel()
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("mountpoint")
    ap.add_argument("--ttl", type=float, default=1.0)
    ap.add_argument("--read-ahead-kb", type=int, default=1024)
    trio.run(_main, ap.parse_args())
