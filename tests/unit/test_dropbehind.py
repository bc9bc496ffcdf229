"""The drop-behind policy (:mod:`airfs.fuse.kernel.dropbehind`) without a kernel: which
ranges of which handles it gives back, against a model of what each handle's reads covered."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airfs.fuse.kernel.dropbehind import PAGE, DropBehind

MiB = 1 << 20


def drops(d: DropBehind, fh: int, reads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for off, size in reads:
        r = d.read(fh, off, size)
        if r is not None:
            out.append(r)
    return out


def test_a_sequential_reader_has_its_pages_dropped_keep_behind_it() -> None:
    d = DropBehind(keep=64 * MiB, step=32 * MiB)
    d.track(3)
    got = drops(d, 3, [(i * MiB, MiB) for i in range(256)])
    # contiguous ranges from 0, each at least a step, never within keep of the read end
    pos = 0
    for off, n in got:
        assert off == pos and n >= 32 * MiB
        pos = off + n
    assert 256 * MiB - 64 * MiB - 32 * MiB < pos <= 256 * MiB - 64 * MiB
    assert d.statistics().dropped_bytes == pos
    assert d.statistics().drops == len(got)


def test_untracked_and_released_handles_drop_nothing() -> None:
    d = DropBehind(keep=4 * MiB, step=4 * MiB)
    assert drops(d, 7, [(i * MiB, MiB) for i in range(64)]) == []
    d.track(7)
    d.forget(7)
    assert drops(d, 7, [(i * MiB, MiB) for i in range(64)]) == []
    assert d.statistics().tracked == 0


def test_out_of_order_readahead_continues_the_run() -> None:
    d = DropBehind(keep=8 * MiB, step=4 * MiB, jitter=4 * MiB)
    d.track(1)
    order = []
    for i in range(0, 64, 2):  # pairs answered in reverse order
        order += [((i + 1) * MiB, MiB), (i * MiB, MiB)]
    got = drops(d, 1, order)
    assert got and got[0][0] == 0
    assert sum(n for _, n in got) >= 64 * MiB - 8 * MiB - 4 * MiB


def test_a_jump_starts_a_run_that_drops_only_what_it_read() -> None:
    d = DropBehind(keep=8 * MiB, step=4 * MiB, jitter=2 * MiB)
    d.track(1)
    drops(d, 1, [(i * MiB, MiB) for i in range(4)])  # 0-4 MiB: too little to drop
    got = drops(d, 1, [(100 * MiB + i * MiB, MiB) for i in range(20)])
    assert got and all(off >= 100 * MiB for off, _ in got)


def test_unaligned_reads_drop_whole_pages_of_what_was_read() -> None:
    d = DropBehind(keep=PAGE * 4, step=PAGE * 4, jitter=PAGE * 4)
    d.track(1)
    got = drops(d, 1, [(100 + i * 1000, 1000) for i in range(100)])
    for off, n in got:
        assert off % PAGE == 0 and n % PAGE == 0
        assert off >= 100  # never before the first byte read
        assert off + n <= 100 + 100 * 1000 - PAGE * 4


def test_sizes_must_be_pages() -> None:
    with pytest.raises(ValueError, match="keep"):
        DropBehind(keep=1000)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 200), st.integers(1, 6)),
        max_size=300,
    )
)
def test_dropped_pages_were_read_by_their_handle_and_are_keep_behind(
    reads: list[tuple[int, int, int]],
) -> None:
    """Whatever the handles read (in MiB units, interleaved), a dropped MiB lies within
    ``jitter`` of a MiB that handle read (the gaps a run may span), and at least ``keep``
    behind the furthest byte that handle had read; untracked handles drop nothing."""
    keep, step, jitter = 8 * MiB, 4 * MiB, 2 * MiB
    d = DropBehind(keep=keep, step=step, jitter=jitter)
    for fh in range(3):  # handle 3 is not tracked
        d.track(fh)
    covered: dict[int, set[int]] = {fh: set() for fh in range(4)}  # MiBs read
    furthest: dict[int, int] = dict.fromkeys(range(4), 0)
    for fh, off_mib, n_mib in reads:
        off, n = off_mib * MiB, n_mib * MiB
        covered[fh].update(range(off_mib, off_mib + n_mib))
        furthest[fh] = max(furthest[fh], off + n)
        r = d.read(fh, off, n)
        if r is None:
            continue
        assert fh != 3
        lo, length = r
        assert length >= step and lo % PAGE == 0 and length % PAGE == 0
        assert lo + length <= furthest[fh] - keep
        near = {m + k for m in covered[fh] for k in range(-jitter // MiB, jitter // MiB + 1)}
        assert all(m in near for m in range(lo // MiB, -(-(lo + length) // MiB)))
