#!/usr/bin/env python3
"""Python function calls per core operation: a count that load on the machine does not move.

    PYTHONPATH=. .venv/bin/python scripts/bench/core_calls.py [--json]

A core built by ``airfs.daemon.build`` (no kernel) over a memory origin, TTL 1 h, so that every
operation measured is answered from memory: ``getattr`` and ``lookup`` of a known file, and
``open`` + ``read`` + ``release`` of a cached 100-byte file. ``sys.setprofile`` counts the
Python calls (``py``) and the C calls (``c``) each one makes, averaged over 50 repetitions
after two warm-up rounds. Run it from two checkouts to compare a structural change (a layer, a
collaborator, a decorator) without the noise of a timed run: ``scripts/bench/ab.py`` times, this
counts. Never run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

import trio

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import build
from airfs.testing.memory import MemoryOrigin

REPS = 50


async def count_calls(op: Callable[[], Awaitable[Any]], reps: int = REPS) -> dict[str, float]:
    """Mean Python and C calls of ``op()`` over ``reps`` awaited runs."""
    n = {"py": 0, "c": 0}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            n["py"] += 1
        elif event == "c_call":
            n["c"] += 1

    sys.setprofile(profile)
    try:
        for _ in range(reps):
            await op()
    finally:
        sys.setprofile(None)
    return {k: v / reps for k, v in n.items()}


async def measure() -> dict[str, dict[str, float]]:
    mem = MemoryOrigin()
    mem.put_bytes("f", b"x" * 100)
    with tempfile.TemporaryDirectory() as tmp:
        async with build(mem, tmp, ttl=3600.0, attempts=1, upload=False) as b:
            fs = b.fs
            ino = (await fs.lookup(ROOT_INO, "f")).ino

            async def open_read_release() -> None:
                fh, _keep = await fs.open(ino, os.O_RDONLY)
                await fs.read(fh, 0, 100)
                await fs.release(fh)

            for _ in range(2):
                await open_read_release()
            return {
                "getattr": await count_calls(lambda: fs.getattr(ino)),
                "lookup": await count_calls(lambda: fs.lookup(ROOT_INO, "f")),
                "open_read_release": await count_calls(open_read_release),
            }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    out = trio.run(measure)
    if a.json:
        print(json.dumps(out))
    else:
        for op, n in out.items():
            print(f"{op:18} {n['py']:7.1f} Python calls  {n['c']:7.1f} C calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
