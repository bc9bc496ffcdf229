"""Issue 23: a fetched part's bytes are touched as few times as possible — checksummed once,
answered to the reads waiting for it from its own buffer while a worker thread writes that
buffer into the cache file — and the checksums stay the guard of every read from the file."""

from __future__ import annotations

import glob
import json
import os
import random
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import lmdb
import pytest
import trio
from crc32c import crc32c

import airfs.cache.fetch as fetch_mod
import airfs.cache.store as store_mod
from airfs.cache import CachedReadPath
from airfs.cache.direct import DirectWriter
from airfs.cache.fetch import INLINE_WRITE_MAX
from airfs.core.readpath import ObjectRef
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Transient
from airfs.origin.latency import LatencyOrigin
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
        AsyncOrigin(origin), str(cache_dir), **{**OPTS, **kw}
    ) as rp:
        yield rp


def data_files(cache_dir: Path) -> list[str]:
    return sorted(glob.glob(str(cache_dir / "data" / "*" / "*")))


class HeldWrites:
    """Makes the cache-file writes of the fetch engine of more than ``over`` bytes wait until
    :meth:`release`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, over: int = 0) -> None:
        self._go = threading.Event()
        self.waiting = 0
        real: Callable[..., None] = fetch_mod.write_all  # the fetch job's own writes
        real_direct: Callable[..., None] = DirectWriter.write  # the later write job's

        def wait(data: Any) -> None:
            if len(data) > over:
                self.waiting += 1
                self._go.wait(30)

        def held(fd: int, data: Any, offset: int) -> None:
            wait(data)
            real(fd, data, offset)

        def held_direct(writer: DirectWriter, fd: int, data: Any, offset: int) -> None:
            wait(data)
            real_direct(writer, fd, data, offset)

        monkeypatch.setattr(fetch_mod, "write_all", held)
        monkeypatch.setattr(DirectWriter, "write", held_direct)

    def release(self) -> None:
        self._go.set()


async def test_reads_of_a_big_part_are_answered_before_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part over INLINE_WRITE_MAX serves the reads that wait for it from its buffer while its
    write into the cache file is still held (before issue 23 the write was in the fetch's own
    job: the read waited for it). The bytes are in flight (budget) until written, then
    committed: after a restart every byte is a verified hit."""
    part = 4 * MiB
    assert part > INLINE_WRITE_MAX
    mo = MemoryOrigin()
    data = blob(2 * part, seed=1)  # two parts (a whole object in one is written at once)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    held = HeldWrites(monkeypatch)
    async with cached(mo, tmp_path, part_size=part) as rp:
        r = rp.open(obj)
        with trio.fail_after(20):  # a guard against the old code's wait, not a timing
            # one read of the whole part: one demand part of part_size
            assert await r.read(0, part) == data[:part]
            assert await r.read(3 * MiB, 1 * MiB) == data[3 * MiB : part]
            while held.waiting == 0:  # its write job starts after the reads were answered
                await trio.sleep(0.005)
        st = rp.statistics()
        assert st.inflight_bytes >= part  # its bytes are still counted in flight
        assert st.hit_bytes == 0 and st.miss_bytes == part + 1 * MiB
        held.release()
        r.close()
        with trio.fail_after(20):
            while rp.statistics().inflight_bytes:
                await trio.sleep(0.01)
        await rp.flush()
    async with cached(mo, tmp_path, part_size=part) as rp:
        r = rp.open(obj)
        assert await r.read(0, part) == data[:part]
        r.close()
        st = rp.statistics()
        assert st.origin_requests == 0 and st.hit_bytes == part and st.corrupt_blocks == 0


