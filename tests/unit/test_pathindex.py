"""The directory index of paths (:mod:`airfs.util.pathindex`) against a brute-force model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airfs.util.pathindex import PathDict, PathIndex

names = st.sampled_from(["a", "b", "c", "ab"])
paths = st.lists(names, min_size=1, max_size=4).map("/".join)
dirs = st.one_of(st.just(""), paths)
ops = st.lists(st.tuples(st.sampled_from(["add", "discard", "pop"]), paths), max_size=60)


def model_under(keys: set[str], d: str) -> set[str]:
    return {p for p in keys if not d or p == d or p.startswith(d + "/")}


def model_children(keys: set[str], d: str) -> set[str]:
    prefix = d + "/" if d else ""
    return {p for p in keys if p.startswith(prefix) and "/" not in p[len(prefix) :]}


@settings(max_examples=300, deadline=None)
@given(ops, st.lists(dirs, min_size=1, max_size=8))
def test_index_answers_like_a_full_scan(script: list[tuple[str, str]], probes: list[str]) -> None:
    idx = PathIndex()
    d: PathDict[int] = PathDict()
    keys: set[str] = set()
    for i, (op, p) in enumerate(script):
        if op == "add":
            idx.add(p)
            d[p] = i
            keys.add(p)
        elif op == "discard":
            idx.discard(p)
            if p in d:
                del d[p]
            keys.discard(p)
        else:
            expected = d.get(p)
            assert d.pop(p, None) == expected
            assert p not in d
            idx.discard(p)
            keys.discard(p)
        assert len(idx) == len(keys) == len(d)
    for probe in probes:
        for index in (idx, d.index):
            assert sorted(index.under(probe)) == sorted(model_under(keys, probe))
            assert sorted(index.children(probe)) == sorted(model_children(keys, probe))
            assert index.has_under(probe) == bool(model_under(keys, probe) - {probe})


def test_pathdict_keeps_the_index_through_every_mutator() -> None:
    d: PathDict[int] = PathDict()
    d["a/b"] = 1
    d.setdefault("a/c", 2)
    d.update({"x/y/z": 3})
    d |= {"x/w": 4}
    assert sorted(d.under("x")) == ["x/w", "x/y/z"]
    assert d.pop("x/w") == 4
    with pytest.raises(KeyError):
        d.pop("x/w")
    assert d.pop("x/w", 7) == 7
    assert d.children("a") == ["a/b", "a/c"]  # insertion order within a directory
    d.popitem()
    assert sorted(d.under("")) == sorted(d) == ["a/b", "a/c"]
    d.clear()
    assert d.under("") == [] and len(d.index) == 0


def test_root_member_and_a_directory_that_is_also_a_member() -> None:
    idx = PathIndex(["", "a", "a/b", "a/b/c"])
    assert sorted(idx.under("")) == ["", "a", "a/b", "a/b/c"]
    assert sorted(idx.under("a")) == ["a", "a/b", "a/b/c"]
    assert idx.children("") == ["a"]
    idx.discard("a/b/c")
    assert not idx.has_under("a/b") and idx.has_under("a")
    assert sorted(idx.under("a")) == ["a", "a/b"]
