"""``torch.distributed.checkpoint`` storage for volumes: complete-or-invisible checkpoints.

:class:`VolumeWriter` and :class:`VolumeReader` are small subclasses of torch's
``FileSystemWriter`` / ``FileSystemReader``: the files they write are standard DCP (torch's own
reader reads them, and :class:`VolumeReader` reads torch's). What they add:

- **A checkpoint is visible only when complete.** DCP saves in steps: every rank writes its
  shards (``write_data``), the coordinator gathers every rank's results, then writes
  ``.metadata`` (``finish``). Here each rank commits its shards before it reports them: on an
  airfs mount it calls the daemon's ``flush`` for the checkpoint directory (returns once every
  write under it is at the origin); elsewhere it fsyncs the files and the directory. The
  coordinator commits again before writing ``.metadata`` and once more after. So ``.metadata``
  exists only when every shard of every rank is committed, and a save that fails or is killed
  on any rank leaves no ``.metadata``: :func:`latest_checkpoint` skips it.
- **A fresh directory per checkpoint.** Saving into a directory that already holds a complete
  checkpoint raises ``FileExistsError`` unless ``overwrite=True``; then its ``.metadata`` is
  removed (and committed) before any new shard is written.
- **Reads** are sorted by file and offset, and all the files a rank needs are prefetched in
  parallel first (mount: the daemon fetches them; elsewhere: ``posix_fadvise(WILLNEED)``).

Plain ``torch.save`` / ``torch.load(weights_only=True)`` need nothing from here: they work
through the mount as through any directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from airfs.catalog.explain import explain
from airfs.control import client

__all__ = ["METADATA", "VolumeReader", "VolumeWriter", "is_complete", "latest_checkpoint"]

log = logging.getLogger("airfs.data.checkpoint")

METADATA = ".metadata"
"""The file whose presence marks a complete DCP checkpoint."""


def is_complete(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a complete checkpoint (its ``.metadata`` exists)."""
    return os.path.isfile(os.path.join(os.fspath(path), METADATA))


def latest_checkpoint(directory: str | os.PathLike[str]) -> str | None:
    """The newest complete checkpoint among the subdirectories of ``directory``: the one whose
    ``.metadata`` was written last (ties: the natural order of names, so ``step_10`` comes
    after ``step_9``). None if there is none, or ``directory`` does not exist."""
    best: tuple[int, list[Any], str] | None = None
    try:
        entries = list(os.scandir(os.fspath(directory)))
    except FileNotFoundError:
        return None
    for entry in entries:
        if not entry.is_dir():
            continue
        try:
            st = os.stat(os.path.join(entry.path, METADATA))
        except FileNotFoundError:
            continue
        key = (st.st_mtime_ns, _natural(entry.name), entry.path)
        if best is None or key > best:
            best = key
    return None if best is None else best[2]