async def test_a_read_within_one_part_is_a_view_of_its_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read answered from one fetched part's memory is a read-only view of that part's
    buffer (the loop copies nothing: the kernel transport writes the view to the kernel); a
    read across two parts is joined into new bytes. Both are the origin's bytes, and a view
    taken earlier keeps them after the part is written and let go."""
    part = 4 * MiB
    mo = MemoryOrigin()
    data = blob(2 * part, seed=7)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    # the big part's write is held (it stays in memory, in flight); the readahead's small
    # parts are written in their fetch jobs
    held = HeldWrites(monkeypatch, over=INLINE_WRITE_MAX)
    async with cached(mo, tmp_path, part_size=part) as rp:
        r = rp.open(obj)
        with trio.fail_after(20):  # a guard: the big write is held, the reads must not wait
            first = await r.read(0, part)  # one demand part of part_size
            one = await r.read(1 * MiB, 1 * MiB)  # within it, served from its buffer
            for v in (first, one):
                assert isinstance(v, memoryview) and v.readonly and v.format == "B"
            assert first == data[:part] and one.nbytes == MiB and one == data[MiB : 2 * MiB]
            assert one.obj is first.obj  # the same buffer, not a copy
            with pytest.raises(TypeError):
                one[0] = 0  # type: ignore[index]
            across = await r.read(part - 4096, 8192)  # the end of one, the start of the next
            assert isinstance(across, bytes) and across == data[part - 4096 : part + 4096]
            while held.waiting == 0:  # its write job starts after the reads were answered
                await trio.sleep(0.005)
            assert held.waiting == 1  # the big part's write, held: not written yet
        held.release()
        r.close()
        with trio.fail_after(20):
            while rp.statistics().inflight_bytes:
                await trio.sleep(0.01)
        assert one == data[MiB : 2 * MiB]  # the view keeps its bytes


async def test_a_corrupt_block_of_a_big_part_is_refetched(tmp_path: Path) -> None:
    """Blocks written after their waiters were answered are verified on every later read: a
    flipped byte fails its chunk's checksum, and only that block is fetched again."""
    mo = MemoryOrigin()
    data = blob(8 * MiB, seed=2)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(mo, tmp_path, part_size=8 * MiB) as rp:
        r = rp.open(obj)
        assert await r.read(0, obj.size) == data
        r.close()
        assert rp.statistics().origin_requests == 1
    (path,) = data_files(tmp_path)
    victim = 5 * MiB + 1234  # block 20
    with open(path, "r+b") as f:
        f.seek(victim)
        byte = f.read(1)
        f.seek(victim)
        f.write(bytes([byte[0] ^ 0x01]))
    before = mo.bytes_read
    async with cached(mo, tmp_path, part_size=8 * MiB) as rp:
        r = rp.open(obj)
        assert await r.read(victim - 100, 200) == data[victim - 100 : victim + 100]
        assert rp.statistics().corrupt_blocks == 1
        assert await r.read(0, obj.size) == data
        r.close()
    assert mo.bytes_read - before == 256 * KiB  # the one block
    with open(path, "rb") as f:
        f.seek(victim)
        assert f.read(1) == byte


