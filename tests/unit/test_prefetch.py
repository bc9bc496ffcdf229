"""The prefetch stream (window growth, resets, tolerance) and the in-flight byte budget."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing

from airfs.cache.prefetch import ByteBudget, Stream, split_runs

MiB = 1 << 20


def sequential(stream: Stream, size: int, step: int, limit: int) -> list[tuple[int, int]]:
    out = []
    for off in range(0, size, step):
        span = stream.on_read(off, step, limit)
        if span is not None:
            out.append(span)
    return out


def test_window_starts_small_and_doubles_to_the_cap() -> None:
    s = Stream(initial_window=1 * MiB, max_window=16 * MiB, seek_tolerance=4 * MiB)
    spans = sequential(s, 200 * MiB, 128 << 10, 1 << 40)
    sizes = [e - b for b, e in spans]
    assert sizes[0] <= 1 * MiB  # the first prefetch is small
    # requests are contiguous: nothing is requested twice, nothing skipped
    for (_, e), (b, _) in itertools.pairwise(spans):
        assert b == e
    windows = []
    s2 = Stream(initial_window=1 * MiB, max_window=16 * MiB)
    for off in range(0, 200 * MiB, 128 << 10):
        if s2.on_read(off, 128 << 10, 1 << 40) is not None:
            windows.append(s2.window)
    assert windows[:5] == [1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB]
    assert set(windows[5:]) == {16 * MiB}
    assert s.max_window_seen == 16 * MiB
    # the horizon stays within one window of the reader
    assert s.ahead - s.next_offset <= 16 * MiB  # type: ignore[operator]


def test_prefetch_stops_at_end_of_object() -> None:
    s = Stream(initial_window=1 * MiB, max_window=64 * MiB)
    spans = sequential(s, 10 * MiB, 1 * MiB, 10 * MiB)
    assert spans and max(e for _, e in spans) == 10 * MiB


def test_first_read_not_at_zero_is_random_until_a_long_contiguous_run() -> None:
    s = Stream()
    assert s.min_run == 4 * MiB
    assert s.on_read(5 * MiB, 4096, 1 << 30) is None
    assert not s.sequential
    assert s.on_read(9 * MiB, 4096, 1 << 30) is None  # a jump: still random
    off = 9 * MiB + 4096
    while off + (128 << 10) - 9 * MiB < s.min_run:  # contiguous, shorter than min_run
        assert s.on_read(off, 128 << 10, 1 << 30) is None
        assert not s.sequential
        off += 128 << 10
    span = s.on_read(off, 128 << 10, 1 << 30)  # the run reaches min_run: a stream starts
    assert s.sequential and span is not None
    assert span[0] == off + (128 << 10) and span[1] - span[0] <= s.initial_window


def test_one_large_random_read_cut_into_requests_does_not_prefetch() -> None:
    """The kernel cuts a 1 MiB read at a random offset into contiguous 128 KiB READs (and
    a page more): contiguous, yet random; 64 such reads prefetched about 95 MiB on a mount
    (tests/fuse/test_random_reads_mounted.py)."""
    s = Stream()
    for start in (77 * MiB + 4096, 3 * MiB + 8192, 150 * MiB + 12288, 40 * MiB):
        for off in range(start, start + MiB + 4096, 128 << 10):
            assert s.on_read(off, 128 << 10, 1 << 30) is None
    assert not s.sequential and s.requests == 0
    r = Stream(min_run=0)  # the old rule: two contiguous requests made a stream
    r.on_read(77 * MiB, 128 << 10, 1 << 30)
    assert r.on_read(77 * MiB + (128 << 10), 128 << 10, 1 << 30) is not None


def test_random_reads_never_prefetch() -> None:
    s = Stream()
    for off in (7, 3000, 100, 50_000, 20 * MiB, 1 * MiB):
        assert s.on_read(off * 4096 + 1, 4096, 1 << 40) is None
    assert not s.sequential


def test_small_jumps_keep_the_stream_far_jumps_reset_it() -> None:
    s = Stream(initial_window=1 * MiB, max_window=64 * MiB, seek_tolerance=4 * MiB)
    sequential(s, 40 * MiB, 1 * MiB, 1 << 40)
    window, epoch = s.window, s.epoch
    assert window > 1 * MiB
    pos = s.next_offset
    assert pos is not None
    s.on_read(pos - 2 * MiB, 1 * MiB, 1 << 40)  # small backward jump (out-of-order request)
    s.on_read(pos + 3 * MiB, 1 * MiB, 1 << 40)  # small forward skip
    assert s.sequential and s.epoch == epoch and s.window >= window
    assert s.on_read(pos + 500 * MiB, 1 * MiB, 1 << 40) is None  # far jump
    assert not s.sequential and s.epoch == epoch + 1 and s.resets == 1
    assert s.window == s.initial_window
    s.on_read(0, 4096, 1 << 40)
    assert not s.sequential  # back to offset 0 is a far jump too


def test_active_range_covers_position_and_horizon() -> None:
    s = Stream(initial_window=1 * MiB, max_window=8 * MiB, seek_tolerance=2 * MiB)
    sequential(s, 20 * MiB, 1 * MiB, 1 << 40)
    lo, hi = s.active_range()
    assert lo <= 18 * MiB and hi >= 20 * MiB and hi == s.ahead
    r = Stream()
    r.on_read(5 * MiB, 100, 1 << 40)
    assert r.active_range() == (5 * MiB, 5 * MiB + 100)


def test_split_runs_cuts_on_the_grid_of_the_part_size() -> None:
    present = {2, 3, 7}
    runs = list(split_runs(0, 12, 3, lambda b: b in present))
    assert runs == [(0, 2), (4, 6), (6, 7), (8, 9), (9, 12)]
    # a span that starts between grid lines reaches the next one first, then whole cells
    assert list(split_runs(5, 17, 4, lambda b: False)) == [(5, 8), (8, 12), (12, 16), (16, 17)]


@pytest.mark.parametrize("step", [128 << 10, 1 * MiB, 3 * MiB + 4096])
def test_an_aligned_stream_keeps_its_horizon_on_the_grid(step: int) -> None:
    """With ``align``, once the window has reached it every horizon is a multiple of it (or
    the end of the object), nothing is requested twice, and the stream is never more than a
    window plus one cell ahead of its reader."""
    cell, limit = 8 * MiB, 700 * MiB + 12345
    s = Stream(initial_window=1 * MiB, max_window=64 * MiB, align=cell)
    spans = []
    for off in range(0, limit, step):
        n = min(step, limit - off)
        span = s.on_read(off, n, limit)
        if span is not None:
            spans.append((span, s.window))
            assert span[1] - (off + n) <= s.window + cell
    assert spans[-1][0][1] == limit
    for ((_, e), _), ((b, _), _) in itertools.pairwise(spans):
        assert b >= e  # a read past the horizon (big reads, small window) leaves a gap
    grown = [e for (_, e), window in spans if window >= cell]
    assert grown and all(e % cell == 0 or e == limit for e in grown)
    # without align the same reads end between grid lines
    plain = Stream(initial_window=1 * MiB, max_window=64 * MiB)
    ends = [sp[1] for sp in sequential(plain, limit, step, limit)]
    assert any(e % cell for e in ends[:-1])


def test_an_aligned_stream_tops_its_window_up_cell_by_cell() -> None:
    """Once the window has grown to a cell, the stream asks for the next cell as soon as one
    whole cell of its window is free, so a reader moving through its window keeps the window
    full: never less than the window minus one cell (and one read) ahead of it. With the
    half-window rule the stream let the reader eat half its window before asking again, and
    asked for it all at once: on an origin with a per-request cost the parts of each request
    then ran together and finished together, in waves (a cold read from a slow POSIX origin
    ran at 400 MiB/s against 520 before the parts were aligned, 705 with the top-up)."""
    cell, step, limit = 8 * MiB, 128 << 10, 1 << 40
    s = Stream(initial_window=1 * MiB, max_window=64 * MiB, align=cell)
    sizes = []
    for off in range(0, 600 * MiB, step):
        span = s.on_read(off, step, limit)
        if span is not None and s.window >= cell:
            sizes.append(span[1] - span[0])
        if s.window == s.max_window:
            assert s.ahead - (off + step) >= s.window - cell - step
    assert s.window == 64 * MiB
    steady = sizes[len(sizes) // 2 :]
    assert steady and set(steady) == {cell}  # one cell at a time
    # the growth is the half-window rule's: the window reached its cap within the same reads
    plain = Stream(initial_window=1 * MiB, max_window=64 * MiB)
    grown = Stream(initial_window=1 * MiB, max_window=64 * MiB, align=cell)
    for off in range(0, 100 * MiB, step):
        plain.on_read(off, step, limit)
        grown.on_read(off, step, limit)
    assert plain.window == grown.window == 64 * MiB


def test_align_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        Stream(align=-1)


async def test_budget_blocks_until_released() -> None:
    budget = ByteBudget(10)
    assert await budget.acquire(6)
    got = []

    async def second() -> None:
        got.append(await budget.acquire(6))

    async with trio.open_nursery() as n:
        n.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and budget.waits == 1
        budget.release(6)
    assert got == [True] and budget.used == 6


async def test_budget_admits_oversized_when_idle_and_urgent_always() -> None:
    budget = ByteBudget(10)
    assert await budget.acquire(50)  # larger than the budget, nothing in flight
    assert await budget.acquire(5, urgent=lambda: True)
    assert budget.used == 55 and budget.peak == 55


async def test_budget_give_up() -> None:
    budget = ByteBudget(10)
    budget.take(10)
    flag = [False]
    results = []

    async def waiter() -> None:
        results.append(await budget.acquire(1, give_up=lambda: flag[0]))

    async with trio.open_nursery() as n:
        n.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        flag[0] = True
        budget.poke()
    assert results == [False] and budget.used == 10


def test_bad_stream_arguments() -> None:
    with pytest.raises(ValueError):
        Stream(initial_window=0)
    with pytest.raises(ValueError):
        Stream(initial_window=8, max_window=4)
    with pytest.raises(ValueError, match="min_run"):
        Stream(min_run=-1)
