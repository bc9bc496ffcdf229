"""``TableDataset`` under real gloo process groups (1-4 ranks) with 0-3 DataLoader workers in
each: every row exactly once (``drop``) or at least once with the padding only (``pad``), the
same count on every rank; on a plain directory and through a real airfs mount."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch.distributed as dist
from distpool import init_group
from tabletest_util import ids_of, write_parquet_dir
from torch.utils.data import DataLoader

from airfs.tables import TableDataset

pytestmark = pytest.mark.torch

SIZES = [61, 200, 17, 95, 130]  # 503 rows: prime, so no world size divides it


def _rank_ids(root: str, uneven: str) -> dict[int, list[int]]:
    ds = TableDataset(root, batch_rows=16, seed=7, uneven=uneven, shuffle_rows=50)
    ds.set_epoch(2)
    out = {}
    for workers in range(4):
        if workers == 0:
            out[workers] = ids_of(ds)
        else:
            loader = DataLoader(
                ds, batch_size=None, num_workers=workers, multiprocessing_context="fork"
            )
            out[workers] = ids_of(loader)
    return out


def _built_before_init(root: str, port: int) -> tuple[int, list[int]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    ds = TableDataset(root, batch_rows=10)  # no process group yet
    unsharded = ds.rows_per_rank()
    init_group(rank, world, port)
    return unsharded, ids_of(ds)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_and_workers_cover_every_row(dist_pool, tmp_path: Path, world: int):
    check_coverage(dist_pool, tmp_path, world, ("drop", "pad"))


@pytest.mark.mount
def test_ranks_and_workers_through_a_mount(dist_pool, table_dir: Path):
    from airfs.control.client import find_mount

    if find_mount(str(table_dir)) is None:
        pytest.skip("the plain-directory case is the test above")
    check_coverage(dist_pool, table_dir, 3, ("pad",))


def check_coverage(dist_pool, root: Path, world: int, modes: tuple[str, ...]) -> None:
    write_parquet_dir(root / "t", SIZES, row_group_size=24)
    total = sum(SIZES)
    pool = dist_pool(world)
    for uneven in modes:
        got = pool.run(_rank_ids, str(root / "t"), uneven)
        for workers in range(4):
            per_rank = [g[workers] for g in got]
            counts = {len(ids) for ids in per_rank}
            assert len(counts) == 1, f"unequal rows per rank: {[len(i) for i in per_rank]}"
            seen = Counter(i for ids in per_rank for i in ids)
            assert set(seen) <= set(range(total))
            if uneven == "drop":
                assert all(c == 1 for c in seen.values())
                assert len(seen) == total - total % world
            else:
                assert len(seen) == total
                assert sum(seen.values()) - total == (-total) % world
            # the split over workers does not change which rows a rank reads
            assert [sorted(ids) for ids in per_rank] == [sorted(g[0]) for g in got]


def test_dataset_made_before_init_process_group_still_shards(dist_pool, tmp_path: Path):
    from distpool import free_port

    write_parquet_dir(tmp_path / "t", SIZES, row_group_size=24)
    pool = dist_pool(2)
    got = pool.run(_built_before_init, str(tmp_path / "t"), free_port())
    assert [u for u, _ in got] == [sum(SIZES)] * 2  # before init: one rank, all rows
    a, b = (set(ids) for _, ids in got)
    assert len(a & b) == 1 and len(a | b) == sum(SIZES)  # pad: 503 rows -> 2 x 252
