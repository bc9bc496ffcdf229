"""Modes kept exactly by every origin (issue 10): ``put`` creates the object with its final
mode (no moment with another one), a put over a symbolic link never takes the link's mode, and
S3 keeps modes in object metadata, so another client (another node) lists them too."""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import obstore
import pytest

from airfs.origin.base import Kind, Origin, OriginError
from airfs.origin.s3 import S3Origin
from airfs.testing.seaweed import SeaweedServer

if TYPE_CHECKING:
    from conftest import Case


def put(case: Case, path: str, data: bytes, mode: int | None) -> None:
    src = case.tmp / f"src-{uuid.uuid4().hex}"
    src.write_bytes(data)
    try:
        case.origin.put(path, str(src), None, mode=mode)
    finally:
        src.unlink()


def test_put_creates_the_object_with_its_mode(case: Case, origin: Origin) -> None:
    put(case, "p", b"private", 0o600)
    assert origin.stat("p").mode == 0o600
    assert {e.name: e.mode for e in origin.list("")} == {"p": 0o600}
    put(case, "p", b"replaced, mode kept", None)
    assert origin.stat("p").mode == 0o600
    put(case, "p", b"replaced, new mode", 0o640)
    assert origin.stat("p").mode == 0o640
    put(case, "n", b"new without a mode", None)
    assert origin.stat("n").mode == 0o644


