"""VolumeWriter / VolumeReader / latest_checkpoint with real gloo process groups. Test bodies
take the volume directory as the ``volume_dir`` fixture."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from distpool import run_group
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import airfs.data.checkpoint as ckpt_mod
from airfs.data.checkpoint import VolumeReader, VolumeWriter, is_complete, latest_checkpoint

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("numpy") is None,
        reason="torch.distributed object collectives (used by DCP) need numpy",
    ),
]


def make_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model and an Adam optimizer with state (one step taken)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def flat_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
    """Every parameter and optimizer state tensor, concatenated."""
    parts = [p.detach().flatten() for p in model.parameters()]
    for state in opt.state.values():
        parts += [v.detach().flatten().float() for v in state.values() if torch.is_tensor(v)]
    return torch.cat(parts)


def sharded(full: torch.Tensor):
    """``full`` as a DTensor sharded by rows over the default group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return distribute_tensor(full, mesh, [Shard(0)])


# ------------------------------------------------------------------ functions run on ranks


def _save(path: str, seed: int, asynchronous: bool = False, **writer_kwargs) -> dict:
    model, opt = make_model(seed)
    msd, osd = get_state_dict(model, opt)
    state = {
        "model": msd,
        "optim": osd,
        "step": 1000 + seed,
        "table": sharded(torch.arange(48.0).reshape(12, 4) + seed),
    }
    writer = VolumeWriter(path, **writer_kwargs)
    t0 = time.perf_counter()
    if asynchronous:
        fut = dcp.async_save(state, storage_writer=writer)
        blocked = time.perf_counter() - t0
        fut.result()
    else:
        dcp.save(state, storage_writer=writer)
        blocked = time.perf_counter() - t0
    dist.barrier()
    return {
        "flat": flat_state(model, opt),
        "blocked": blocked,
        "files": sorted(os.listdir(path)),
    }


