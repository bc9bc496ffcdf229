"""VolumeDataset under real gloo process groups (2-4 ranks), with DataLoader workers inside each
rank and one local cache directory shared by all of them. Test bodies take the volume directory
as the ``volume_dir`` fixture."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch.distributed as dist
from distpool import free_port, init_group
from torchtest_util import identity, make_files

from airfs.data import DataLoader, VolumeDataset, sharding

pytestmark = pytest.mark.torch

N_FILES = 37


def _rank_files(root: str, cache: str, workers: int, uneven: str, context: str | None) -> list:
    ds = VolumeDataset(root, cache_dir=cache, uneven=uneven, seed=4)
    ds.set_epoch(1)
    if workers == 0:
        paths = list(ds)
    else:
        loader = DataLoader(
            ds,
            batch_size=None,
            num_workers=workers,
            persistent_workers=False,
            multiprocessing_context=context,
        )
        paths = list(loader)
    return [identity(p) for p in paths]


def _built_before_init(root: str, cache: str, port: int) -> tuple[int, list[str]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    ds = VolumeDataset(root, cache_dir=cache, seed=4)  # no process group at this point
    unsharded = len(ds)
    init_group(rank, world, port)
    return unsharded, [identity(p) for p in ds]


def _expected(world: int, workers: int, uneven: str, names: list[str]) -> list[list[str]]:
    out = []
    for r in range(world):
        mine = []
        for w in range(max(1, workers)):
            mine += sharding.shard(
                len(names),
                rank=r,
                world_size=world,
                worker=w,
                num_workers=workers,
                epoch=1,
                seed=4,
                uneven=uneven,  # type: ignore[arg-type]
            )
        out.append(sorted(names[i] for i in mine))
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_real_ranks_and_workers_cover_every_file(
    dist_pool, volume_dir: Path, cache_dir: Path, world: int
):
    make_files(volume_dir, N_FILES)
    names = sorted(identity(str(p)) for p in volume_dir.rglob("*.bin"))
    pool = dist_pool(world)
    for workers, uneven in [(0, "drop"), (3, "pad"), (2, "drop")]:
        got = pool.run(_rank_files, str(volume_dir), str(cache_dir), workers, uneven, None)
        per_rank = {len(g) for g in got}
        assert len(per_rank) == 1, f"unequal counts per rank: {[len(g) for g in got]}"
        seen = Counter(n for g in got for n in g)
        if uneven == "drop":
            assert max(seen.values()) == 1 and len(seen) == N_FILES - N_FILES % world
        else:
            assert set(seen) == set(names)
            assert sum(seen.values()) == -(-N_FILES // world) * world
        assert [sorted(g) for g in got] == _expected(world, workers, uneven, names)


def test_dataset_built_before_init_process_group_still_shards(
    dist_pool, volume_dir: Path, cache_dir: Path
):
    make_files(volume_dir, 20)
    results = dist_pool(2).run(_built_before_init, str(volume_dir), str(cache_dir), free_port())
    assert [u for u, _ in results] == [20, 20]  # no group yet: one rank, everything
    a, b = (set(files) for _, files in results)
    assert len(a) == len(b) == 10 and not a & b


def test_spawned_workers_shard_by_the_parent_rank(dist_pool, volume_dir: Path, cache_dir: Path):
    """Workers started with "spawn" have no process group: the rank comes with the dataset."""
    make_files(volume_dir, 12)
    got = dist_pool(2).run(_rank_files, str(volume_dir), str(cache_dir), 1, "pad", "spawn")
    assert len(got[0]) == len(got[1]) == 6
    assert not set(got[0]) & set(got[1])
