"""The control socket's request parsing: line length and nesting limits before parsing."""

from __future__ import annotations

import errno
import json

import pytest

from airfs.control.protocol import MAX_DEPTH, MAX_LINE, BadMessage, decode, too_deep


def _nested(depth: int) -> bytes:
    """A status request whose ``x`` nests ``depth`` lists and objects, alternating."""
    x: object = 1
    for i in range(depth):
        x = [x] if i % 2 else {"a": x}
    return json.dumps({"op": "status", "x": x}).encode()


def test_nesting_is_counted_across_both_bracket_kinds_and_strings_are_ignored() -> None:
    assert not too_deep(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    assert too_deep(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert too_deep(b"[{" * 17 + b"}]" * 17)  # 34 levels, alternating
    assert not too_deep(b"[" + b"[]," * 1000 + b"[]]")  # wide, not deep
    assert not too_deep(json.dumps(["[" * 100, '\\"[[[' * 50]).encode())  # brackets in strings
    assert too_deep(b"[" * 200000)  # unbalanced


def test_decode_refuses_what_is_too_long_too_deep_or_not_an_object() -> None:
    # the object level counts: MAX_DEPTH - 1 more levels inside it are fine
    assert decode(_nested(MAX_DEPTH - 1))["op"] == "status"
    with pytest.raises(BadMessage, match=f"nested more than {MAX_DEPTH} levels") as e:
        decode(_nested(MAX_DEPTH))
    assert e.value.errno == errno.EINVAL
    with pytest.raises(BadMessage, match="longer than") as e:
        decode(b" " * (MAX_LINE + 1))
    assert e.value.errno == errno.EMSGSIZE
    with pytest.raises(BadMessage, match="not JSON"):
        decode(b'{"op": ')
    with pytest.raises(BadMessage, match="not a JSON object"):
        decode(b"[1]")
