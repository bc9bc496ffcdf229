"""VolumeDataset and DataLoader in one process (and its DataLoader workers): listing, caching,
shuffle, resume, counters. Test bodies take the volume directory as the ``volume_dir``
fixture."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torchtest_util import identity, make_files, on_mount, plain_only, tree_size

import airfs.data.dataset as dataset_mod
import airfs.data.localcache as localcache
from airfs.control.client import ControlError
from airfs.data import DataLoader, VolumeDataset
from airfs.data.localcache import LocalCache

pytestmark = pytest.mark.torch


def _rel(paths, root=None):
    return [identity(p) for p in paths]


def _flat(batches):
    return [p for b in batches for p in b]


# --------------------------------------------------------------------------- listing / paths


def test_lists_once_sorted_with_pattern_filter_and_hidden(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 6)
    (volume_dir / ".hidden").write_bytes(b"x")
    (volume_dir / "class0" / ".partial.tmp").write_bytes(b"x")
    (volume_dir / "notes.txt").write_bytes(b"x")
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir)
    rels = [os.path.relpath(f, volume_dir) for f in ds.files]
    assert rels == sorted(rels)
    assert len(rels) == 7 and ".hidden" not in rels
    assert VolumeDataset(volume_dir, pattern="*.bin", cache_dir=cache_dir).files == tuple(
        f for f in ds.files if f.endswith(".bin")
    )
    only1 = VolumeDataset(volume_dir, pattern="class1/*", cache_dir=cache_dir)
    assert [os.path.relpath(f, volume_dir) for f in only1.files] == [
        "class1/item00001.bin",
        "class1/item00004.bin",
    ]
    odd = VolumeDataset(volume_dir, filter=lambda p: p.endswith("1.bin"), cache_dir=cache_dir)
    assert len(odd.files) == 1
    hidden = VolumeDataset(volume_dir, include_hidden=True, cache_dir=cache_dir)
    assert len(hidden.files) == 9
    # listed once: files added later are not seen
    (volume_dir / "late.bin").write_bytes(b"late")
    assert len(list(ds)) == 7


def test_yields_local_copies_with_the_same_content_and_directories(
    volume_dir: Path, cache_dir: Path
):
    make_files(volume_dir, 12, size=3000)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir, shuffle=False)
    paths = list(ds)
    assert len(paths) == 12
    if on_mount(volume_dir):  # the mount is the cache: its own paths, no second copy
        assert paths == list(ds.files)
        assert tree_size(cache_dir) == 0
        return
    for src, local in zip(ds.files, paths, strict=True):
        assert local.startswith(str(cache_dir))
        assert local.endswith(os.path.relpath(src, volume_dir))  # class dirs survive
        assert Path(local).read_bytes() == Path(src).read_bytes()
    assert tree_size(cache_dir) == 12 * 3000


def test_without_local_cache_yields_origin_paths(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 5)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir, local_cache=False, shuffle=False)
    assert list(ds) == list(ds.files)
    assert tree_size(cache_dir) == 0


def test_explicit_rank_and_world_size(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 10)
    got = [
        _rel(VolumeDataset(volume_dir, cache_dir=cache_dir, rank=r, world_size=3, uneven="drop"))
        for r in range(3)
    ]
    assert all(len(g) == 3 for g in got)
    assert len(set().union(*map(set, got))) == 9
    with pytest.raises(ValueError):
        VolumeDataset(volume_dir, rank=1)


# ------------------------------------------------------------------------------ shuffle


def test_shuffle_is_deterministic_per_seed_and_epoch(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 40)
    a = VolumeDataset(volume_dir, cache_dir=cache_dir, seed=7)
    b = VolumeDataset(volume_dir, cache_dir=cache_dir, seed=7)
    assert _rel(a) == _rel(b)
    e0 = _rel(a)
    a.set_epoch(1)
    e1 = _rel(a)
    assert e1 != e0 and sorted(e1) == sorted(e0)
    assert _rel(VolumeDataset(volume_dir, cache_dir=cache_dir, seed=8)) != e0
    assert _rel(VolumeDataset(volume_dir, cache_dir=cache_dir, shuffle=False)) == sorted(e0)


def test_set_epoch_reaches_persistent_workers(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 30)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir, seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    fresh = VolumeDataset(volume_dir, cache_dir=cache_dir, seed=1)
    for epoch in range(3):
        ds.set_epoch(epoch)
        fresh.set_epoch(epoch)
        got = _rel(loader)
        expected = _rel(DataLoader(fresh, batch_size=None, num_workers=2))
        assert got == expected
        assert sorted(got) == sorted(identity(f) for f in ds.files)
    assert loader._iterator is not None  # the same workers served every epoch


# ------------------------------------------------------------------------------- resume


def test_resume_in_process_reproduces_the_rest(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 25)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir, seed=3)
    ds.set_epoch(2)
    full = _rel(ds)
    it = iter(ds)
    head = [identity(next(it)) for _ in range(9)]
    state = ds.state_dict()
    assert state["epoch"] == 2 and state["positions"] == [9]
    it.close()

    again = VolumeDataset(volume_dir, cache_dir=cache_dir, seed=0)  # seed comes from the state
    again.load_state_dict(state)
    again.set_epoch(2)  # same epoch: the resume state stays
    rest = _rel(again)
    assert head + rest == full
    again.set_epoch(3)  # another epoch: whole
    assert len(_rel(again)) == 25


@pytest.mark.parametrize(("workers", "batch", "stops"), [(2, 4, [0, 1, 5, 6]), (3, 2, [3, 8])])
def test_resume_through_dataloader_reproduces_the_rest(
    volume_dir: Path, cache_dir: Path, workers: int, batch: int, stops: list[int]
):
    make_files(volume_dir, 23)  # uneven per worker, partial last batches
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir, seed=5)
    full = [_rel(b) for b in DataLoader(ds, batch_size=batch, num_workers=workers)]
    assert sum(map(len, full)) == 23
    for stop in stops:
        ds = VolumeDataset(volume_dir, cache_dir=cache_dir, seed=5)
        loader = DataLoader(ds, batch_size=batch, num_workers=workers)
        it = iter(loader)
        head = [_rel(next(it)) for _ in range(stop)]
        state = loader.state_dict()
        del it

        resumed = VolumeDataset(volume_dir, cache_dir=cache_dir)
        loader2 = DataLoader(resumed, batch_size=batch, num_workers=workers)
        loader2.load_state_dict(state)
        rest = [_rel(b) for b in loader2]
        assert _flat(head) + _flat(rest) == _flat(full), f"stop={stop}"
        assert loader2.state_dict()["dataset"]["positions"] == [
            len(range(w, 23, workers)) for w in range(workers)
        ]


def test_resume_with_another_worker_count(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 31)
    everything = Counter(identity(f) for f in VolumeDataset(volume_dir, cache_dir=cache_dir).files)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir)
    loader = DataLoader(ds, batch_size=3, num_workers=2)
    it = iter(loader)
    first = _flat(_rel(next(it)) for _ in range(3))
    state1 = loader.state_dict()
    del it

    ds2 = VolumeDataset(volume_dir, cache_dir=cache_dir)
    ds2.load_state_dict(state1["dataset"])
    loader2 = DataLoader(ds2, batch_size=2, num_workers=3)
    it2 = iter(loader2)
    second = _flat(_rel(next(it2)) for _ in range(4))
    state2 = loader2.state_dict()
    del it2
    assert len(state2["dataset"]["history"]) == 1

    ds3 = VolumeDataset(volume_dir, cache_dir=cache_dir)
    ds3.load_state_dict(state2["dataset"])
    third = _rel(ds3)  # in-process now: a third worker count
    assert Counter(first) + Counter(second) + Counter(third) == everything


def test_resume_refuses_another_world_size_rank_or_listing(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 10)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir, rank=1, world_size=2)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    it.close()
    for kwargs in ({"rank": 0, "world_size": 1}, {"rank": 0, "world_size": 2}):
        other = VolumeDataset(volume_dir, cache_dir=cache_dir, **kwargs)
        other.load_state_dict(state)
        with pytest.raises(RuntimeError):
            list(other)
    make_files(volume_dir, 11)
    grown = VolumeDataset(volume_dir, cache_dir=cache_dir, rank=1, world_size=2)
    grown.load_state_dict(state)
    with pytest.raises(RuntimeError):
        list(grown)
    with pytest.raises(ValueError):
        grown.load_state_dict({"epoch": 1})


class PathsToBytes(torch.utils.data.IterableDataset):
    """A decoding wrapper that is also Stateful, as torchdata's StatefulDataLoader wants."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self):
        for p in self.paths:
            yield identity(p)

    def state_dict(self):
        return self.paths.state_dict()

    def load_state_dict(self, state):
        self.paths.load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resume(volume_dir: Path, cache_dir: Path, workers: int):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    make_files(volume_dir, 17)

    def loader(ds):
        return sdl.StatefulDataLoader(PathsToBytes(ds), batch_size=2, num_workers=workers)

    full = _flat(loader(VolumeDataset(volume_dir, cache_dir=cache_dir)))
    dl = loader(VolumeDataset(volume_dir, cache_dir=cache_dir))
    it = iter(dl)
    head = _flat(next(it) for _ in range(3))
    state = dl.state_dict()
    del it
    dl2 = loader(VolumeDataset(volume_dir, cache_dir=cache_dir))
    dl2.load_state_dict(state)
    assert head + _flat(dl2) == full


