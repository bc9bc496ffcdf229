"""``TableDataset`` in one process and with DataLoader workers: coverage, deterministic shuffle,
items, exact mid-epoch resume (in-process and through torchdata's ``StatefulDataLoader``), and
the refusals; on a plain directory and through a real airfs mount (``table_dir``)."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import deltalake
import numpy as np
import pyarrow.compute as pc
import pytest
import torch
from tabletest_util import ids_of, rows_table, write_parquet_dir
from torch.utils.data import DataLoader

from airfs.tables import TableDataset, delta_write_options, read_table
from airfs.tables import reader as reader_mod

SIZES = [130, 41, 257, 90]  # 518 rows, row groups of 32: 5 + 2 + 9 + 3 units


@pytest.fixture
def table(table_dir: Path) -> Path:
    """The test table, on a plain directory and through a mount."""
    write_parquet_dir(table_dir / "t", SIZES, row_group_size=32)
    return table_dir / "t"


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    """The test table on a plain directory only (what does not depend on where files are)."""
    write_parquet_dir(tmp_path / "t", SIZES, row_group_size=32)
    return tmp_path / "t"


def test_every_row_once_in_batches(table: Path):
    ds = TableDataset(table, batch_rows=50, seed=1)
    items = list(ds)
    assert [len(b["id"]) for b in items] == [50] * 10 + [18]
    assert sorted(ids_of(items)) == list(range(sum(SIZES)))
    assert len(ds) == 11 and ds.num_rows == 518
    b = items[0]
    assert set(b) == {"id", "g", "x", "s"}
    assert b["id"].dtype == np.int64 and b["s"].dtype == object
    assert np.all(b["x"] == b["id"] * 0.5) and np.all(b["g"] == b["id"] % 4)  # rows stay whole


def test_shuffle_is_deterministic_per_seed_and_epoch(plain: Path):
    def order(seed: int, epoch: int, **kw) -> list[int]:
        ds = TableDataset(plain, batch_rows=64, seed=seed, **kw)
        ds.set_epoch(epoch)
        return ids_of(ds)

    a = order(3, 0)
    assert a == order(3, 0)
    assert a != order(3, 1) and a != order(4, 0)
    assert sorted(a) == sorted(order(3, 1)) == list(range(518))
    in_file_order = read_table(plain).column("id").to_pylist()  # files sorted by path
    assert order(3, 5, shuffle=False) == in_file_order

    # rows are shuffled inside windows too, not only units (19 units: at most 18 breaks)
    def breaks(ids: list[int]) -> int:
        return sum(b - a != 1 for a, b in itertools.pairwise(ids))

    assert breaks(order(3, 0, shuffle_rows=1)) <= 18
    assert breaks(order(3, 0, shuffle_rows=1000)) > 400


def test_single_rows_torch_output_columns_and_filter(plain: Path):
    ds = TableDataset(
        plain, columns=["id", "x"], filter=pc.field("g") == 1, output="torch", shuffle=False
    )
    rows = list(ds)
    in_file_order = read_table(plain).column("id").to_pylist()
    assert [int(r["id"]) for r in rows] == [i for i in in_file_order if i % 4 == 1]
    assert set(rows[0]) == {"id", "x"} and isinstance(rows[0]["id"], torch.Tensor)
    assert ds.num_rows == len(rows)
    batch = next(iter(TableDataset(plain, batch_rows=7, output="torch")))
    assert batch["id"].dtype == torch.int64 and batch["id"].shape == (7,)
    assert isinstance(batch["s"], np.ndarray)  # strings stay NumPy
    arrow = next(iter(TableDataset(plain, batch_rows=9, output="arrow")))
    assert arrow.num_rows == 9 and arrow.column_names == ["id", "g", "x", "s"]


@pytest.mark.parametrize("batch_rows", [None, 16])
def test_in_process_resume_is_exact(plain: Path, batch_rows):
    full = ids_of(TableDataset(plain, batch_rows=batch_rows, seed=9, shuffle_rows=100))
    ds = TableDataset(plain, batch_rows=batch_rows, seed=9, shuffle_rows=100)
    it = iter(ds)
    head = ids_of(next(it) for _ in range(13))
    state = ds.state_dict()
    del it
    again = TableDataset(plain, batch_rows=batch_rows, seed=9, shuffle_rows=100)
    again.load_state_dict(state)
    assert head + ids_of(again) == full
    # the state survives a trip through JSON-only types
    assert state["positions"] == [13 * (batch_rows or 1)]


def test_resume_with_another_worker_count(plain: Path):
    ds = TableDataset(plain, batch_rows=10, seed=2)
    it = iter(ds)
    head = ids_of(next(it) for _ in range(7))
    state = ds.state_dict()
    ds2 = TableDataset(plain, batch_rows=10, seed=2)
    ds2.load_state_dict(state)
    loader = DataLoader(ds2, batch_size=None, num_workers=2, multiprocessing_context="fork")
    rest = ids_of(loader)
    assert Counter(head) + Counter(rest) == Counter(range(518))


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resume_is_exact(table: Path, workers: int):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def loader(ds):
        return sdl.StatefulDataLoader(
            ds,
            batch_size=None,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
        )

    def make():
        return TableDataset(table, batch_rows=20, seed=5, shuffle_rows=64)

    full = ids_of(loader(make()))
    assert sorted(full) == list(range(518))
    dl = loader(make())
    it = iter(dl)
    head = ids_of(next(it) for _ in range(9))
    state = dl.state_dict()
    del it
    dl2 = loader(make())
    dl2.load_state_dict(state)
    assert head + ids_of(dl2) == full


def test_workers_split_rows_and_persistent_workers_see_set_epoch(plain: Path):
    ds = TableDataset(plain, batch_rows=25, seed=0)
    loader = DataLoader(
        ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context="fork"
    )
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        ids = ids_of(loader)
        assert sorted(ids) == list(range(518))
        epochs.append(ids)
    assert epochs[0] != epochs[1]
    expected = TableDataset(plain, batch_rows=25, seed=0)
    expected.set_epoch(1)
    ref = ids_of(
        DataLoader(expected, batch_size=None, num_workers=2, multiprocessing_context="fork")
    )
    assert epochs[1] == ref


def test_resume_refusals(plain: Path):
    ds = TableDataset(plain, batch_rows=10, rank=0, world_size=2)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    other_world = TableDataset(plain, batch_rows=10, rank=0, world_size=3)
    other_world.load_state_dict(state)
    with pytest.raises(RuntimeError, match="world size 2, the job now runs with 3"):
        next(iter(other_world))
    other_rank = TableDataset(plain, batch_rows=10, rank=1, world_size=2)
    other_rank.load_state_dict(state)
    with pytest.raises(RuntimeError, match="belongs to rank 0"):
        next(iter(other_rank))
    other_filter = TableDataset(plain, batch_rows=10, rank=0, world_size=2, filter=[("g", "=", 0)])
    other_filter.load_state_dict(state)
    with pytest.raises(RuntimeError, match="other data or options"):
        next(iter(other_filter))
    with pytest.raises(ValueError, match="'positions' missing"):
        ds.load_state_dict({k: v for k, v in state.items() if k != "positions"})


def test_changed_delta_version_is_refused(table_dir: Path):
    path = table_dir / "delta"
    opts = delta_write_options(path)
    deltalake.write_deltalake(str(path), rows_table(0, 300), storage_options=opts)
    ds = TableDataset(path, batch_rows=10)
    it = iter(ds)
    head = ids_of(next(it) for _ in range(4))
    state = ds.state_dict()
    deltalake.write_deltalake(str(path), rows_table(300, 50), mode="append", storage_options=opts)
    newer = TableDataset(path, batch_rows=10)
    newer.load_state_dict(state)
    with pytest.raises(RuntimeError, match=r"saved at version 0 .* reads version 1"):
        next(iter(newer))
    pinned = TableDataset(path, batch_rows=10, version=0)
    pinned.load_state_dict(state)
    assert Counter(head + ids_of(pinned)) == Counter(range(300))


def test_bad_arguments(plain: Path):
    with pytest.raises(ValueError, match="uneven must be"):
        TableDataset(plain, uneven="even")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_rows must be >= 1"):
        TableDataset(plain, batch_rows=0)
    with pytest.raises(ValueError, match="output='arrow' needs batch_rows"):
        TableDataset(plain, output="arrow")
    with pytest.raises(TypeError, match="list of column names"):
        TableDataset(plain, columns="id")  # type: ignore[arg-type]


def test_mount_prefetch_asks_for_the_next_files(table_dir: Path, monkeypatch):
    from airfs.control.client import find_mount

    if find_mount(str(table_dir)) is None:
        pytest.skip("needs an airfs mount")
    write_parquet_dir(table_dir / "many", [20] * 12, row_group_size=10)
    asked: list[list[str]] = []
    real = reader_mod.client.prefetch

    def recording(mountpoint, paths):
        asked.append(list(paths))
        return real(mountpoint, paths)

    monkeypatch.setattr(reader_mod.client, "prefetch", recording)
    # the requests still queued when the reading ends are cancelled by close() (right: every
    # file has been read); here they are let run, so that each request made is recorded
    # (under load the last one was still queued behind the one before)
    monkeypatch.setattr(
        reader_mod.MountPrefetch, "close", lambda self: self._pool.shutdown(wait=True)
    )
    off = TableDataset(table_dir / "many", batch_rows=5, mount_prefetch=False)
    assert sorted(ids_of(off)) == list(range(240))
    assert asked == []
    ds = TableDataset(
        table_dir / "many", batch_rows=5, shuffle=False, prefetch_files=4, mount_prefetch=True
    )
    assert sorted(ids_of(ds)) == list(range(240))
    flat = [p for req in asked for p in req]
    # every file after the first once, in reading order (the first is being read already)
    assert flat == [f.path for f in ds.source.files][1:]
    assert len(asked) >= 3 and all(len(req) <= 4 for req in asked)

    def failing(mountpoint, paths):
        raise OSError("daemon gone")

    monkeypatch.setattr(reader_mod.client, "prefetch", failing)
    failing_ds = TableDataset(table_dir / "many", batch_rows=5)  # on by default
    assert sorted(ids_of(failing_ds)) == list(range(240))
