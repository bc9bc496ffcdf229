"""The row assignment of :mod:`airfs.tables.assign`, without I/O: properties over random unit
sizes, world sizes, worker counts and resume points (hypothesis)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airfs.tables import assign
from airfs.tables.assign import Piece, Segment

units_st = st.lists(st.integers(1, 40), min_size=1, max_size=25)


def rows_of(pieces: list[Piece]) -> list[tuple[int, int]]:
    """Every (unit, row) a list of pieces stands for, in order."""
    return [(p.unit, r) for p in pieces for r in range(p.start, p.stop)]


def worker_rows(unit_rows, rank, world, workers, **kw) -> list[list[tuple[int, int]]]:
    span = assign.rank_pieces(unit_rows, rank=rank, world_size=world, **kw)
    layout = assign.resolve_layout(
        sum(p.rows for p in span),
        history=[],
        num_workers=1,
        positions=[0],
        new_num_workers=workers,
    )
    return [rows_of(assign.to_pieces(span, layout.worker_intervals(w))) for w in range(workers)]


@settings(max_examples=150, deadline=None)
@given(
    unit_rows=units_st,
    world=st.integers(1, 4),
    workers=st.integers(1, 4),
    epoch=st.integers(0, 5),
    seed=st.integers(0, 3),
    shuffle=st.booleans(),
    uneven=st.sampled_from(["pad", "drop"]),
)
def test_every_row_once_and_equal_counts(unit_rows, world, workers, epoch, seed, shuffle, uneven):
    kw = dict(epoch=epoch, seed=seed, shuffle=shuffle, uneven=uneven)
    total = sum(unit_rows)
    per_rank = []
    seen: Counter[tuple[int, int]] = Counter()
    for rank in range(world):
        parts = worker_rows(unit_rows, rank, world, workers, **kw)
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1, sizes
        per_rank.append(sum(sizes))
        for p in parts:
            seen.update(p)
    assert len(set(per_rank)) == 1, per_rank
    assert all(0 <= r < unit_rows[u] for u, r in seen)
    if uneven == "drop":
        assert all(c == 1 for c in seen.values())
        assert len(seen) == total - total % world
    else:
        assert len(seen) == total  # every row at least once
        assert sum(seen.values()) - total == (-total) % world  # the padding, no more


@settings(max_examples=120, deadline=None)
@given(
    unit_rows=units_st,
    world=st.integers(1, 4),
    workers=st.integers(1, 4),
    new_workers=st.integers(1, 4),
    data=st.data(),
)
def test_resume_yields_exactly_the_rest(unit_rows, world, workers, new_workers, data):
    """Stop each worker anywhere, resume with another worker count (twice): what the resumed
    workers read is exactly what was not read yet, as a multiset of rows."""
    rank = data.draw(st.integers(0, world - 1))
    span = assign.rank_pieces(
        unit_rows, rank=rank, world_size=world, epoch=1, seed=2, shuffle=True, uneven="pad"
    )
    n = sum(p.rows for p in span)
    full = Counter(rows_of(span))
    history: list[Segment] = []
    done: Counter[tuple[int, int]] = Counter()
    k, positions = 1, [0]
    for step_workers in (workers, new_workers):
        layout = assign.resolve_layout(
            n, history=history, num_workers=k, positions=positions, new_num_workers=step_workers
        )
        parts = [
            rows_of(assign.to_pieces(span, layout.worker_intervals(w))) for w in range(step_workers)
        ]
        consumed = [data.draw(st.integers(0, len(p))) for p in parts]
        for p, c in zip(parts, consumed, strict=True):
            done.update(p[:c])
        history = list(layout.history)
        k = step_workers
        positions = [s + c for s, c in zip(layout.skip, consumed, strict=True)]
    final = assign.resolve_layout(
        n, history=history, num_workers=k, positions=positions, new_num_workers=2
    )
    rest = Counter(
        r for w in range(2) for r in rows_of(assign.to_pieces(span, final.worker_intervals(w)))
    )
    assert done + rest == full


def test_same_worker_count_resume_skips_prefixes():
    span = assign.rank_pieces(
        [5, 7, 3], rank=0, world_size=1, epoch=0, seed=0, shuffle=False, uneven="pad"
    )
    layout = assign.resolve_layout(
        15, history=[], num_workers=2, positions=[3, 1], new_num_workers=2
    )
    assert layout.skip == (3, 1) and layout.history == ()
    assert [assign.to_pieces(span, layout.parts[w]) for w in range(2)] == [
        [Piece(0, 0, 5), Piece(1, 0, 3)],
        [Piece(1, 3, 7), Piece(2, 0, 3)],
    ]
    assert assign.to_pieces(span, layout.worker_intervals(0)) == [Piece(0, 3, 5), Piece(1, 0, 3)]


def test_shuffle_is_a_function_of_seed_and_epoch():
    rows = [3] * 30
    a = assign.rank_pieces(rows, rank=0, world_size=2, epoch=1, seed=5, shuffle=True, uneven="pad")
    assert a == assign.rank_pieces(
        rows, rank=0, world_size=2, epoch=1, seed=5, shuffle=True, uneven="pad"
    )
    assert a != assign.rank_pieces(
        rows, rank=0, world_size=2, epoch=2, seed=5, shuffle=True, uneven="pad"
    )
    assert a != assign.rank_pieces(
        rows, rank=0, world_size=2, epoch=1, seed=6, shuffle=True, uneven="pad"
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"rank 2 is not in 0\.\.1"):
        assign.rank_pieces([1], rank=2, world_size=2, epoch=0, seed=0, shuffle=False, uneven="pad")
    with pytest.raises(ValueError, match="uneven must be"):
        assign.rank_pieces([1], rank=0, world_size=1, epoch=0, seed=0, shuffle=False, uneven="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only some workers"):
        assign.resolve_layout(10, history=[], num_workers=2, positions=[-1, 3], new_num_workers=3)
    with pytest.raises(ValueError, match="outside"):
        assign.resolve_layout(10, history=[], num_workers=2, positions=[9, 0], new_num_workers=2)


@settings(max_examples=80, deadline=None)
@given(unit_rows=units_st, window=st.integers(1, 60), data=st.data())
def test_shuffled_stream_positions_are_exact(unit_rows, window, data):
    """Reading any positions of a rank's shuffled stream (as a resumed worker does) gives
    exactly those positions of the whole shuffled stream: windows are fixed by the span, not
    by the worker's part."""
    import pyarrow as pa

    from airfs.tables.reader import read_shuffled, window_plan

    span = assign.rank_pieces(
        unit_rows, rank=0, world_size=1, epoch=0, seed=1, shuffle=True, uneven="pad"
    )
    n = sum(p.rows for p in span)
    base = [0]
    for r in unit_rows:
        base.append(base[-1] + r)

    def stream(intervals):
        plan = window_plan(span, intervals, window)
        pieces = [p for _, ps, _ in plan for p in ps]
        tables = iter(
            pa.table({"row": list(range(base[p.unit] + p.start, base[p.unit] + p.stop))})
            for p in pieces
        )
        return [v for t in read_shuffled(tables, plan, key="k") for v in t["row"].to_pylist()]

    whole = stream([(0, n)])
    assert sorted(whole) == list(range(n))
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))
    bounds = [0, *cuts, n]
    intervals = [(a, b) for a, b in zip(bounds[::2], bounds[1::2], strict=False) if a < b]
    assert stream(intervals) == [whole[i] for a, b in intervals for i in range(a, b)]
