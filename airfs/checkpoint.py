"""Compatibility: :mod:`airfs.data.checkpoint` under its first name, ``airfs.checkpoint``."""

from airfs.data.checkpoint import METADATA as METADATA
from airfs.data.checkpoint import VolumeReader as VolumeReader
from airfs.data.checkpoint import VolumeWriter as VolumeWriter
from airfs.data.checkpoint import is_complete as is_complete
from airfs.data.checkpoint import latest_checkpoint as latest_checkpoint
