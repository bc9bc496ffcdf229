"""The seed document's code samples, run against airfs.

Each sample is kept as the document prints it and changed only by :func:`adapt`: the module
``databricks.air.data`` becomes ``airfs.data`` (the import line, and the qualified names that
follow from it), ``/Volumes/...`` becomes the test's volume directory, and, on a machine
without GPUs, ``map_location=f"cuda:{local_rank}"`` becomes ``"cpu"``. The image sample needs
PIL and torchvision; where they are missing (torchvision from PyPI does not import beside this
torch build) the same wrapper is run with a decoder that needs neither (raw CHW bytes ->
``torch.frombuffer``). Test bodies take the volume directory as the ``volume_dir`` fixture.
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from airfs.control.client import find_mount

pytestmark = pytest.mark.torch

IMAGE_SAMPLE = '''
from databricks.air.data import UCVolumeDataset
from torch.utils.data import IterableDataset
from PIL import Image
import torchvision.transforms.functional as TF

class ImageDataset(IterableDataset):
    """Decodes each cached file path from UCVolumeDataset into a tensor."""

    def __init__(self, path_dataset: UCVolumeDataset):
        self._path_dataset = path_dataset

    def __iter__(self):
        for local_path in self._path_dataset:
            image = Image.open(local_path).convert("RGB")
            yield TF.to_tensor(image)

path_dataset = UCVolumeDataset("/Volumes/catalog/schema/my_volume/images")
dataset = ImageDataset(path_dataset)
'''

# The same sample with the PIL / torchvision decoding replaced (see module doc).
RAW_IMAGE_SAMPLE = '''
from databricks.air.data import UCVolumeDataset
from torch.utils.data import IterableDataset
import torch

class ImageDataset(IterableDataset):
    """Decodes each cached file path from UCVolumeDataset into a tensor."""

    def __init__(self, path_dataset: UCVolumeDataset):
        self._path_dataset = path_dataset

    def __iter__(self):
        for local_path in self._path_dataset:
            with open(local_path, "rb") as f:
                raw = bytearray(f.read())
            yield torch.frombuffer(raw, dtype=torch.uint8).reshape(3, 8, 8).float() / 255

path_dataset = UCVolumeDataset("/Volumes/catalog/schema/my_volume/images")
dataset = ImageDataset(path_dataset)
'''

DCP_SAMPLE = """
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import databricks.air.data

checkpoint_path = "/Volumes/my-catalog/my-schema/my-volume/checkpoints/step_1000"

# Save
model_sd, optim_sd = get_state_dict(model, optimizer)
state_dict = {"model": model_sd, "optim": optim_sd, "step": 1000}
dcp.async_save(
    state_dict,
    storage_writer=databricks.air.data.UCVolumeWriter(checkpoint_path))
"""

DCP_LOAD_SAMPLE = """
# Load
model_sd, optim_sd = get_state_dict(model, optimizer)
state_dict = {"model": model_sd, "optim": optim_sd}
dcp.load(
    state_dict,
    storage_reader=databricks.air.data.UCVolumeReader(checkpoint_path))

set_state_dict(
    model,
    optimizer,
    model_state_dict=state_dict["model"],
    optim_state_dict=state_dict["optim"],
)
"""

SINGLE_GPU_SAMPLE = """
# Save
torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()},
           "/Volumes/<catalog-name>/<schema-name>/<volume-name>/sub-dir/ckpt.pt")


# Load
ckpt = torch.load(
    "/Volumes/<catalog-name>/<schema-name>/<volume-name>/sub-dir/ckpt.pt",
    weights_only=True)
model.load_state_dict(ckpt["model"])
optimizer.load_state_dict(ckpt["opt"])
"""

TORCHRUN_SAMPLE = """
import os
import torch.distributed as dist

from airfs.control.client import find_mount

# Save only on rank 0.
if dist.get_rank() == 0:
    torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()},
               "/Volumes/<catalog-name>/<schema-name>/<volume-name>/sub-dir/ckpt.pt")

# Wait for rank 0 to finish writing before any rank reads.
dist.barrier()

# Load on ALL ranks (map to current rank's local GPU).
local_rank = int(os.environ["LOCAL_RANK"])
ckpt = torch.load(
    "/Volumes/<catalog-name>/<schema-name>/<volume-name>/sub-dir/ckpt.pt",
    map_location=f"cuda:{local_rank}",
    weights_only=True)
model.load_state_dict(ckpt["model"])
optimizer.load_state_dict(ckpt["opt"])
"""


def adapt(sample: str, volume: str) -> str:
    """The only changes made to a sample (see module doc)."""
    out = sample.replace("databricks.air.data", "airfs.data")
    out = re.sub(r"/Volumes/[^/\"]+/[^/\"]+/[^/\"]+", volume, out)
    if not torch.cuda.is_available():
        out = out.replace('map_location=f"cuda:{local_rank}"', 'map_location="cpu"')
    return out


def make_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 6)).pow(2).sum().backward()
    optimizer.step()
    return model, optimizer


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in model.parameters()]
    for state in optimizer.state.values():
        out += [v.clone() for v in state.values() if torch.is_tensor(v)]
    return out


def scramble(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for state in optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                v.add_(1.0)


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _join_async_checkpoint_threads() -> None:
    """The sample drops async_save's future; wait for its worker thread instead."""
    for t in threading.enumerate():
        if t.name.startswith("AsyncCheckpointExecutor"):
            t.join(60)