def _load(path: str, reader_cls: type = VolumeReader) -> dict:
    model, opt = make_model(seed=12345)  # different values: the load must replace them
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": 0, "table": sharded(torch.zeros(12, 4))}
    dcp.load(state, storage_reader=reader_cls(path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return {
        "flat": flat_state(model, opt),
        "step": state["step"],
        "table": state["table"].full_tensor(),
        "local_rows": state["table"].to_local().shape[0],
    }


class FailingWriter(VolumeWriter):
    """Writes its shards, then fails on rank ``fail_rank`` (raises, or kills the process)."""

    def __init__(self, path: str, fail_rank: int, how: str) -> None:
        super().__init__(path)
        self.fail_rank = fail_rank
        self.how = how

    def write_data(self, plan, planner):
        if dist.get_rank() != self.fail_rank:
            return super().write_data(plan, planner)
        fut = torch.distributed.checkpoint.FileSystemWriter.write_data(self, plan, planner)
        fut.wait()  # shards on disk, not reported
        if self.how == "kill":
            os._exit(3)
        raise OSError("disk on fire")


def _save_failing(path: str, fail_rank: int, how: str) -> str:
    model, opt = make_model(0)
    msd, osd = get_state_dict(model, opt)
    try:
        dcp.save({"model": msd, "optim": osd}, storage_writer=FailingWriter(path, fail_rank, how))
    except CheckpointException as exc:
        return {rank: type(err[0]).__name__ for rank, err in exc.failures.items()}
    return "saved"


def _record_commits(path: str, log: str) -> None:
    """Save with the daemon stood in by a recorder: which files existed at each flush."""
    real_find, real_flush = ckpt_mod.client.find_mount, ckpt_mod.client.flush

    def flush(mountpoint: str, p: str | None = None, timeout: float | None = None) -> dict:
        with open(log, "a") as f:
            names = ",".join(sorted(os.listdir(path)))
            f.write(f"{dist.get_rank()} {mountpoint} {p} {names}\n")
        return {}

    ckpt_mod.client.find_mount = lambda p: os.path.dirname(path)
    ckpt_mod.client.flush = flush
    try:
        model, opt = make_model(0)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, storage_writer=VolumeWriter(path, thread_count=1))
    finally:
        ckpt_mod.client.find_mount, ckpt_mod.client.flush = real_find, real_flush


# ------------------------------------------------------------------------------- tests


def test_save_and_load_model_and_optimizer_across_two_ranks(dist_pool, volume_dir: Path):
    path = str(volume_dir / "ckpt" / "step_1000")
    saved = dist_pool(2).run(_save, path, 0)
    assert is_complete(path)
    names = saved[0]["files"]
    assert ".metadata" in names
    assert any(n.startswith("__0_") for n in names) and any(n.startswith("__1_") for n in names)
    assert not [n for n in names if n.endswith(".tmp")]
    loaded = dist_pool(2).run(_load, path)
    for r in range(2):
        assert torch.equal(loaded[r]["flat"], saved[r]["flat"])
        assert loaded[r]["step"] == 1000
        assert torch.equal(loaded[r]["table"], torch.arange(48.0).reshape(12, 4))
    assert latest_checkpoint(volume_dir / "ckpt") == path


def test_async_save_then_load(dist_pool, volume_dir: Path):
    path = str(volume_dir / "ckpt" / "async")
    saved = dist_pool(2).run(_save, path, 1, asynchronous=True)
    assert is_complete(path)
    loaded = dist_pool(2).run(_load, path)
    assert all(torch.equal(a["flat"], b["flat"]) for a, b in zip(saved, loaded, strict=True))
    assert loaded[0]["step"] == 1001


def test_load_into_other_world_sizes(dist_pool, volume_dir: Path):
    path = str(volume_dir / "ckpt" / "resize")
    saved = dist_pool(2).run(_save, path, 2)
    three = dist_pool(3).run(_load, path)
    expected = torch.arange(48.0).reshape(12, 4) + 2
    assert [r["local_rows"] for r in three] == [4, 4, 4]
    for r in three:
        assert torch.equal(r["table"], expected)
        assert torch.equal(r["flat"], saved[0]["flat"])
    # one process, no process group
    model, opt = make_model(seed=99)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": 0, "table": torch.zeros(12, 4)}
    dcp.load(state, storage_reader=VolumeReader(path), no_dist=True)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert torch.equal(flat_state(model, opt), saved[0]["flat"])
    assert torch.equal(state["table"], expected)


def test_standard_dcp_format_both_ways(dist_pool, volume_dir: Path):
    ours = str(volume_dir / "ours")
    theirs = str(volume_dir / "theirs")
    saved = dist_pool(2).run(_save, ours, 3)
    loaded = dist_pool(2).run(_load, ours, dcp.FileSystemReader)
    assert torch.equal(loaded[0]["flat"], saved[0]["flat"])

    state = {"w": torch.arange(10.0), "nested": {"b": torch.ones(3, 3)}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(theirs), no_dist=True)
    back = {"w": torch.zeros(10), "nested": {"b": torch.zeros(3, 3)}}
    dcp.load(back, storage_reader=VolumeReader(theirs), no_dist=True)
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["nested"]["b"], torch.ones(3, 3))


def test_refuses_to_overwrite_a_complete_checkpoint_unless_asked(volume_dir: Path):
    path = str(volume_dir / "c")
    early = VolumeWriter(path)  # made before the checkpoint below is complete
    dcp.save({"x": torch.ones(4)}, storage_writer=VolumeWriter(path), no_dist=True)
    with pytest.raises(FileExistsError, match="already holds a complete checkpoint"):
        VolumeWriter(path)  # refused where ``except FileExistsError`` catches it
    with pytest.raises(CheckpointException) as info:  # completed since it was made
        dcp.save({"x": torch.zeros(4)}, storage_writer=early, no_dist=True)
    assert isinstance(info.value.failures[0][0], FileExistsError)
    dcp.save(
        {"x": torch.full((4,), 7.0)},
        storage_writer=VolumeWriter(path, overwrite=True),
        no_dist=True,
    )
    out = {"x": torch.zeros(4)}
    dcp.load(out, storage_reader=VolumeReader(path), no_dist=True)
    assert torch.equal(out["x"], torch.full((4,), 7.0))
    with pytest.raises(CheckpointException):  # wraps the reader's FileNotFoundError
        dcp.load(out, storage_reader=VolumeReader(str(volume_dir / "missing")), no_dist=True)


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_failed_save_leaves_no_metadata(dist_pool, volume_dir: Path, how: str):
    root = volume_dir / "runs"
    good = str(root / "step_1")
    dist_pool(2).run(_save, good, 0)
    bad = str(root / "step_2")
    if how == "raise":
        outcome = dist_pool(2).run(_save_failing, bad, 1, how)
        assert outcome == [{1: "OSError"}, {1: "OSError"}]  # every rank hears of the failure
    else:  # a fresh group: rank 1 dies half way, rank 0 must not write .metadata
        outcome = run_group(2, _save_failing, bad, 1, how, timeout=90)
        assert outcome[1][0] == "died" and outcome[1][2] == 3
        assert outcome[0][0] in ("ok", "err") and outcome[0][1] != "saved"
    assert any(n.startswith("__1_") for n in os.listdir(bad))  # rank 1 did write shards
    assert not is_complete(bad)
    assert latest_checkpoint(root) == good


