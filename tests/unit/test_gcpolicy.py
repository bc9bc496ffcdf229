"""airfs.daemon.gcpolicy: the daemon's collector thresholds, what is frozen, what is
recorded, and the setting's bad values. ``tune`` changes the whole process's collector, so it
runs in a child interpreter here, never in the test process."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from airfs.daemon import gcpolicy

CHILD = """
import gc, json, sys
from airfs.daemon import gcpolicy
young = int(sys.argv[1])
default = gc.get_threshold()
tuned = gcpolicy.tune(young)
class Node:
    def __init__(self):
        self.other = None
def cycles(n):
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a
cycles(100)  # 200 objects that only the collector frees (100 cycles of two)
gc.collect()
after = gcpolicy.statistics()
print(json.dumps({"default": default, "tuned": tuned.to_dict(), "after": after.to_dict()}))
"""


def child(young: int) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(young)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def test_tune_raises_the_young_threshold_freezes_and_records() -> None:
    out = child(50_000)
    default, tuned, after = out["default"], out["tuned"], out["after"]
    assert tuned["thresholds"] == [50_000, default[1], default[2]]  # older ratios kept
    assert isinstance(tuned["frozen"], int) and tuned["frozen"] > 1_000  # the imported modules
    assert tuned["collections"] == [0, 0, 0]
    # the one full collection asked for is recorded, with the cycles it freed (whatever
    # else was garbage then too: at least the 200 objects)
    assert after["collections"] == [0, 0, 1], after
    collected = after["collected"]
    assert isinstance(collected, list) and collected[2] >= 200, after
    seconds = after["seconds"]
    assert isinstance(seconds, list) and seconds[2] > 0 and seconds[:2] == [0, 0], after
    assert after["frozen"] == tuned["frozen"]  # the cycles were not frozen: they were freed


def test_zero_keeps_cpythons_thresholds_and_freezes_nothing() -> None:
    out = child(0)
    assert out["tuned"]["thresholds"] == out["default"]
    assert out["tuned"]["frozen"] == 0
    # still recorded (at CPython's threshold of 700 the cycles may set off a young one too)
    assert out["after"]["collections"][2] == 1


@pytest.mark.parametrize("raw", ["x", "-1", "1.5", ""])
def test_bad_setting_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("AIRFS_GC_YOUNG", raw)
    with pytest.raises(ValueError, match="AIRFS_GC_YOUNG"):
        gcpolicy.young_threshold()


def test_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFS_GC_YOUNG", raising=False)
    assert gcpolicy.young_threshold() == gcpolicy.YOUNG
    monkeypatch.setenv("AIRFS_GC_YOUNG", "0")
    assert gcpolicy.young_threshold() == 0
    monkeypatch.setenv("AIRFS_GC_YOUNG", "2000")
    assert gcpolicy.young_threshold() == 2000


def test_statistics_before_tune_are_zeros() -> None:
    st = gcpolicy.statistics()  # this process never tuned
    assert st.collections == (0, 0, 0) and st.seconds == (0.0, 0.0, 0.0)
    assert st.to_dict()["thresholds"] == list(st.thresholds)