async def test_the_stored_checksums_are_crc32c_of_the_bytes(tmp_path: Path) -> None:
    """The index keeps one CRC-32C per chunk, computed once from the fetched buffer."""
    mo = MemoryOrigin()
    data = blob(2 * MiB + 5, seed=3)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(mo, tmp_path) as rp:
        r = rp.open(obj)
        assert await r.read(0, obj.size) == data
        r.close()
        await rp.flush()
    env = lmdb.open(str(tmp_path / "index"), max_dbs=4, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            fmt = json.loads(txn.get(b"format", db=env.open_db(b"info", txn=txn)))
            ((_, raw),) = list(txn.cursor(db=env.open_db(b"map", txn=txn)))
    finally:
        env.close()
    assert fmt["checksum"] == "crc32c" and fmt["format"] == 2
    nblocks, cs = -(-obj.size // (256 * KiB)), 64 * KiB
    crcs = bytes(raw)[8 + nblocks :]
    want = b"".join(
        crc32c(data[i : i + cs]).to_bytes(4, "little") for i in range(0, obj.size, cs)
    )
    assert crcs == want


async def test_chunk_checksums_never_give_the_gil_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every CRC-32C of a chunk -- of a fetched part (a worker thread) and of a cached read
    verified on the trio loop -- keeps the GIL (``gil_release_mode=0``). A chunk takes a few
    microseconds; by default ``crc32c`` releases the GIL for it, and taking it back then waits
    for whichever thread holds it, up to the 5 ms switch interval: on the loop, a cached read
    stalled behind the fetches' Python work."""
    calls: list[tuple[int, Any]] = []
    real = store_mod.crc32c

    def recorded(data: Any, *args: Any, **kw: Any) -> int:
        calls.append((threading.get_ident(), kw.get("gil_release_mode")))
        return real(data, *args, **kw)

    monkeypatch.setattr(store_mod, "crc32c", recorded)
    mo = MemoryOrigin()
    data = blob(1 * MiB, seed=8)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(mo, tmp_path) as rp:
        r = rp.open(obj)
        assert await r.read(0, obj.size) == data  # fetched: checksummed in a worker
        fetched = len(calls)
        assert await r.read(0, 256 * KiB) == data[: 256 * KiB]  # a hit, verified
        r.close()
        assert rp.statistics().hit_bytes == 256 * KiB
    loop = threading.get_ident()
    assert fetched == 16 and any(t != loop for t, _ in calls[:fetched])
    assert len(calls) == 20 and all(t == loop for t, _ in calls[fetched:])
    assert {mode for _, mode in calls} == {0}


async def test_a_cache_of_the_old_checksum_is_wiped_cleanly(tmp_path: Path) -> None:
    """A cache index of format 1 (zlib CRC-32 checksums, no algorithm recorded) is wiped when
    opened: nothing of it is served (its checksums would not match), its files are removed,
    and the bytes come from the origin again."""
    mo = MemoryOrigin()
    data = blob(1 * MiB, seed=4)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(mo, tmp_path) as rp:
        r = rp.open(obj)
        assert await r.read(0, obj.size) == data
        r.close()
    (old_file,) = data_files(tmp_path)
    env = lmdb.open(str(tmp_path / "index"), max_dbs=4)
    try:
        with env.begin(write=True) as txn:
            info = env.open_db(b"info", txn=txn)
            old = {"format": 1, "block_size": OPTS["block_size"], "chunk_size": 64 * KiB}
            txn.put(b"format", json.dumps(old).encode(), db=info)
    finally:
        env.close()
    before = mo.bytes_read
    async with cached(mo, tmp_path) as rp:
        r = rp.open(obj)
        assert await r.read(0, obj.size) == data
        r.close()
        st = rp.statistics()
        assert st.corrupt_blocks == 0 and st.hit_bytes == 0
        with trio.fail_after(20):  # the start-up sweep of orphans runs in the background
            while old_file in data_files(tmp_path):
                await trio.sleep(0.01)
    assert mo.bytes_read - before == obj.size
    assert len(data_files(tmp_path)) == 1


async def test_sixteen_cold_readers_keep_the_inflight_budget(tmp_path: Path) -> None:
    """16 cold sequential readers of 16 objects: the bytes in flight (fetched, not yet in the
    cache file) never pass the budget by more than what the readers' own reads need, also now
    that a part holds its bytes until it is written (after its reads were answered)."""
    mo = MemoryOrigin()
    size, part, budget, step = 6 * MiB, 2 * MiB, 8 * MiB, 256 * KiB
    objs = []
    for i in range(16):
        mo.put_bytes(f"f{i}", blob(size, seed=100 + i))
        objs.append(ref(mo, f"f{i}"))
    origin = LatencyOrigin(mo, latency_s=0.002)
    async with cached(
        origin, tmp_path, part_size=part, inflight_budget=budget, max_window=16 * MiB
    ) as rp:
        ok = []

        async def reader(o: ObjectRef, seed: int) -> None:
            r = rp.open(o)
            got = [await r.read(off, step) for off in range(0, o.size, step)]
            r.close()
            ok.append(b"".join(got) == blob(size, seed=seed))

        async with trio.open_nursery() as n:
            for i, o in enumerate(objs):
                n.start_soon(reader, o, 100 + i)
        # the last parts may still be writing their bytes into the cache files (their reads
        # were answered first): their share of the budget comes back when they are written
        with trio.fail_after(20):
            while rp.statistics().inflight_bytes:
                await trio.sleep(0.01)
        st = rp.statistics()
    assert ok == [True] * 16
    assert st.origin_bytes_read == 16 * size
    assert st.prefetch_bytes > 0  # the readers were sequential: prefetch ran
    # prefetch stays within the budget; on top: per reader, the part its read waits for and
    # the part before it, still being written into the cache file (measured: 30 MiB before
    # issue 23's write-behind, 47 MiB with it)
    assert st.inflight_waits > 0  # the budget was binding
    assert budget <= st.inflight_peak_bytes <= budget + 2 * 16 * part
    assert st.inflight_bytes == 0


async def test_a_small_file_fetched_whole_at_open_is_not_read_back(tmp_path: Path) -> None:
    """The open of a cold small file (fetched whole for passthrough) is one GET: the file the
    cache just wrote from checksummed buffers is recorded as verified without reading it back
    (before issue 23 it was read and checked again in a second worker-thread job). The record
    reaches the file by the shutdown at the latest: after a restart the file passes without a
    verification, and a byte flipped meanwhile (which moves its ctime) is caught."""
    mo = MemoryOrigin()
    data = blob(150 * KiB, seed=7)
    mo.put_bytes("s", data)
    obj = ref(mo, "s")
    async with cached(mo, tmp_path) as rp:
        lf = await rp.local_file(obj, fetch_max=8 * MiB)
        assert lf is not None
        assert os.pread(lf.fd, obj.size + 1, 0) == data
        lf.release()
        b = rp.backing_statistics()
        assert (b.backing_fetched_whole, b.backing_verifications) == (1, 0)
        assert rp.statistics().origin_requests == 1
    async with cached(mo, tmp_path) as rp:
        lf = await rp.local_file(obj, fetch_max=8 * MiB)
        assert lf is not None
        lf.release()
        b = rp.backing_statistics()
        assert (b.backing_fetched_whole, b.backing_verifications) == (0, 0)
    (path,) = data_files(tmp_path)
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0x01]))
    async with cached(mo, tmp_path) as rp:
        assert await rp.local_file(obj, fetch_max=0) is None  # checked: the chunk fails
        b = rp.backing_statistics()
        assert (b.backing_verifications, b.backing_verify_failures) == (1, 1)
        r = rp.open(obj)
        assert await r.read(0, obj.size) == data  # the block came again from the origin
        r.close()
        assert rp.statistics().corrupt_blocks == 1