# ------------------------------------------------------------------------ local cache


def test_no_origin_reads_in_epoch_two(
    volume_dir: Path, cache_dir: Path, tmp_path: Path, monkeypatch
):
    """Counts calls of the one function that reads the origin, across DataLoader workers (a
    log file, since workers are processes). Fails if epoch 2 copies anything."""
    plain_only(volume_dir, "on a mount the daemon reads the origin (count it there)")
    make_files(volume_dir, 40, size=2000)
    log = tmp_path / "origin-reads.log"
    real_copy = localcache.copy_from_origin

    def counting_copy(src: str, dst: str) -> int:
        with open(log, "a") as f:
            f.write(src + "\n")
        return real_copy(src, dst)

    monkeypatch.setattr(localcache, "copy_from_origin", counting_copy)

    def reads() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    ds = VolumeDataset(volume_dir, cache_dir=cache_dir)
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    ds.set_epoch(0)
    epoch1 = _flat(_rel(b) for b in loader)
    assert sorted(reads()) == sorted(ds.files)  # every file read from the origin once
    assert ds.stats().origin_copies == 40
    ds.set_epoch(1)
    epoch2 = _flat(_rel(b) for b in loader)
    assert sorted(epoch2) == sorted(epoch1) and epoch2 != epoch1
    assert len(reads()) == 40, "epoch 2 read the origin"
    assert ds.stats().cache_hits == 40


