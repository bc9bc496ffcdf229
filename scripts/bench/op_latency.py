"""What the latency histogram costs per core call: getattr (and lookup) served from memory.

    PYTHONPATH=. python scripts/bench/op_latency.py [CALLS] [ROUNDS]   # default 20000 15

A core built by ``airfs.daemon.build`` (no kernel) over a memory origin, TTL 1 h, so that getattr
and lookup of a known file are answered from memory without suspending: the cheapest core calls,
where a fixed cost shows most; and first an operation that does nothing (``noop``: the decorators'
own cost, without the noise of the operation). Three variants of the same method, run in turn in
each round (so that a noisy neighbour hits all three alike), CALLS calls each, on the trio loop:

* ``bare``: the operation itself (``fs.getattr.__wrapped__``, no decorator);
* ``counter``: the decorator as it was before the histograms (a ``Counter`` increment);
* ``histogram``: the decorator now (:func:`airfs.core.base.counted`: the counter, a
  ``perf_counter`` pair and :meth:`airfs.obs.histogram.Latencies.observe`).

Prints the median and the best over ROUNDS of µs per call. Numbers go to docs/benchmarks.md.
"""

from __future__ import annotations

import collections
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from airfs.core.base import counted
from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import build
from airfs.obs.histogram import Latencies
from airfs.testing.memory import MemoryOrigin


def counter_only(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The ``counted`` decorator before this change (copied from git history)."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        self = args[0]
        self.ops[name] += 1
        return await fn(*args, **kwargs)

    return wrapper


async def per_call(call: Callable[[], Awaitable[Any]], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        await call()
    return (time.perf_counter() - t0) / n * 1e6


class Null:
    """The decorators' own cost: an operation that does nothing."""

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.latency = Latencies()

    async def noop(self) -> None:
        return None


def report(op: str, times: dict[str, list[float]]) -> None:
    for name, t in times.items():
        print(f"{op:8} {name:10} median {statistics.median(t):6.2f} µs   best {min(t):6.2f} µs")


async def main(calls: int, rounds: int) -> None:
    null = Null()
    bare_noop = Null.noop
    null_variants: dict[str, Callable[[], Awaitable[Any]]] = {
        "bare": functools.partial(bare_noop, null),
        "counter": functools.partial(counter_only(bare_noop), null),
        "histogram": functools.partial(counted(bare_noop), null),  # type: ignore[arg-type]
    }
    times: dict[str, list[float]] = {k: [] for k in null_variants}
    for _ in range(rounds):
        for name, call in null_variants.items():
            times[name].append(await per_call(call, calls))
    report("noop", times)
    mem = MemoryOrigin()
    mem.put_bytes("f", b"x" * 100)
    with tempfile.TemporaryDirectory() as tmp:
        async with build(mem, tmp, ttl=3600.0, attempts=1) as b:
            fs = b.fs
            ino = (await fs.lookup(ROOT_INO, "f")).ino
            for op, args in (("getattr", (ino,)), ("lookup", (ROOT_INO, "f"))):
                wrapped = getattr(type(fs), op)
                bare = wrapped.__wrapped__
                old = counter_only(bare)
                variants: dict[str, Callable[[], Awaitable[Any]]] = {
                    "bare": functools.partial(bare, fs, *args),
                    "counter": functools.partial(old, fs, *args),
                    "histogram": functools.partial(wrapped, fs, *args),
                }
                times: dict[str, list[float]] = {k: [] for k in variants}
                for _ in range(rounds):
                    for name, call in variants.items():
                        times[name].append(await per_call(call, calls))
                report(op, times)
                if op == "lookup":
                    fs.forget([(ino, calls * rounds * 3)])  # the lookups' counts


if __name__ == "__main__":
    argv = [int(a) for a in sys.argv[1:]]
    trio.run(main, *(argv + [20000, 15][len(argv) :]))