async def test_a_sequential_cold_read_asks_the_origin_for_ranges_on_the_part_grid(
    tmp_path: Path,
) -> None:
    """A sequential reader's parts are cut on the grid of the part size: no origin range
    crosses a multiple of it, and all but the first few (the window's growth) and the object's
    end are whole cells. Before, the window's growth left the parts 1 MiB off the grid (15,
    23, 31... MiB): every 8 MiB GET spanned two chunks of the object store."""
    part = 2 * MiB
    mo = MemoryOrigin()
    data = blob(37 * MiB + 5000, seed=3)
    mo.put_bytes("big", data)
    rec = Recording(mo)
    async with cached(rec, tmp_path, part_size=part) as rp:
        obj = ref(mo, "big")
        r = rp.open(obj)
        got = bytearray()
        for off in range(0, obj.size, 128 * KiB):
            got += await r.read(off, min(128 * KiB, obj.size - off))
        r.close()
    assert got == data
    ranges = sorted((o, n) for _, o, n in rec.ranges)
    assert sum(n for _, n in ranges) == len(data)  # each byte once
    for o, n in ranges:
        assert o // part == (o + n - 1) // part, (o, n)
    whole = [(o, n) for o, n in ranges if o >= 4 * MiB and o + n < len(data) - part]
    assert whole and all(o % part == 0 and n == part for o, n in whole)


class Gate:
    """Wraps an origin; reads of ``held`` block until :meth:`open` (counted in ``blocked``)."""

    def __init__(self, inner: Any, held: str) -> None:
        self.inner = inner
        self.url = inner.url
        self.held = held
        self.blocked = 0
        self._go = threading.Event()

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        if path == self.held:
            self.blocked += 1
            self._go.wait(30)
        return self.inner.read_range(path, offset, size, version)

    def open(self) -> None:
        self._go.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_small_file_at_open_does_not_queue_behind_prefetch(tmp_path: Path) -> None:
    """The whole-file fetch of an open skips the prefetch slots, as a read's fetch does: with
    every slot taken by a warm whose origin reads hang, the open still gets its file (before,
    it queued behind them: an open waited for other files' fetches)."""
    mo = MemoryOrigin()
    big, small = blob(4 * MiB, seed=8), blob(150 * KiB, seed=9)
    mo.put_bytes("big", big)
    mo.put_bytes("small", small)
    gate = Gate(mo, "big")
    async with (
        cached(gate, tmp_path, part_size=1 * MiB, max_parallel=1) as rp,
        trio.open_nursery() as n,
    ):
        n.start_soon(rp.warm, ref(mo, "big"))
        with trio.fail_after(20):
            while gate.blocked == 0:  # the one slot is held by a hanging read
                await trio.sleep(0.005)
            lf = await rp.local_file(ref(mo, "small"), fetch_max=8 * MiB)
        assert lf is not None and os.pread(lf.fd, len(small) + 1, 0) == small
        lf.release()
        assert gate.blocked == 1  # the warm is still waiting for its first part
        gate.open()


