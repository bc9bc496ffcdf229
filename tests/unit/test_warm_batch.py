"""``airfs warm`` of many small files: the cache fetches a batch of them in one worker-thread
job, one after another (:meth:`airfs.cache.wholes.WholeBatches`), instead of a thread
round trip each. Each file is still its own: its bytes checksummed and committed, its failure
its own (a transient one retried), a read of it during the batch served once."""

from __future__ import annotations

import dataclasses
import errno
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import airfs.cache.store as store_mod
import airfs.cache.wholes as wholes_mod
from airfs.cache import CachedReadPath
from airfs.core.readpath import ObjectRef
from airfs.core.warm import BATCH_FILES, BATCH_MAX_SIZE, batches
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Conflict, Transient
from airfs.testing.memory import MemoryOrigin, Recording

KiB, MiB = 1 << 10, 1 << 20
OPTS = {"cache_size": 256 * MiB, "block_size": 256 * KiB, "checksum_chunk": 64 * KiB}


def blob(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def ref(origin: Any, path: str) -> ObjectRef:
    e = origin.stat(path)
    return ObjectRef(path, e.version, e.size)


@asynccontextmanager
async def cached(origin: Any, cache_dir: Path, **kw: Any) -> AsyncIterator[CachedReadPath]:
    async with CachedReadPath.running(
        AsyncOrigin(origin, base_delay=0.01), str(cache_dir), **{**OPTS, **kw}
    ) as rp:
        yield rp


class Jobs:
    """Counts the batch jobs (:func:`airfs.cache.wholes.fetch_wholes`) and their sizes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        real = wholes_mod.fetch_wholes

        def counted(origin: Any, chunk: int, items: list[Any]) -> None:
            self.sizes.append(len(items))
            real(origin, chunk, items)

        monkeypatch.setattr(wholes_mod, "fetch_wholes", counted)


class FailOnce:
    """Wraps an origin: the first read of each path in ``paths`` raises :class:`Transient`
    (its reads are plain ``read_range``: no buffer reads to fault around)."""

    def __init__(self, inner: Any, paths: set[str]) -> None:
        self.inner, self.url, self.paths = inner, inner.url, set(paths)
        self.capabilities = dataclasses.replace(
            inner.capabilities, buffer_reads=False, into_reads=False
        )

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        if path in self.paths:
            self.paths.discard(path)
            raise Transient(f"{path}: connection reset (injected)")
        data: bytes = self.inner.read_range(path, offset, size, version)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def read_all(rp: CachedReadPath, obj: ObjectRef) -> bytes:
    r = rp.open(obj)
    try:
        return bytes(await r.read(0, obj.size))
    finally:
        r.close()


def test_small_files_go_in_batches_big_ones_alone() -> None:
    small = [ObjectRef(f"s{i}", "v", 150 * KiB) for i in range(BATCH_FILES + 3)]
    big = ObjectRef("big", "v", BATCH_MAX_SIZE + 1)
    units = batches([*small[:5], big, *small[5:]])
    assert units == [[big], small[:BATCH_FILES], small[BATCH_FILES:]]  # big at once


async def test_a_batch_is_one_job_and_every_file_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten small files in one job; a file of several parts, one cached already and an empty
    one beside them take the usual path. Every byte is committed with its checksums: after a
    restart each file is read without the origin."""
    mo = MemoryOrigin()
    files = {f"s{i}": blob(150 * KiB + i, seed=i) for i in range(10)}
    files["big"] = blob(3 * MiB, seed=99)  # three parts of 1 MiB
    files["read"] = blob(600 * KiB, seed=98)  # read (so cached) before the warm
    files["empty"] = b""
    for k, v in files.items():
        mo.put_bytes(k, v)
    jobs = Jobs(monkeypatch)
    refs = [ref(mo, k) for k in files]
    async with cached(mo, tmp_path, part_size=1 * MiB) as rp:
        assert await read_all(rp, ref(mo, "read")) == files["read"]
        before = rp.statistics().origin_requests
        got = await rp.warm_many(refs)
        st = rp.statistics()
    assert jobs.sizes == [10] and st.warm_batches == 1  # the ten small files: one job
    # each file's bytes from the origin once; none of the one read before
    sizes = [len(v) for v in files.values()]
    assert got == [*sizes[:11], 0, 0]
    assert st.origin_requests - before == 10 + 3
    async with cached(mo, tmp_path, part_size=1 * MiB) as rp:  # a restart: all cached
        for o in refs:
            assert await read_all(rp, o) == files[o.path], o.path
        st = rp.statistics()
        assert st.origin_requests == 0 and st.corrupt_blocks == 0
        assert await rp.warm_many(refs) == [0] * len(refs)  # nothing left to fetch
    assert jobs.sizes == [10]


async def test_a_failure_is_that_files_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one batch: a file changed at the origin since it was listed fails with
    :class:`Conflict` (nothing of it is cached), a file whose read failed transiently is
    fetched again by itself and cached, and the others are cached by the batch."""
    mo = MemoryOrigin()
    files = {f"f{i}": blob(100 * KiB, seed=10 + i) for i in range(6)}
    for k, v in files.items():
        mo.put_bytes(k, v)
    refs = [ref(mo, k) for k in files]
    mo.put_bytes("f1", blob(100 * KiB, seed=77))  # a new version: the listed one is gone
    jobs = Jobs(monkeypatch)
    async with cached(FailOnce(mo, {"f4"}), tmp_path) as rp:
        got = await rp.warm_many(refs)
        assert isinstance(got[1], Conflict) and "f1" in str(got[1])
        assert [g for i, g in enumerate(got) if i != 1] == [100 * KiB] * 5
        assert jobs.sizes == [6]  # the batch; f4 again alone (its own warm, not a batch)
        for i, o in enumerate(refs):
            lf = await rp.local_file(o)
            if i == 1:
                assert lf is None  # nothing of the gone version is kept
                continue
            assert lf is not None and os.pread(lf.fd, o.size + 1, 0) == files[o.path], o.path
            lf.release()
        # five fetched: four by the batch, f4 by itself (a failed read is not counted)
        assert rp.statistics().origin_requests == 5


async def test_a_read_during_the_batch_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of a batch in flight is read once: a read of it waits for the batch and is
    answered from what the batch stored (no second fetch)."""
    mo = MemoryOrigin()
    files = {f"f{i}": blob(64 * KiB, seed=40 + i) for i in range(4)}
    for k, v in files.items():
        mo.put_bytes(k, v)
    slow = Recording(mo, delay=0.2)  # each read 0.2 s: the batch takes 0.8 s
    refs = [ref(mo, k) for k in files]
    jobs = Jobs(monkeypatch)
    async with cached(slow, tmp_path) as rp:
        out: list[Any] = []
        with trio.fail_after(20):
            async with trio.open_nursery() as n:

                async def batch() -> None:
                    out.extend(await rp.warm_many(refs))

                n.start_soon(batch)
                while not slow.ranges:  # the batch has started
                    await trio.sleep(0.01)
                assert await read_all(rp, refs[3]) == files["f3"]
        assert out == [64 * KiB] * 4 and jobs.sizes == [4]
        assert sorted(p for p, _, _ in slow.ranges) == sorted(files)  # each read once


class DiskFull:
    """``airfs.cache.store.write_all`` that writes half of its ``nth`` call's bytes, then fails
    as a full disk does (``ENOSPC``); every other call writes as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
        self.calls, self.nth = 0, nth
        self._real = store_mod.write_all
        monkeypatch.setattr(store_mod, "write_all", self)

    def __call__(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        self.calls += 1
        if self.calls != self.nth:
            self._real(fd, data, offset)
            return
        half = memoryview(data)[: len(data) // 2]
        self._real(fd, half, offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_whole_file_whose_write_fails_is_left_at_its_full_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`airfs.cache.store.create_whole` reports a failed write instead of raising it,
    and leaves the file as :func:`~airfs.cache.store.create_file` would: ``size`` bytes
    (later parts are written at their offsets, never extending it)."""
    data = blob(150 * KiB, seed=5)
    ok = tmp_path / "ok"
    fd, failed = store_mod.create_whole(str(ok), data, len(data))
    try:
        assert failed is None and os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)
    DiskFull(monkeypatch, nth=1)
    fd, failed = store_mod.create_whole(str(tmp_path / "full"), data, len(data))
    try:
        assert isinstance(failed, OSError) and failed.errno == errno.ENOSPC
        assert os.fstat(fd).st_size == len(data)
        assert os.pread(fd, len(data), 0)[: len(data) // 2] == data[: len(data) // 2]
    finally:
        os.close(fd)


async def test_a_file_of_a_batch_that_cannot_be_written_is_that_files_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache file of one file of a batch fails half way (a full disk): that file's bytes
    are not committed (nothing of it is served from the cache file), the batch's other files
    are, and a read of the failed one returns its bytes (from the origin again)."""
    mo = MemoryOrigin()
    files = {f"f{i}": blob(120 * KiB, seed=60 + i) for i in range(5)}
    for k, v in files.items():
        mo.put_bytes(k, v)
    refs = [ref(mo, k) for k in files]
    jobs = Jobs(monkeypatch)
    full = DiskFull(monkeypatch, nth=3)  # the batch writes f0, f1, f2...: f2 fails
    async with cached(mo, tmp_path) as rp:
        assert await rp.warm_many(refs) == [120 * KiB] * 5
        assert jobs.sizes == [5] and full.calls == 5
        st = rp.statistics()
        assert st.origin_requests == 5 and st.uncached_bytes == 120 * KiB
        for i, o in enumerate(refs):
            lf = await rp.local_file(o)  # complete and verified, or None
            assert (lf is None) == (i == 2), o.path
            if lf is not None:
                lf.release()
        assert await read_all(rp, refs[2]) == files["f2"]
        assert rp.statistics().origin_requests == 6
    async with cached(mo, tmp_path) as rp:  # a restart: the four are cached, f2 too now
        for o in refs:
            assert await read_all(rp, o) == files[o.path], o.path
        assert rp.statistics().origin_requests == 0
