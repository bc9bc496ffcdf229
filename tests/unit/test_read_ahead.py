"""The daemon's raise of the mount's kernel readahead (``airfs.daemon.process``): retried while
the mount is not visible yet, tried once where it cannot be done (a user's mount, a read-only
``/sys``), and always signalled done, since the mount reports ready only after it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio

from airfs.daemon import process


def daemon() -> Any:
    return SimpleNamespace(
        cfg=SimpleNamespace(mountpoint="/mnt/x", read_ahead_kb=1024, fuse="kernel"),
        read_ahead=False,
    )


@pytest.mark.parametrize(
    ("answers", "calls", "raised"),
    [
        ([True], 1, True),  # raised at once (the kernel transport: no wait after INIT)
        ([None], 1, False),  # cannot (not root): tried once, the mount is ready at once
        ([False, False, True], 3, True),  # the mount not in mountinfo yet: retried
        ([False] * 20, 20, False),  # never: given up after 20 tries
    ],
)
def test_the_raise_is_retried_only_when_it_may_succeed(
    monkeypatch: pytest.MonkeyPatch, answers: list[bool | None], calls: int, raised: bool
) -> None:
    seen: list[str] = []

    def fake(mountpoint: str, kb: int) -> bool | None:
        seen.append(mountpoint)
        return answers[len(seen) - 1]

    monkeypatch.setattr(process, "raise_read_ahead", fake)
    d = daemon()

    async def main() -> None:
        initialized, done = trio.Event(), trio.Event()
        initialized.set()
        with trio.fail_after(5):
            await process._raise_read_ahead(d, initialized, done)
        assert done.is_set()

    trio.run(main)
    assert len(seen) == calls
    assert d.read_ahead is raised


def test_a_permission_error_is_final_and_a_missing_entry_is_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``raise_read_ahead`` on the sysfs file: EACCES (a user) is None, a missing file False."""
    monkeypatch.setattr(process, "mount_device", lambda mp: "0:999999")
    assert process.raise_read_ahead("/mnt/x", 1024) is False  # no such bdi entry (yet)
    real_open = open

    def deny(path: Any, *a: Any, **kw: Any) -> Any:
        if str(path).startswith("/sys/class/bdi/"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", deny)
    assert process.raise_read_ahead("/mnt/x", 1024) is None
