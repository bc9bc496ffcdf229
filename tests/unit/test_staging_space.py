"""The staging area's free-disk floor (:mod:`airfs.writeback.space`), through its documented
injection point (a fake ``statvfs``): writes that would leave less than ``min_free`` free get
ENOSPC (after waiting for commits) before anything is written, what was written stays, and the
filesystem is measured only now and then, not at every write."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from airfs.writeback.opens import Opens
from airfs.writeback.space import MIN_FREE_MAX, DiskFloor, default_min_free
from airfs.writeback.staging import StagingArea

MiB = 1 << 20


class FakeDisk:
    """A filesystem of ``size`` bytes whose free space is ``size - staged bytes - other``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.other = 0
        self.area: StagingArea | None = None
        self.calls = 0

    def __call__(self, path: str) -> os.statvfs_result:
        self.calls += 1
        used = self.other + (self.area.bytes if self.area is not None else 0)
        blocks, free = self.size // 4096, (self.size - used) // 4096
        return os.statvfs_result((4096, 4096, blocks, free, free, 0, 0, 0, 0, 255))


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[FakeDisk]:
    fake = FakeDisk(100 * MiB)
    area = StagingArea(str(tmp_path / "cache"), limit=1 << 30, min_free=10 * MiB, statvfs=fake)
    fake.area = area
    try:
        yield fake
    finally:
        area.close()


async def test_a_write_under_the_floor_gets_enospc_and_keeps_what_was_written(
    disk: FakeDisk,
) -> None:
    area = disk.area
    assert area is not None
    area.floor.interval = 3600.0  # measured by growth only: the count below is exact
    opens = Opens(area)
    st = await area.create("f", None, 0o644)
    tok = await opens.open(st, 1, writable=True)
    chunk = b"x" * MiB
    accepted = 0
    with pytest.raises(OSError) as info:
        for _ in range(100):
            await area.io.reserve(st, accepted + len(chunk), 0.05)
            accepted += await area.io.write(st, accepted, chunk)
    assert info.value.errno == errno.ENOSPC
    assert "staging floor of 10485760 (--staging-min-free)" in str(info.value)
    assert accepted == 90 * MiB  # exactly down to the floor
    assert st.size == accepted and os.fstat(st.fd).st_size == accepted
    # measured at the first write and after 64 MiB of growth, not at each of 90 writes
    assert disk.calls == 2
    # space freed elsewhere on the filesystem: the next write fits again
    disk.size += 20 * MiB
    area.floor.invalidate()
    await area.io.reserve(st, accepted + len(chunk), 0.05)
    await opens.close(tok)


def test_the_floor_is_measured_again_after_its_interval_or_growth() -> None:
    fake = FakeDisk(100 * MiB)
    floor = DiskFloor("/x", 10 * MiB, interval=3600, every_bytes=8 * MiB, statvfs=fake)
    assert floor.fits(1 * MiB, 0) and fake.calls == 1
    assert floor.fits(1 * MiB, 5 * MiB) and fake.calls == 1  # estimated: 95 MiB free
    fake.other = 95 * MiB  # another program filled the disk
    assert floor.fits(1 * MiB, 7 * MiB) and fake.calls == 1  # not seen until measured
    assert not floor.fits(1 * MiB, 9 * MiB) and fake.calls == 2  # 8 MiB grown: measured
    assert DiskFloor("/x", 0, statvfs=fake).fits(1 << 40, 0) and fake.calls == 2  # no floor


def test_default_floor_is_a_few_percent_capped() -> None:
    assert default_min_free("/x", FakeDisk(100 * MiB)) == 3 * MiB
    assert default_min_free("/x", FakeDisk(1 << 40)) == MIN_FREE_MAX
    with pytest.raises(ValueError, match="min_free must be >= 0"):
        DiskFloor("/x", -1)