async def test_an_open_right_after_a_cold_read_waits_for_the_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file just read whole, whose last parts are still being written into the cache file,
    is complete a moment later: an open for passthrough waits for those writes (settle) and
    gets the file, rather than finding blocks in flight and serving it through the daemon."""
    part = 4 * MiB
    mo = MemoryOrigin()
    data = blob(2 * part, seed=10)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    held = HeldWrites(monkeypatch, over=INLINE_WRITE_MAX)  # the write-behind jobs only
    async with cached(mo, tmp_path, part_size=part) as rp:
        r = rp.open(obj)
        with trio.fail_after(20):
            assert await r.read(0, part) == data[:part]
            assert await r.read(part, part) == data[part:]
        r.close()
        got: list[Any] = []

        async def open_it() -> None:
            got.append(await rp.local_file(obj))

        async with trio.open_nursery() as n:
            n.start_soon(open_it)
            with trio.fail_after(20):
                while held.waiting == 0:
                    await trio.sleep(0.005)
            held.release()
        (lf,) = got
        assert lf is not None
        assert os.pread(lf.fd, obj.size + 1, 0) == data
        lf.release()


async def test_warms_of_small_files_are_bounded_by_their_callers(tmp_path: Path) -> None:
    """A warm of a file fetched in one part runs in its caller's task, outside the prefetch
    slots (``airfs warm -j N`` and the prefetch queue's workers bound their own
    concurrency): three warms at once, with one slot, make three reads at once (before, each
    queued for the one slot: the reads here, which wait for each other, failed)."""
    mo = MemoryOrigin()
    files = {f"f{i}": blob(150 * KiB, seed=20 + i) for i in range(3)}
    for k, v in files.items():
        mo.put_bytes(k, v)
    conc = Recording(mo, meet=3)
    async with cached(conc, tmp_path, part_size=1 * MiB, max_parallel=1) as rp:
        got: dict[str, int] = {}

        async def one(name: str) -> None:
            got[name] = await rp.warm(ref(mo, name))

        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                for name in files:
                    n.start_soon(one, name)
        assert got == {k: len(v) for k, v in files.items()} and conc.max_running == 3
        for name, data in files.items():  # cached: no read of the origin any more
            lf = await rp.local_file(ref(mo, name))
            assert lf is not None and os.pread(lf.fd, len(data) + 1, 0) == data
            lf.release()
        assert rp.statistics().origin_requests == 3


async def test_a_big_warm_keeps_to_the_prefetch_slots(tmp_path: Path) -> None:
    """A warm of many parts still fetches them within ``max_parallel`` slots."""
    mo = MemoryOrigin()
    data = blob(4 * MiB, seed=30)
    mo.put_bytes("big", data)
    conc = Recording(mo, delay=0.1)
    async with cached(conc, tmp_path, part_size=1 * MiB, max_parallel=2) as rp:
        with trio.fail_after(20):
            assert await rp.warm(ref(mo, "big")) == len(data)
        assert conc.max_running == 2 and rp.statistics().origin_requests == 4


async def test_a_cancelled_warm_does_not_fail_another_waiting_for_its_fetch(
    tmp_path: Path,
) -> None:
    """A small file's warm runs its fetch in its caller's task; when that caller is cancelled
    (an interrupted open, a warm whose client went away) while its fetch waits (here in the
    origin's retry backoff), another warm waiting for the same fetch plans again and gets the
    file: the first one's cancel is not its error (with the cancel passed on, it failed with
    EIO "read path closed")."""
    mo = MemoryOrigin()
    data = blob(150 * KiB, seed=40)
    mo.put_bytes("f", data)

    class FailOnce(Gate):
        """The first read of ``held`` waits for :meth:`open`, then fails transiently."""

        def read_range(
            self, path: str, offset: int, size: int, version: str | None = None
        ) -> bytes:
            if path == self.held and self.blocked == 0:
                self.blocked += 1
                self._go.wait(30)
                raise Transient(f"{path}: a transient failure")
            return self.inner.read_range(path, offset, size, version)

    gate = FailOnce(mo, "f")
    async with cached(gate, tmp_path) as rp:
        got: list[int] = []
        first = trio.CancelScope()

        async def cancelled_warm() -> None:
            with first:
                await rp.warm(ref(mo, "f"))

        async def second_warm() -> None:
            got.append(await rp.warm(ref(mo, "f")))

        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                n.start_soon(cancelled_warm)
                while gate.blocked == 0:  # the first warm's read is in flight
                    await trio.sleep(0.005)
                n.start_soon(second_warm)
                await trio.sleep(0.05)  # the second one waits for the first one's part
                first.cancel()  # delivered when the read's thread is back: in the backoff
                gate.open()
        assert first.cancelled_caught and got == [len(data)]
        lf = await rp.local_file(ref(mo, "f"))
        assert lf is not None and os.pread(lf.fd, len(data) + 1, 0) == data
        lf.release()
