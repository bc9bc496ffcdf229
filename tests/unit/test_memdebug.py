"""airfs.daemon.memdebug: the hidden memory report names the table that grew and by how much."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from airfs.daemon import memdebug


class Holder:
    def __init__(self) -> None:
        self.table: dict[int, bytes] = {}
        self.inner = Inner()


class Inner:
    def __init__(self) -> None:
        self.items: list[int] = []


def test_report_shows_growth_per_table(tmp_path: Path) -> None:
    h = Holder()
    out = tmp_path / "report.txt"
    try:
        rep = memdebug.MemoryReporter(str(out), {"h": h})
        rep.report()
        for i in range(120):
            h.table[i] = b"x" * 100
        h.inner.items.extend(range(7))
        rep.report()
    finally:
        tracemalloc.stop()
    second = out.read_text().split("\n\n")[1]
    assert "VmRSS" in second and "tracemalloc traced" in second
    rows = {line.split()[-1]: line.split()[:2] for line in second.splitlines() if " h." in line}
    assert rows["h.table"] == ["120", "+120"]
    assert rows["h.inner.items"] == ["7", "+7"]


def test_sizes_walks_into_held_objects() -> None:
    h = Holder()
    h.table[1] = b""
    assert memdebug.sizes({"h": h}) == {"h.table": 1, "h.inner.items": 0}
