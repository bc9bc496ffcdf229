"""A hidden debugging hook for the daemon's memory (not a user feature; documented in
docs/benchmarks.md, "Daemon memory over load rounds").

With ``AIRFS_DEBUG_MEMORY=DIR`` in its environment the daemon starts :mod:`tracemalloc` at
mount time and, on each ``SIGUSR2``, appends a report to ``DIR/memory-<pid>.txt``:

* the resident set (``VmRSS``/``VmHWM``) and glibc's own view (``mallinfo2``: bytes in use
  and free bytes held in its arenas), to tell live objects from allocator retention;
* the ``tracemalloc`` lines that grew most since the previous report (and the total traced);
* live objects counted by type (``gc.get_objects()``), with the change since the last report;
* the sizes of every sized attribute (dicts, lists, sets...) of the daemon's components and of
  the objects they hold, two levels down, with the change since the last report.

Taking a report walks the heap on the trio thread: it pauses the mount for a moment. The hook
costs nothing when the variable is unset (tracemalloc itself slows the daemon when it is set).
"""

from __future__ import annotations

import collections
import ctypes
import gc
import linecache
import os
import signal
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any

import trio

ENV = "AIRFS_DEBUG_MEMORY"
_FRAMES = 4


_MALLINFO_FIELDS = (
    "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
    "fordblks", "keepcost",
)  # fmt: skip


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO_FIELDS]


def mallinfo() -> dict[str, int]:
    """glibc's ``mallinfo2()`` (empty when not glibc): ``arena`` bytes obtained with sbrk/mmap
    for arenas, ``hblkhd`` in big mmapped blocks, ``uordblks`` in use, ``fordblks`` free."""
    try:
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _Mallinfo2
    mi = fn()
    return {name: int(getattr(mi, name)) for name in _MALLINFO_FIELDS}


def vm_status(pid: int | None = None) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` (this process by default) in KiB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid or os.getpid()}/status", encoding="ascii") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def sizes(components: Mapping[str, object]) -> dict[str, int]:
    """``len()`` of every sized attribute of each component and of the objects it holds, two
    levels down, keyed ``component.attr``, ``component.attr.attr``..."""
    out: dict[str, int] = {}

    def walk(prefix: str, obj: object, depth: int, seen: set[int]) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        try:
            attrs = vars(obj)
        except TypeError:
            slots = getattr(type(obj), "__slots__", ())
            attrs = {s: getattr(obj, s) for s in slots if hasattr(obj, s)}
        for name, value in attrs.items():
            key = f"{prefix}.{name}"
            if isinstance(value, (str, bytes, bytearray, memoryview)):
                continue
            try:
                n = len(value)
            except Exception:
                n = -1
            if n >= 0:
                out[key] = n
            elif depth > 0 and hasattr(value, "__dict__") and not isinstance(value, type):
                walk(key, value, depth - 1, seen)

    for name, obj in components.items():
        walk(name, obj, 2, set())
    return out


class MemoryReporter:
    """Writes one report per :meth:`report` call, each compared with the one before."""

    def __init__(self, path: str, components: Mapping[str, object]) -> None:
        self.path = path
        self.components = components
        if not tracemalloc.is_tracing():
            tracemalloc.start(_FRAMES)
        self._snap: tracemalloc.Snapshot | None = None
        self._types: collections.Counter[str] = collections.Counter()
        self._sizes: dict[str, int] = {}

    def report(self) -> None:
        gc.collect()
        lines = [f"=== {time.strftime('%H:%M:%S')} pid {os.getpid()} ==="]
        lines.append(f"status {vm_status()} mallinfo2 {mallinfo()}")
        traced, peak = tracemalloc.get_traced_memory()
        lines.append(f"tracemalloc traced {traced >> 10} KiB (peak {peak >> 10} KiB)")
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        if self._snap is not None:
            lines.append("-- tracemalloc growth since the last report (top 25 by line)")
            for st in snap.compare_to(self._snap, "lineno")[:25]:
                lines.append(f"  {st.size_diff >> 10:+8d} KiB {st.count_diff:+7d}  {st.traceback}")
            lines.append("-- tracemalloc growth by traceback (top 8)")
            for st in snap.compare_to(self._snap, "traceback")[:8]:
                lines.append(f"  {st.size_diff >> 10:+8d} KiB {st.count_diff:+7d}")
                lines += [f"      {fr}" for fr in st.traceback.format()]
        self._snap = snap
        types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        lines.append(f"-- live objects by type (gc), {sum(types.values())} in all (top 30)")
        for name, n in types.most_common(30):
            lines.append(f"  {n:9d} {n - self._types.get(name, 0):+8d}  {name}")
        self._types = types
        now = sizes(self.components)
        lines.append("-- sizes of the components' tables (over 50, or changed)")
        for key in sorted(now):
            n, before = now[key], self._sizes.get(key, 0)
            if n > 50 or n != before:
                lines.append(f"  {n:9d} {n - before:+8d}  {key}")
        self._sizes = now
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n\n")
        linecache.clearcache()  # the source lines read for this report are not the daemon's


async def serve(components: Mapping[str, Any], directory: str) -> None:
    """Report on every SIGUSR2 until cancelled (see the module's docstring)."""
    os.makedirs(directory, exist_ok=True)
    reporter = MemoryReporter(os.path.join(directory, f"memory-{os.getpid()}.txt"), components)
    with trio.open_signal_receiver(signal.SIGUSR2) as sigs:
        async for _ in sigs:
            reporter.report()