def test_epoch_two_survives_the_origin_going_away(volume_dir: Path, cache_dir: Path):
    """Plain directories only: deletes the origin files after epoch 1."""
    plain_only(volume_dir, "deleting through a mount deletes what the mount serves")
    files = make_files(volume_dir, 20)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir)
    first = sorted(_rel(ds))
    for f in files:
        f.unlink()
    ds.set_epoch(1)
    assert sorted(_rel(ds)) == first


def test_local_cache_stays_under_its_limit(volume_dir: Path, cache_dir: Path):
    plain_only(volume_dir, "no local cache of its own on a mount")
    make_files(volume_dir, 100, size=10_000)
    # 40 of 100 files; what is in flight must fit (here at most 2 workers x (2 batches of 4 +
    # 4 copies ahead) = 24 files), or a path could be evicted before it is read
    limit = 400_000
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir, cache_max_bytes=limit, prefetch_files=4)
    loader = DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor=1)
    seen = []
    for batch in loader:
        seen += _rel(batch)  # every path readable when yielded
        assert tree_size(cache_dir) <= limit + 2 * 4 * 10_000  # + copies in flight
    assert sorted(seen) == sorted(identity(f) for f in ds.files)
    assert tree_size(cache_dir) <= limit
    cache = LocalCache(cache_dir, limit)
    assert cache.usage() == tree_size(cache_dir)
    assert cache.scan() == tree_size(cache_dir)


