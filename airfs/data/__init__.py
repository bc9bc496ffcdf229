"""Datasets, a DataLoader and checkpoint storage for training on volumes. Needs torch.

``UCVolumeDataset``, ``UCVolumeWriter`` and ``UCVolumeReader`` are the names the seed document
uses; they are the same objects as ``VolumeDataset``, ``VolumeWriter`` and ``VolumeReader``.
"""

from airfs.data.checkpoint import VolumeReader as VolumeReader
from airfs.data.checkpoint import VolumeWriter as VolumeWriter
from airfs.data.checkpoint import latest_checkpoint as latest_checkpoint

from .dataset import VolumeDataset as VolumeDataset
from .loader import DataLoader as DataLoader
from .loader import LoaderStats as LoaderStats
from .stats import DatasetStats as DatasetStats

UCVolumeDataset = VolumeDataset
UCVolumeWriter = VolumeWriter
UCVolumeReader = VolumeReader

__all__ = [
    "DataLoader",
    "DatasetStats",
    "LoaderStats",
    "UCVolumeDataset",
    "UCVolumeReader",
    "UCVolumeWriter",
    "VolumeDataset",
    "VolumeReader",
    "VolumeWriter",
    "latest_checkpoint",
]