class VolumeWriter(FileSystemWriter):
    """DCP storage writer for ``dcp.save`` / ``dcp.async_save`` into ``path`` (see module doc).

    Arguments are ``FileSystemWriter``'s, with these defaults changed: ``overwrite=False``
    (refuse a directory holding a complete checkpoint), ``thread_count=4`` (files written in
    parallel per rank), and ``sync_files=None``: fsync each file on a plain directory, not on
    an airfs mount (where the flush barrier commits them). ``use_collectives=False`` is refused:
    without the gather there is no point where every rank's shards are known to be committed.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        overwrite: bool = False,
        thread_count: int = 4,
        sync_files: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            path,
            overwrite=overwrite,
            thread_count=thread_count,
            sync_files=True if sync_files is None else sync_files,
            **kwargs,
        )
        self._auto_sync = sync_files is None
        self._mountpoint: str | None = None
        if not overwrite and is_complete(self.path):
            # here, in the caller's frame, so that ``except FileExistsError`` catches it
            # (inside dcp.save it would arrive wrapped in torch's CheckpointException)
            raise FileExistsError(_complete_message(self.path))

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        if not kwargs.get("use_collectives", True):
            raise ValueError("VolumeWriter needs use_collectives=True (the commit barrier)")
        self._mountpoint = client.find_mount(os.fspath(self.path))
        if self._auto_sync:
            self.sync_files = self._mountpoint is None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        try:
            os.makedirs(self.path, exist_ok=True)
        except PermissionError as exc:  # a governed volume says which privilege is missing
            raise explain(exc, os.fspath(self.path), "write") from exc
        if not self.overwrite and is_complete(self.path):
            # completed by someone else since this writer was made: dcp.save reports it as
            # torch's CheckpointException with this FileExistsError in its ``failures``
            raise FileExistsError(_complete_message(self.path))
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # Coordinator only, after every rank's local plan and before any rank writes: an old
        # complete checkpoint stops being complete before its shards are replaced.
        meta = os.path.join(self.path, METADATA)
        if self.overwrite and os.path.exists(meta):
            os.unlink(meta)
            self._commit()
        return super().prepare_global_plan(plans)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        fut = super().write_data(plan, planner)
        results = fut.wait()
        self._commit()  # this rank's shards are at the origin before the coordinator hears
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        self._commit()  # every rank has committed its own; this covers the coordinator's node
        super().finish(metadata, results)
        self._commit()  # and now .metadata: the checkpoint is complete at the origin

    def _commit(self) -> None:
        path = os.fspath(self.path)
        if self._mountpoint is not None:
            try:
                client.flush(self._mountpoint, path)
            except client.ControlError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM):
                    raise PermissionError(exc.errno, str(exc), path) from exc
                raise
        else:
            _fsync_dir(path)


class VolumeReader(FileSystemReader):
    """DCP storage reader for ``dcp.load`` from ``path`` (see module doc). ``prefetch_threads``
    bounds the parallel prefetch requests; other keyword arguments go to
    ``FileSystemReader``."""

    def __init__(
        self, path: str | os.PathLike[str], *, prefetch_threads: int = 16, **kwargs: Any
    ) -> None:
        super().__init__(path, **kwargs)
        self.prefetch_threads = prefetch_threads

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        try:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.stat(os.path.join(os.fspath(self.path), METADATA))  # EACCES is not "absent"
            if kwargs.get("rank") is None and not is_complete(self.path):
                raise FileNotFoundError(
                    f"{self.path} holds no complete checkpoint (no {METADATA}); "
                    "latest_checkpoint(parent) finds the newest complete one"
                )
            return super().read_metadata(*args, **kwargs)
        except PermissionError as exc:  # a governed volume says which privilege is missing
            raise explain(exc, os.fspath(self.path), "read") from exc

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        def where(item: Any) -> tuple[str, int]:
            info = self.storage_data[item.storage_index]
            return info.relative_path, info.offset

        items = sorted(plan.items, key=where)
        files = list(dict.fromkeys(where(item)[0] for item in items))
        self._prefetch(os.fspath(self.path), files)
        return super().read_data(dataclasses.replace(plan, items=items), planner)

    def _prefetch(self, root: str, files: list[str]) -> None:
        paths = [os.path.join(root, f) for f in files]
        if not paths:
            return
        mountpoint = client.find_mount(root)
        if mountpoint is not None:
            try:
                client.prefetch(mountpoint, paths)
            except client.ControlError as exc:
                log.warning("airfs: cannot ask %s to prefetch the checkpoint (%s)", mountpoint, exc)
            return
        with ThreadPoolExecutor(min(self.prefetch_threads, len(paths))) as pool:
            list(pool.map(_willneed, paths))


def _complete_message(path: str | os.PathLike[str]) -> str:
    return (
        f"{os.fspath(path)} already holds a complete checkpoint; save into a fresh "
        "directory, or pass overwrite=True"
    )


def _willneed(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _natural(name: str) -> list[Any]:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name) if t]