def test_posix_put_never_shows_a_wider_mode(case: Case, origin: Origin) -> None:
    """Watch the directory while private files are committed: no name (final or temporary)
    ever has group or other bits (this is what another user at the origin could open)."""
    if case.name != "posix":
        pytest.skip("a directory to watch")
    root = origin.url
    seen: list[tuple[str, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for e in os.scandir(root):
                try:
                    mode = stat.S_IMODE(e.stat(follow_symlinks=False).st_mode)
                except FileNotFoundError:
                    continue
                seen.append((e.name, mode))

    t = threading.Thread(target=watch)
    t.start()
    try:
        old = os.umask(0)  # the process umask must not matter either way
        try:
            for i in range(200):
                put(case, f"f{i}", b"x" * 4096, 0o600)
        finally:
            os.umask(old)
    finally:
        stop.set()
        t.join()
    assert seen  # it did watch
    assert [s for s in seen if s[1] & 0o077] == []


def test_posix_mkdir_takes_the_exact_mode_whatever_the_umask(case: Case, origin: Origin) -> None:
    if case.name != "posix":
        pytest.skip("modes of directories are stored by posix only")
    old = os.umask(0o077)
    try:
        assert origin.mkdir("d", 0o755).mode == 0o755
        assert origin.mkdir("s", 0o1777).mode == 0o1777
    finally:
        os.umask(old)


def test_s3_modes_are_in_the_metadata_for_every_client(
    s3_origin_factory: Callable[..., S3Origin], seaweed: SeaweedServer, tmp_path: Path
) -> None:
    a = s3_origin_factory()
    src = tmp_path / "src"
    src.write_bytes(b"private")
    a.put("d/p", str(src), None, mode=0o600)
    a.put("d/q", str(src), None, mode=0o640)
    obstore.put(a.client.store, "d/foreign", b"written by another tool")  # no mode metadata

    def other(**kwargs: object) -> S3Origin:  # another node: nothing known yet
        return S3Origin.from_url(a.url, env=seaweed.env, **kwargs)

    b = other()
    try:
        assert {e.name: e.mode for e in b.list("d")} == {"p": 0o600, "q": 0o640, "foreign": 0o644}
        assert b.stat("d/p").mode == 0o600
    finally:
        b.close()
    t = other(list_heads=False)  # --s3-trust-listings: no HEADs, the default for unseen objects
    try:
        assert {e.name: e.mode for e in t.list("d")}["p"] == 0o644
        assert t.stat("d/p").mode == 0o600
        assert {e.name: e.mode for e in t.list("d")}["p"] == 0o600  # seen now
    finally:
        t.close()
    w = other()  # a bare listing (``airfs warm``): no HEAD, so the mode is not known yet
    try:
        assert w.capabilities.bare_lists
        bare = {e.name: e for e in w.list("d", attrs=False)}
        assert bare["p"].mode == 0o644 and bare["p"].version == b.stat("d/p").version
        assert bare["p"].size == len(b"private")
        entry, data = w.read_small("d/p", 1 << 20)  # its GET tells the mode, as a HEAD would
        assert entry.mode == 0o600 and bytes(data or b"") == b"private"
        assert {e.name: e.mode for e in w.list("d", attrs=False)}["p"] == 0o600  # seen now
        assert {e.name: e.mode for e in w.list("d", attrs=False)}["q"] == 0o644
        w.read_range_buffer("d/q", 0, 3, bare["q"].version)  # a fetch's first part: seen too
        assert {e.name: e.mode for e in w.list("d", attrs=False)}["q"] == 0o640
    finally:
        w.close()
    c = other(default_mode=0o600)  # --s3-default-mode 600
    try:
        assert c.stat("d/foreign").mode == 0o600
        assert {e.name: e.mode for e in c.list("d")}["foreign"] == 0o600
    finally:
        c.close()
    # chmod of a committed object: stored (a copy onto itself), seen by others
    assert a.set_attrs("d/q", mode=0o600).mode == 0o600
    a.rename("d/q", "d/r")  # a copy keeps the metadata
    d = other()
    try:
        assert d.stat("d/r").mode == 0o600
        assert {e.name: e.mode for e in d.list("d")}["r"] == 0o600
    finally:
        d.close()
    assert a.read_range("d/r", 0, 100) == b"private"


def test_s3_listing_asks_attributes_only_up_to_heads_max(
    s3_origin_factory: Callable[..., S3Origin], seaweed: SeaweedServer, tmp_path: Path
) -> None:
    """``list(path, heads_max=N)``: the attributes not known are asked (a HEAD each) when at
    most N objects and subdirectories need it; beyond, none is asked and those entries are
    ``guessed`` (defaults, but the right names, kinds, sizes and versions). What is known
    is never guessed, and ``--s3-trust-listings`` (no ``list_heads``) guesses nothing."""
    a = s3_origin_factory()
    src = tmp_path / "src"
    src.write_bytes(b"private")
    for i in range(5):
        a.put(f"d/f{i}", str(src), None, mode=0o600)
    a.mkdir("d/sub", 0o700)
    time.sleep(2.1)  # what is read within 2 s of Last-Modified is not trusted by listings

    def other(**kwargs: object) -> S3Origin:  # another node: nothing known yet
        return S3Origin.from_url(a.url, env=seaweed.env, **kwargs)

    b = other()
    try:
        full = {e.name: e for e in b.list("d", heads_max=6)}  # 5 objects + 1 directory
        assert not any(e.guessed for e in full.values())
        assert full["f0"].mode == 0o600
    finally:
        b.close()
    c = other()
    try:
        bare = {e.name: e for e in c.list("d", heads_max=5)}
        assert sorted(bare) == ["f0", "f1", "f2", "f3", "f4", "sub"]
        assert all(e.guessed for e in bare.values())
        assert bare["f0"].mode == 0o644 and bare["sub"].kind is Kind.DIR
        assert bare["f3"].size == 7 and bare["f3"].version == a.stat("d/f3").version
        assert c.stat("d/f3").mode == 0o600  # seen now: no longer guessed
        again = {e.name: e for e in c.list("d", heads_max=0)}
        assert not again["f3"].guessed and again["f3"].mode == 0o600
        assert again["f2"].guessed
    finally:
        c.close()
    t = other(list_heads=False)
    try:
        assert not any(e.guessed for e in t.list("d", heads_max=0))
    finally:
        t.close()


def test_posix_never_follows_a_link_placed_at_the_origin(
    case: Case, origin: Origin, tmp_path: Path
) -> None:
    """A link in the middle of a path (another tool's, or one swapped in after a check) does
    not take the origin outside its directory, nor to another file."""
    if case.name != "posix":
        pytest.skip("links at a posix origin")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not yours")
    (outside / "secret").chmod(0o600)
    root = Path(origin.url)
    (root / "esc").symlink_to(outside)
    (root / "f").symlink_to(outside / "secret")
    for call in (
        lambda: origin.stat("esc/secret"),
        lambda: origin.list("esc"),
        lambda: origin.read_range("esc/secret", 0, 10),
        lambda: origin.read_range("f", 0, 10),
        lambda: put(case, "esc/new", b"x", 0o644),
        lambda: origin.delete("esc/secret"),
        lambda: origin.mkdir("esc/d"),
        lambda: origin.rename("esc/secret", "stolen"),
        lambda: origin.set_attrs("esc/secret", mode=0o666),
    ):
        with pytest.raises(OriginError) as ei:
            call()
        assert ei.value.errno in (errno.ENOTDIR, errno.ELOOP), ei.value
    origin.set_attrs("f", mode=0o666)  # a link's own mode cannot change: nothing happens
    assert stat.S_IMODE((outside / "secret").stat().st_mode) == 0o600
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_bytes() == b"not yours"
    assert origin.stat("esc").kind is Kind.SYMLINK
