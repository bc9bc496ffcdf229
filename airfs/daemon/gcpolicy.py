"""The daemon's cyclic garbage collector: rare young collections, and what it costs.

Why (numbers in docs/benchmarks.md, "Stop 36"): CPython runs a young collection every 700
net container allocations, a middle one every ten young ones and a full one every ten middle
ones once the long-lived objects grew by a quarter. The daemon allocates on every request
(coroutines, tuples, replies) and keeps a large long-lived population (inodes, cached
objects, listings), and its data is freed by reference counting, not by the collector: in a
copy of 15,000 cold files out of a mount, CPython's collector ran 2,455 young, 223 middle
and 20 full collections (5.8 s of the daemon's 57.6 s of CPU; 155 ms each full one, every
request waiting meanwhile) and found 558 objects to free in all.

:func:`tune`, called once before the daemon's loop starts, sets the young threshold to
:data:`YOUNG` (``AIRFS_GC_YOUNG`` overrides; 0 keeps CPython's thresholds) and freezes what
exists then (modules, classes, functions: objects the daemon keeps for good, never traversed
again). The older generations keep CPython's ratios, so cyclic garbage is still freed: a
young collection holds at most :data:`YOUNG` new objects (a few MiB).
:func:`statistics` reads what the collector did (collections, seconds and objects freed per
generation), recorded by a ``gc.callbacks`` hook that :func:`tune` installs.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

from .config import env_setting

__all__ = ["YOUNG", "GcStats", "statistics", "tune", "young_threshold"]

#: the daemon's young-generation threshold (CPython's default: 700)
YOUNG = 50_000
#: generations of CPython's collector
_GENERATIONS = 3


@dataclass(frozen=True, slots=True)
class GcStats:
    """What the cyclic collector did in this process since :func:`tune` (per generation:
    index 0 young, 2 full), and its thresholds."""

    thresholds: tuple[int, int, int]
    frozen: int
    collections: tuple[int, ...]
    seconds: tuple[float, ...]
    collected: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "thresholds": list(self.thresholds),
            "frozen": self.frozen,
            "collections": list(self.collections),
            "seconds": [round(s, 6) for s in self.seconds],
            "collected": list(self.collected),
        }


class _Recorder:
    """The ``gc.callbacks`` hook: collections, seconds and objects freed per generation.
    A collection runs in whichever thread allocated last, holding the GIL: one at a time."""

    def __init__(self) -> None:
        self.collections = [0] * _GENERATIONS
        self.seconds = [0.0] * _GENERATIONS
        self.collected = [0] * _GENERATIONS
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        g = info["generation"]
        self.collections[g] += 1
        self.seconds[g] += time.perf_counter() - self._start
        self.collected[g] += info["collected"]


_recorder: _Recorder | None = None


def young_threshold() -> int:
    """:data:`YOUNG`, or ``AIRFS_GC_YOUNG`` when set (a whole number of objects; 0: CPython's
    own thresholds). Raises ValueError, naming the variable, for anything else."""
    return env_setting(
        "AIRFS_GC_YOUNG", YOUNG, int, "a whole number of objects", lambda v: v >= 0, "must be >= 0"
    )


def tune(young: int) -> GcStats:
    """Set the young threshold to ``young`` (0: leave CPython's thresholds), freeze every object
    tracked now and record collections from now on. Call once, before the loop and its
    threads start, after the daemon's modules are imported. Returns the statistics then."""
    global _recorder
    if _recorder is None:  # before any thread: no lock needed
        _recorder = _Recorder()
        gc.callbacks.append(_recorder)
    if young > 0:
        _, middle, full = gc.get_threshold()
        gc.set_threshold(young, middle, full)
        gc.freeze()  # what is alive now lives as long as the process
    return statistics()


def statistics() -> GcStats:
    """The collector's thresholds and what it did since :func:`tune` (zeros before)."""
    r = _recorder
    t0, t1, t2 = gc.get_threshold()
    return GcStats(
        thresholds=(t0, t1, t2),
        frozen=gc.get_freeze_count(),
        collections=tuple(r.collections) if r else (0,) * _GENERATIONS,
        seconds=tuple(r.seconds) if r else (0.0,) * _GENERATIONS,
        collected=tuple(r.collected) if r else (0,) * _GENERATIONS,
    )