def test_local_cache_concurrent_copies_publish_one_file(tmp_path: Path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(200_000))
    st = src.stat()
    cache = LocalCache(tmp_path / "c", 10_000_000)
    dest = cache.path_for("ns", "a/src.bin")
    results: list[tuple[str, bool]] = []

    def get() -> None:
        results.append(cache.get(str(src), dest, st.st_size, st.st_mtime_ns))

    threads = [threading.Thread(target=get) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {p for p, _ in results} == {dest}
    assert Path(dest).read_bytes() == src.read_bytes()
    assert cache.usage() == 200_000  # counted once
    assert sorted(os.listdir(os.path.dirname(dest))) == ["src.bin"]  # no temp files left

    # a changed source (new size/mtime) replaces the stale copy
    src.write_bytes(b"new")
    st2 = src.stat()
    path, hit = cache.get(str(src), dest, st2.st_size, st2.st_mtime_ns)
    assert not hit and Path(path).read_bytes() == b"new"
    assert cache.usage() == 3
    with pytest.raises(ValueError):
        cache.path_for("ns", "../escape")


def test_local_cache_evicts_least_recently_used(tmp_path: Path):
    origin = tmp_path / "o"
    files = make_files(origin, 6, size=1000, subdirs=1)
    cache = LocalCache(tmp_path / "c", 4000, low_water=1.0)

    def get(i: int) -> tuple[str, bool]:
        st = files[i].stat()
        rel = os.path.relpath(files[i], origin)
        return cache.get(str(files[i]), cache.path_for("n", rel), st.st_size, st.st_mtime_ns)

    for i in range(4):
        get(i)
    assert get(0)[1]  # hit: 0 is now the most recently used
    get(4)  # over the limit: evicts 1, the least recently used
    assert cache.usage() == 4000
    assert get(0)[1] and get(2)[1] and get(3)[1] and get(4)[1]
    assert not get(1)[1]
    assert cache.stats().evictions >= 1


def test_copy_errors_propagate(volume_dir: Path, cache_dir: Path):
    plain_only(volume_dir, "on a mount the dataset does not read files (the decoder does)")
    files = make_files(volume_dir, 5)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir, shuffle=False)
    files[3].unlink()
    with pytest.raises(FileNotFoundError):
        list(ds)


# --------------------------------------------------------- mount mode (daemon stand-in)


