"""Issue 23: a directory whose files are opened in its listing's order gets its next files
fetched ahead (airfs.core.ahead); opens that jump around fetch nothing."""

from __future__ import annotations

import time

from airfs.core.ahead import FetchAhead
from airfs.core.listings import ListingCache
from airfs.core.readpath import ObjectRef
from airfs.origin.base import Entry, Kind

MiB = 1 << 20


def entry(name: str, kind: Kind = Kind.FILE, size: int = 1000) -> Entry:
    return Entry(name, kind, size, 0, 0o644, "" if kind is Kind.DIR else f"v-{name}")


def ahead_over(entries: list[Entry]) -> tuple[FetchAhead, list[list[ObjectRef]]]:
    listings = ListingCache(1.0)
    listings.put("d", entries, time.monotonic())
    fa = FetchAhead(listings, max_size=8 * MiB, first=4, most=16)
    got: list[list[ObjectRef]] = []
    fa.submit = got.append
    return fa, got


def test_files_opened_in_order_get_the_next_ones_fetched_doubling() -> None:
    fa, got = ahead_over([entry(f"f{i:03d}") for i in range(100)])
    fa.opened("d/f000")
    fa.opened("d/f001")
    assert got == []  # one step is not a walk yet
    fa.opened("d/f002")
    assert [r.path for r in got[0]] == ["d/f003", "d/f004", "d/f005", "d/f006"]
    assert got[0][0] == ObjectRef("d/f003", "v-f003", 1000)
    for i in range(3, 100):
        fa.opened(f"d/f{i:03d}")
        last = int(got[-1][-1].path[-3:])
        assert last >= min(99, i + 3)  # the files fetched ahead stay ahead of the reader
    paths = [r.path for batch in got for r in batch]
    assert paths == [f"d/f{i:03d}" for i in range(3, 100)]  # each once, to the end
    assert [len(b) for b in got][:3] == [4, 8, 16] and max(len(b) for b in got) == 16
    assert fa.submitted == 97


def test_opens_that_jump_around_fetch_nothing() -> None:
    fa, got = ahead_over([entry(f"f{i:03d}") for i in range(100)])
    for i in [5, 40, 41, 7, 90, 12, 13, 60, 2, 3]:
        fa.opened(f"d/f{i:03d}")
    assert got == [] and fa.submitted == 0


def test_only_small_files_are_fetched_and_a_skipped_name_keeps_the_walk() -> None:
    entries = [entry("a"), entry("b"), entry("c"), entry("ca", Kind.DIR)]
    entries += [entry("d", size=64 * MiB), entry("e", size=0), entry("f"), entry("g")]
    fa, got = ahead_over(entries)
    fa.opened("d/a")
    fa.opened("d/b")
    fa.opened("d/c")  # a walk: the next four names are ca, d, e, f
    assert [r.path for r in got[0]] == ["d/f"]  # not the directory, the big or the empty file


def test_without_a_listing_or_a_submit_nothing_happens() -> None:
    listings = ListingCache(1.0)
    fa = FetchAhead(listings, max_size=MiB)
    fa.opened("d/x")  # no submit: off
    got: list[list[ObjectRef]] = []
    fa.submit = got.append
    for n in ["a", "b", "c", "d"]:
        fa.opened(f"nolisting/{n}")
    assert got == []
