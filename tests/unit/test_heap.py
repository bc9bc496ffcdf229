"""airfs.daemon.heap: when the daemon trims its heap, and the knobs' bad values (issue 11)."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

from airfs.daemon import heap


def test_trims_once_after_each_burst_never_while_busy() -> None:
    work = [0]
    trims: list[int] = []  # the activity counter at each trim

    def trimmer() -> bool:
        trims.append(work[0])
        return True

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(heap.trim_when_idle, in_thread=False),
                lambda: work[0],
                5.0,
                trimmer,
            )
            await trio.sleep(60)  # idle from the start: nothing to give back
            assert trims == []
            for _ in range(20):  # busy: a request every second, for 20 s
                work[0] += 1
                await trio.sleep(1)
            assert trims == []
            await trio.sleep(11)  # quiet for two periods: one trim
            assert trims == [20]
            await trio.sleep(120)  # and no more while nothing happens
            assert trims == [20]
            work[0] += 1  # another burst
            await trio.sleep(11)
            assert trims == [20, 21]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_zero_seconds_turns_trimming_off() -> None:
    calls: list[int] = []

    def trimmer() -> bool:
        calls.append(1)
        return True

    async def main() -> None:
        with trio.fail_after(1):
            await heap.trim_when_idle(lambda: len(calls), 0, trimmer)

    trio.run(main)
    assert calls == []


@pytest.mark.parametrize("raw", ["x", "-1", "nan", "inf"])
def test_bad_trim_setting_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("AIRFS_HEAP_TRIM_S", raw)
    with pytest.raises(ValueError, match="AIRFS_HEAP_TRIM_S"):
        heap.trim_idle_seconds()


def test_trim_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFS_HEAP_TRIM_S", raising=False)
    assert heap.trim_idle_seconds() == heap.TRIM_IDLE_S
    monkeypatch.setenv("AIRFS_HEAP_TRIM_S", "0")
    assert heap.trim_idle_seconds() == 0


def test_arena_cap_must_be_positive() -> None:
    with pytest.raises(ValueError):
        heap.limit_arenas(0)


def test_arena_cap_leaves_an_explicit_setting_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert heap.limit_arenas(2) is False