def test_mount_mode_asks_for_prefetch_ahead_and_yields_mount_paths(
    volume_dir: Path, cache_dir: Path, monkeypatch
):
    """The daemon is replaced by a recorder here; the mount fixture runs the real thing."""
    make_files(volume_dir, 50)
    requests: list[list[str]] = []
    monkeypatch.setattr(dataset_mod.client, "find_mount", lambda path: str(volume_dir))
    monkeypatch.setattr(
        dataset_mod.client, "prefetch", lambda mp, paths: requests.append(list(paths))
    )
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir, prefetch_files=8)
    out = []
    submitted = []  # requests submitted (synchronously) when each path was yielded
    for p in ds:
        out.append(p)
        submitted.append(ds.stats().prefetch_requests)
        deadline = time.monotonic() + 10
        while len(requests) < submitted[-1] and time.monotonic() < deadline:
            time.sleep(0.001)  # let the background thread send them (else cancelled at the end)
    asked = [q for r in requests for q in r]
    assert asked == out  # every file asked for once, in iteration order
    assert all(len(r) <= 8 for r in requests)
    ends = [sum(len(r) for r in requests[:k]) for k in range(len(requests) + 1)]
    for i, k in enumerate(submitted):
        assert ends[k] >= min(len(out), i + 1 + 8 // 2)  # always at least 4 files ahead
    assert set(out) == set(ds.files)
    assert tree_size(cache_dir) == 0  # no second copy on a mount
    assert ds.stats().prefetch_requests == len(requests)


def test_mount_mode_goes_on_without_prefetch_when_the_daemon_fails(
    volume_dir: Path, cache_dir: Path, monkeypatch, caplog
):
    make_files(volume_dir, 40)
    monkeypatch.setattr(dataset_mod.client, "find_mount", lambda path: str(volume_dir))
    calls = []

    def failing(mp, paths):
        calls.append(paths)
        raise ControlError("cannot reach the airfs daemon")

    monkeypatch.setattr(dataset_mod.client, "prefetch", failing)
    monkeypatch.setattr(localcache, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="airfs.data"):
        ds = VolumeDataset(volume_dir, cache_dir=cache_dir, prefetch_files=4)
        assert len(list(ds)) == 40
        assert len(list(ds)) == 40
    warnings = [r for r in caplog.records if "prefetch" in r.getMessage()]
    assert len(warnings) == 1
    assert len(calls) <= 4  # stopped asking soon after the first failure


# ----------------------------------------------------------------------------- loader


def test_dataloader_defaults_and_wait_counters(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 24)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir)
    loader = DataLoader(ds, batch_size=4)
    assert loader.num_workers >= 1
    assert loader.prefetch_factor == 4 and loader.persistent_workers
    assert loader.pin_memory == torch.cuda.is_available()
    assert loader.volume_dataset is ds
    waits = []
    for _batch in loader:
        waits.append(loader.last_wait_s)
    stats = loader.stats()
    assert stats.batches == len(waits) == 6
    # each next() is timed: the counters are the per-batch waits, summed and maxed
    assert all(w > 0 for w in waits), waits
    assert stats.wait_s == pytest.approx(sum(waits))
    assert (stats.max_wait_s, stats.last_wait_s) == (max(waits), waits[-1])
    assert stats.files == 24
    assert stats.origin_copies == (0 if on_mount(volume_dir) else 24)
    if stats.origin_copies:
        assert stats.fetch_wait_s > 0  # the workers waited on their copies
    plain = DataLoader(list(range(10)), batch_size=5, num_workers=0)
    assert [b.tolist() for b in plain] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    with pytest.raises(RuntimeError):
        plain.state_dict()


def test_dataloader_finds_the_dataset_inside_a_wrapper(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 9)
    ds = VolumeDataset(volume_dir, cache_dir=cache_dir)
    loader = DataLoader(PathsToBytes(ds), batch_size=2, num_workers=2)
    assert loader.volume_dataset is ds
    assert sorted(_flat(loader)) == sorted(identity(f) for f in ds.files)
    assert loader.state_dict()["dataset"]["positions"] == [5, 4]


class Dropping(torch.utils.data.IterableDataset):
    """Not one sample per path: the loader cannot count progress, and must say so."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self):
        for i, p in enumerate(self.paths):
            if i % 2 == 0:
                yield identity(p)


def test_dataloader_state_refuses_a_filtering_wrapper(volume_dir: Path, cache_dir: Path):
    make_files(volume_dir, 20)
    loader = DataLoader(
        Dropping(VolumeDataset(volume_dir, cache_dir=cache_dir)), batch_size=2, num_workers=2
    )
    list(loader)
    with pytest.raises(RuntimeError):
        loader.state_dict()