def test_commit_barrier_order_on_a_mount(dist_pool, volume_dir: Path, tmp_path: Path):
    """The daemon is a recorder here (the mount fixture runs the real one): every rank flushes
    after its shards are written, and the coordinator flushes before and after .metadata."""
    path = str(volume_dir / "barrier")
    log = tmp_path / "flush.log"
    dist_pool(2).run(_record_commits, path, str(log))
    lines = [line.split(" ") for line in log.read_text().splitlines()]
    assert {(rank, mp, p) for rank, mp, p, _ in lines} == {
        ("0", str(volume_dir), path),
        ("1", str(volume_dir), path),
    }
    by_rank = {r: [names.split(",") for rank, _, _, names in lines if rank == r] for r in "01"}
    # each rank's first flush sees its own shards and no .metadata
    for r in "01":
        first = by_rank[r][0]
        assert any(n.startswith(f"__{r}_") for n in first) and ".metadata" not in first
    # the coordinator: flush (no .metadata, both ranks' shards), then flush with .metadata
    coord = by_rank["0"]
    assert len(coord) == 3
    assert ".metadata" not in coord[1] and any(n.startswith("__1_") for n in coord[1])
    assert ".metadata" in coord[2]
    assert len(by_rank["1"]) == 1


class RecordingReader(VolumeReader):
    reads: list[tuple[str, int]] = []

    def _slice_file(self, file, sinfo):
        RecordingReader.reads.append((sinfo.relative_path, sinfo.offset))
        return super()._slice_file(file, sinfo)


def test_reads_sorted_by_offset_and_prefetched(volume_dir: Path, monkeypatch):
    path = str(volume_dir / "many")
    state = {f"t{i:02d}": torch.full((100,), float(i)) for i in range(30)}
    dcp.save(state, storage_writer=VolumeWriter(path, thread_count=1), no_dist=True)
    asked: list[list[str]] = []
    monkeypatch.setattr(ckpt_mod.client, "find_mount", lambda p: str(volume_dir))
    monkeypatch.setattr(ckpt_mod.client, "prefetch", lambda mp, paths: asked.append(list(paths)))
    # ask for the tensors in reverse name order: the reader must still read forward
    back = {k: torch.zeros(100) for k in sorted(state, reverse=True)}
    RecordingReader.reads = []
    dcp.load(back, storage_reader=RecordingReader(path), no_dist=True)
    assert all(torch.equal(back[k], state[k]) for k in state)
    offsets = [off for _, off in RecordingReader.reads]
    assert len(offsets) == 30 and offsets == sorted(offsets)
    assert asked == [[os.path.join(path, "__0_0.distcp")]]


def test_latest_checkpoint(volume_dir: Path):
    root = volume_dir / "ck"
    assert latest_checkpoint(root) is None  # no directory yet
    root.mkdir()
    assert latest_checkpoint(root) is None
    for name in ("step_9", "step_10", "step_2"):
        (root / name).mkdir()
        (root / name / ".metadata").write_bytes(b"x")
        os.utime(root / name / ".metadata", ns=(10**18, 10**18))  # same time: names decide
    assert latest_checkpoint(root) == str(root / "step_10")
    (root / "step_11").mkdir()  # newer, incomplete
    (root / "step_11" / "__0_0.distcp").write_bytes(b"x")
    assert latest_checkpoint(root) == str(root / "step_10")
    os.utime(root / "step_2" / ".metadata")  # written last
    assert latest_checkpoint(root) == str(root / "step_2")


def test_writer_refuses_use_collectives_false(volume_dir: Path):
    with pytest.raises(ValueError):
        VolumeWriter(volume_dir / "x").set_up_storage_writer(True, rank=0, use_collectives=False)