# --------------------------------------------------------------------- run on ranks


def _dcp_sample(volume: str) -> bool:
    model, optimizer = make_model(0)
    ns = {"model": model, "optimizer": optimizer}
    exec(adapt(DCP_SAMPLE, volume), ns)
    _join_async_checkpoint_threads()
    saved = snapshot(model, optimizer)
    scramble(model, optimizer)
    assert not same(saved, snapshot(model, optimizer))
    exec(adapt(DCP_LOAD_SAMPLE, volume), ns)
    return same(saved, snapshot(model, optimizer))


def _torchrun_sample(volume: str) -> bool:
    model, optimizer = make_model(dist.get_rank())  # ranks differ until they load rank 0's
    reference = snapshot(*make_model(0))
    ns = {"model": model, "optimizer": optimizer, "torch": torch}
    exec(adapt(TORCHRUN_SAMPLE, volume), ns)
    return same(reference, snapshot(model, optimizer))


# ----------------------------------------------------------------------------- tests


def _write_images(root: Path, count: int) -> None:
    for i in range(count):
        p = root / "images" / f"class{i % 2}" / f"img{i:03d}.raw"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes((i + j) % 256 for j in range(3 * 8 * 8)))


def test_image_dataset_sample(volume_dir: Path, tmp_path: Path, monkeypatch):
    _write_images(volume_dir, 10)
    monkeypatch.setenv("AIRFS_DATA_CACHE", str(tmp_path / "cache"))
    ns: dict = {}
    exec(adapt(RAW_IMAGE_SAMPLE, str(volume_dir)), ns)
    from airfs.data import DataLoader

    batches = list(DataLoader(ns["dataset"], batch_size=4, num_workers=2))
    images = torch.cat(batches)
    assert images.shape == (10, 3, 8, 8) and images.dtype == torch.float32
    assert images.min() >= 0.0 and images.max() <= 1.0
    sums = sorted(round(float(x.sum() * 255)) for x in images)
    assert sums == sorted(sum((i + j) % 256 for j in range(192)) for i in range(10))
    first = next(iter(ns["path_dataset"]))
    if find_mount(str(volume_dir)) is None:
        assert first.startswith(str(tmp_path / "cache"))  # decoded local copies
    else:
        assert first.startswith(str(volume_dir))  # the mount's own cached paths


@pytest.mark.skipif(
    importlib.util.find_spec("PIL") is None or importlib.util.find_spec("torchvision") is None,
    reason="PIL and torchvision are not installed (torchvision from PyPI does not import "
    "beside this torch); test_image_dataset_sample runs the same wrapper without them",
)
def test_image_dataset_sample_verbatim(volume_dir: Path, tmp_path: Path, monkeypatch):
    from PIL import Image

    (volume_dir / "images").mkdir()
    for i in range(4):
        Image.new("RGB", (5, 7), (i, 2 * i, 3 * i)).save(volume_dir / "images" / f"{i}.png")
    monkeypatch.setenv("AIRFS_DATA_CACHE", str(tmp_path / "cache"))
    ns: dict = {}
    exec(adapt(IMAGE_SAMPLE, str(volume_dir)), ns)
    images = list(ns["dataset"])
    assert len(images) == 4 and all(t.shape == (3, 7, 5) for t in images)


@pytest.mark.skipif(
    importlib.util.find_spec("numpy") is None,
    reason="torch.distributed object collectives (used by DCP) need numpy",
)
def test_dcp_async_save_and_load_sample(dist_pool, volume_dir: Path):
    assert dist_pool(2).run(_dcp_sample, str(volume_dir)) == [True, True]
    assert (volume_dir / "checkpoints" / "step_1000" / ".metadata").is_file()


def test_single_gpu_torch_save_sample(volume_dir: Path):
    (volume_dir / "sub-dir").mkdir()
    model, optimizer = make_model(0)
    saved = snapshot(model, optimizer)
    ns = {"model": model, "optimizer": optimizer, "torch": torch}
    code = adapt(SINGLE_GPU_SAMPLE, str(volume_dir))
    save, load = code.split("# Load")
    exec(save, ns)
    scramble(model, optimizer)
    exec(load, ns)
    assert same(saved, snapshot(model, optimizer))


def test_torchrun_torch_save_barrier_sample(dist_pool, volume_dir: Path):
    os.makedirs(volume_dir / "sub-dir")
    assert dist_pool(2).run(_torchrun_sample, str(volume_dir)) == [True, True]
