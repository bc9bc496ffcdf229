"""The origin conformance suite: one body of tests, run on every origin (see conftest.py).

What differs between origins is declared in :class:`Case` (symlinks, stored modes, whether a
put into a missing directory fails); everything else must behave the same.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pytest

from airfs.origin.base import (
    Conflict,
    Exists,
    IsADir,
    Kind,
    NotADir,
    NotEmpty,
    NotFound,
    NotSupported,
    Origin,
    OriginError,
)

if TYPE_CHECKING:
    from conftest import Case

MiB = 1 << 20


def names(origin: Origin, path: str = "") -> dict[str, Kind]:
    return {e.name: e.kind for e in origin.list(path)}


# -- stat / list -----------------------------------------------------------------------------


def test_root_is_an_empty_directory(origin: Origin) -> None:
    assert isinstance(origin, Origin)  # implements the whole protocol
    assert origin.url
    root = origin.stat("")
    assert root.kind is Kind.DIR
    assert root.version == ""
    assert list(origin.list("")) == []


def test_root_cannot_be_removed_or_renamed(origin: Origin) -> None:
    with pytest.raises(OriginError):
        origin.rmdir("")  # even when empty
    origin.mkdir("d")
    with pytest.raises(OriginError):
        origin.rmdir("")
    with pytest.raises(OriginError):
        origin.rename("", "elsewhere")
    with pytest.raises(OriginError):
        origin.rename("d", "")
    with pytest.raises(IsADir):
        origin.delete("")
    with pytest.raises(Exists):
        origin.mkdir("")
    assert origin.stat("").kind is Kind.DIR
    assert names(origin) == {"d": Kind.DIR}


def test_put_stat_list_agree(case: Case, origin: Origin) -> None:
    before = time.time_ns()
    put = case.put_bytes("a.bin", b"x" * 1000)
    assert put.name == "a.bin"
    assert put.kind is Kind.FILE
    assert put.size == 1000
    assert put.version
    assert put.mode == 0o644
    # S3 keeps whole seconds; allow for that and a little clock skew
    assert before - 2_000_000_000 <= put.mtime_ns <= time.time_ns() + 2_000_000_000

    st = origin.stat("a.bin")
    assert (st.name, st.kind, st.size, st.version) == ("a.bin", Kind.FILE, 1000, put.version)
    assert st.mode == 0o644
    (listed,) = origin.list("")
    assert (listed.name, listed.kind, listed.size, listed.version) == (
        "a.bin",
        Kind.FILE,
        1000,
        put.version,
    )
    assert listed.mode == 0o644


def test_stat_and_list_errors(case: Case, origin: Origin) -> None:
    with pytest.raises(NotFound) as ei:
        origin.stat("missing")
    assert ei.value.errno == errno.ENOENT
    with pytest.raises(NotFound):
        origin.stat("missing/deeper")
    with pytest.raises(NotFound) as ei:
        origin.list("missing")
    assert ei.value.errno == errno.ENOENT
    case.put_bytes("f", b"data")
    with pytest.raises(NotADir) as ei2:
        origin.list("f")
    assert ei2.value.errno == errno.ENOTDIR


def test_nested_directories(case: Case, origin: Origin) -> None:
    origin.mkdir("d")
    origin.mkdir("d/e")
    origin.mkdir("d/empty")
    case.put_bytes("d/e/f.txt", b"hello")
    case.put_bytes("d/top.txt", b"top")
    assert names(origin) == {"d": Kind.DIR}
    assert names(origin, "d") == {"e": Kind.DIR, "empty": Kind.DIR, "top.txt": Kind.FILE}
    assert names(origin, "d/e") == {"f.txt": Kind.FILE}
    assert names(origin, "d/empty") == {}
    for path in ("d", "d/e", "d/empty"):
        st = origin.stat(path)
        assert st.kind is Kind.DIR and st.version == "" and st.name == path.rsplit("/")[-1]
    assert case.read_all("d/e/f.txt") == b"hello"


# -- read_range ------------------------------------------------------------------------------


def test_read_range(case: Case, origin: Origin) -> None:
    data = bytes(range(256)) * 40  # 10240 bytes
    e = case.put_bytes("r.bin", data)
    assert origin.read_range("r.bin", 0, 10) == data[:10]
    assert origin.read_range("r.bin", 100, 1000) == data[100:1100]
    assert origin.read_range("r.bin", 0, len(data)) == data
    assert origin.read_range("r.bin", 10000, 1000) == data[10000:]  # short at the end only
    assert origin.read_range("r.bin", len(data), 10) == b""  # at EOF
    assert origin.read_range("r.bin", len(data) + 5000, 10) == b""  # past EOF
    assert origin.read_range("r.bin", 5, 0) == b""
    assert origin.read_range("r.bin", 7, 9, e.version) == data[7:16]
    assert origin.read_range("r.bin", len(data) + 1, 9, e.version) == b""


def test_read_range_empty_file(case: Case, origin: Origin) -> None:
    e = case.put_bytes("empty", b"")
    assert e.size == 0
    assert origin.stat("empty").size == 0
    assert origin.read_range("empty", 0, 100) == b""
    assert origin.read_range("empty", 0, 100, e.version) == b""


def test_read_range_errors(case: Case, origin: Origin) -> None:
    with pytest.raises(NotFound) as ei:
        origin.read_range("missing", 0, 10)
    assert ei.value.errno == errno.ENOENT
    origin.mkdir("d")
    with pytest.raises(IsADir) as ei2:
        origin.read_range("d", 0, 10)
    assert ei2.value.errno == errno.EISDIR


def test_read_with_old_version_conflicts(case: Case, origin: Origin) -> None:
    v1 = case.put_bytes("v.bin", b"one" * 100).version
    v2 = case.put_bytes("v.bin", b"two" * 50).version
    assert v1 != v2
    with pytest.raises(Conflict) as ei:
        origin.read_range("v.bin", 0, 10, v1)
    assert ei.value.errno == errno.EIO
    with pytest.raises(Conflict):  # also when the range is past the new, shorter end
        origin.read_range("v.bin", 200, 10, v1)
    assert origin.read_range("v.bin", 0, 6, v2) == b"twotwo"
    assert origin.read_range("v.bin", 0, 6) == b"twotwo"


def test_read_range_buffer_is_read_range_without_the_copy(case: Case, origin: Origin) -> None:
    """``Capabilities.buffer_reads``: the same bytes and errors as ``read_range``, as a view
    of the client's buffer (the block cache's fetches hold no GIL to copy 8 MiB parts)."""
    if not origin.capabilities.buffer_reads:
        pytest.skip(f"{case.name}: no buffer reads")
    data = bytes(range(256)) * 40
    v1 = case.put_bytes("b.bin", data).version
    got = origin.read_range_buffer("b.bin", 100, 1000, v1)  # type: ignore[attr-defined]
    assert isinstance(got, memoryview) and got.readonly and bytes(got) == data[100:1100]
    past = origin.read_range_buffer("b.bin", len(data) + 1, 9, v1)  # type: ignore[attr-defined]
    assert bytes(past) == b""
    case.put_bytes("b.bin", b"two" * 50)
    with pytest.raises(Conflict):
        origin.read_range_buffer("b.bin", 0, 10, v1)  # type: ignore[attr-defined]
    with pytest.raises(NotFound):
        origin.read_range_buffer("missing", 0, 10)  # type: ignore[attr-defined]


def test_read_range_into_is_read_range_into_a_given_buffer(case: Case, origin: Origin) -> None:
    """``Capabilities.into_reads``: the bytes and errors of ``read_range``, written into the
    caller's buffer (a reused, page-aligned one: no new pages per part); the count is short
    only at the end of the object, and what lies past it is left as it was."""
    if not origin.capabilities.into_reads:
        pytest.skip(f"{case.name}: no reads into a buffer")
    data = os.urandom(3 * 1024 * 1024 + 17)  # several chunks of the client's
    v1 = case.put_bytes("i.bin", data).version
    buf = bytearray(b"\xee" * (len(data) + 100))
    view = memoryview(buf)
    into = origin.read_range_into  # type: ignore[attr-defined]
    assert into("i.bin", 0, view[: len(data)], v1) == len(data)
    assert bytes(buf[: len(data)]) == data
    assert into("i.bin", 1000, view[:500], v1) == 500 and bytes(buf[:500]) == data[1000:1500]
    assert into("i.bin", len(data) - 10, view, v1) == 10  # short at the end
    assert bytes(buf[:10]) == data[-10:] and buf[10] == data[1010]  # past the count: as it was
    assert into("i.bin", len(data) + 5, view[:9], v1) == 0
    assert into("i.bin", 7, view[:0], v1) == 0
    case.put_bytes("i.bin", b"two" * 50)
    with pytest.raises(Conflict):
        into("i.bin", 0, view[:10], v1)
    with pytest.raises(NotFound):
        into("missing", 0, view[:10])


def test_read_small_is_stat_and_read_in_one_request(case: Case, origin: Origin) -> None:
    """``Capabilities.whole_reads``: the entry ``stat`` gives and, up to ``most`` bytes, the
    whole content, as a read-only buffer; a bigger file gives its entry only; a missing
    name raises ``NotFound``."""
    if not origin.capabilities.whole_reads:
        pytest.skip(f"{case.name}: no whole reads")
    data = os.urandom(3000)
    case.put_bytes("w.bin", data)
    entry, got = origin.read_small("w.bin", 4096)  # type: ignore[attr-defined]
    assert entry == origin.stat("w.bin")
    assert got is not None and got.readonly and bytes(got) == data
    entry, got = origin.read_small("w.bin", 2999)  # type: ignore[attr-defined]
    assert entry.size == 3000 and got is None
    case.put_bytes("w.bin", b"two")
    entry, got = origin.read_small("w.bin", 4096)  # type: ignore[attr-defined]
    assert entry.version == origin.stat("w.bin").version and bytes(got or b"") == b"two"
    with pytest.raises(NotFound):
        origin.read_small("missing", 4096)  # type: ignore[attr-defined]


# -- put ---------------------------------------------------------------------------------------


def test_put_replace_changes_version(case: Case, origin: Origin) -> None:
    e1 = case.put_bytes("p", b"first")
    e2 = case.put_bytes("p", b"second!")
    e3 = case.put_bytes("p", b"first")  # same bytes as e1: still a new write
    assert e2.version not in ("", e1.version)
    assert e2.size == 7
    assert origin.stat("p").version == e3.version
    assert case.read_all("p") == b"first"
    assert names(origin) == {"p": Kind.FILE}


def test_put_if_match(case: Case, origin: Origin) -> None:
    e1 = case.put_bytes("c", b"v1")
    e2 = case.put_bytes("c", b"v2", if_match=e1.version)  # current version: accepted
    assert case.read_all("c") == b"v2"
    with pytest.raises(Conflict) as ei:
        case.put_bytes("c", b"v3", if_match=e1.version)  # stale version: refused
    assert ei.value.errno == errno.EIO
    assert case.read_all("c") == b"v2"
    assert origin.stat("c").version == e2.version

    with pytest.raises(Conflict):
        case.put_bytes("c", b"v4", if_match="")  # create-only on an existing object
    assert case.read_all("c") == b"v2"
    created = case.put_bytes("new", b"n", if_match="")  # create-only on a new name
    assert origin.stat("new").version == created.version
    with pytest.raises(Conflict):
        case.put_bytes("gone", b"g", if_match=e2.version)  # version of an object not there
    with pytest.raises(NotFound):
        origin.stat("gone")


def test_an_empty_create_only_put_claims_the_name(case: Case, origin: Origin) -> None:
    """The claim of an ``O_EXCL`` create: an empty put with ``if_match=""`` (the POSIX origin
    links it in place, without a temporary's ``fsync``): created once, refused after, one
    name, its entry what ``stat`` says, nothing else left in the directory."""
    origin.mkdir("d")
    e = case.put_bytes("d/lock", b"", if_match="")
    assert (e.kind, e.size, e.nlink) == (Kind.FILE, 0, 1)
    got = origin.stat("d/lock")
    assert (got.version, got.size, got.mode, got.nlink) == (e.version, 0, e.mode, 1)
    with pytest.raises(Conflict):
        case.put_bytes("d/lock", b"", if_match="")
    case.put_bytes("d/other", b"x")
    with pytest.raises(Conflict):
        case.put_bytes("d/other", b"", if_match="")
    assert case.read_all("d/other") == b"x"
    assert names(origin, "d") == {"lock": Kind.FILE, "other": Kind.FILE}
    # the claimed version is what a commit over it names
    case.put_bytes("d/lock", b"content", if_match=e.version)
    assert case.read_all("d/lock") == b"content"


def test_put_errors(case: Case, origin: Origin) -> None:
    origin.mkdir("d")
    with pytest.raises(IsADir) as ei:
        case.put_bytes("d", b"x")
    assert ei.value.errno == errno.EISDIR
    if case.strict_parents:
        with pytest.raises(NotFound):
            case.put_bytes("nodir/f", b"x")
    else:  # object stores: the directory is implied by the key
        case.put_bytes("nodir/f", b"x")
        assert origin.stat("nodir").kind is Kind.DIR
        assert names(origin, "nodir") == {"f": Kind.FILE}


def _fill(size: int, byte: int) -> bytes:
    return bytes([byte]) * size


def test_put_is_atomic_for_readers(case: Case, origin: Origin) -> None:
    """A reader polling while large objects replace each other sees the old object or the
    whole new one: sizes and bytes always belong to one version. (On S3 the 72 MiB object
    is a multipart upload, the 8 MiB ones single PUTs.)"""
    sizes = {1: 8 * MiB, 2: 72 * MiB, 3: 8 * MiB}
    case.put_bytes("big", _fill(sizes[1], 1))
    seen: set[int] = set()
    errors: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                st = origin.stat("big")
                chunks = [
                    origin.read_range("big", off, 4096, st.version)
                    for off in (0, st.size // 2, st.size - 4096)
                ]
            except Conflict:
                continue  # replaced between stat and read: fine, try again
            except Exception as exc:  # a missing object or any other error is a failure
                errors.append(repr(exc))
                return
            first = chunks[0][0]
            if first not in sizes or st.size != sizes[first]:
                errors.append(f"size {st.size} with content {first}")
            for c in chunks:
                if c != bytes([first]) * 4096:
                    errors.append(f"mixed content in version {st.version}")
            seen.add(first)
            # a read without a version must also give whole-object bytes at both ends
            try:
                head = origin.read_range("big", 0, 1)
                tail = origin.read_range("big", sizes[head[0]] - 1, 1)
            except Exception as exc:
                errors.append(repr(exc))
                return
            if len(tail) == 1 and tail not in (head, b"\x01", b"\x02", b"\x03"):
                errors.append(f"unexpected tail {tail!r}")

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for v in (2, 3):
            case.put_bytes("big", _fill(sizes[v], v))
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[:5]
    assert {2, 3} & seen  # the readers did read while objects were replaced
    assert origin.stat("big").size == sizes[3]
    assert origin.read_range("big", sizes[3] - 3, 10) == b"\x03" * 3


# -- delete ------------------------------------------------------------------------------------


def test_delete(case: Case, origin: Origin) -> None:
    case.put_bytes("f", b"x")
    origin.delete("f")
    with pytest.raises(NotFound):
        origin.stat("f")
    assert names(origin) == {}
    with pytest.raises(NotFound) as ei:
        origin.delete("f")
    assert ei.value.errno == errno.ENOENT
    origin.mkdir("d")
    with pytest.raises(IsADir) as ei2:
        origin.delete("d")
    assert ei2.value.errno == errno.EISDIR


def test_deleting_the_last_file_keeps_the_directory(case: Case, origin: Origin) -> None:
    """``rm -r d`` deletes d's files, then removes d: d must still exist in between."""
    origin.mkdir("d")
    origin.mkdir("d/sub")
    case.put_bytes("d/sub/f", b"x")
    case.put_bytes("d/g", b"y")
    origin.delete("d/sub/f")
    assert origin.stat("d/sub").kind is Kind.DIR
    origin.rmdir("d/sub")
    origin.delete("d/g")
    assert origin.stat("d").kind is Kind.DIR
    assert names(origin, "d") == {}
    origin.rmdir("d")
    assert names(origin) == {}


# -- mkdir / rmdir -----------------------------------------------------------------------------


def test_mkdir(case: Case, origin: Origin) -> None:
    e = origin.mkdir("d")
    assert (e.name, e.kind, e.version) == ("d", Kind.DIR, "")
    assert origin.stat("d").kind is Kind.DIR
    assert names(origin) == {"d": Kind.DIR}
    assert names(origin, "d") == {}
    with pytest.raises(Exists) as ei:
        origin.mkdir("d")
    assert ei.value.errno == errno.EEXIST
    case.put_bytes("f", b"x")
    with pytest.raises(Exists):
        origin.mkdir("f")
    with pytest.raises(NotFound) as ei2:
        origin.mkdir("missing/child")
    assert ei2.value.errno == errno.ENOENT
    with pytest.raises(NotADir) as ei3:
        origin.mkdir("f/child")
    assert ei3.value.errno == errno.ENOTDIR
    origin.mkdir("d/child")
    assert names(origin, "d") == {"child": Kind.DIR}


def test_rmdir(case: Case, origin: Origin) -> None:
    origin.mkdir("d")
    case.put_bytes("d/f", b"x")
    with pytest.raises(NotEmpty) as ei:
        origin.rmdir("d")
    assert ei.value.errno == errno.ENOTEMPTY
    origin.mkdir("e")
    origin.mkdir("e/sub")
    with pytest.raises(NotEmpty):
        origin.rmdir("e")  # holds only an empty directory: still not empty
    with pytest.raises(NotFound) as ei2:
        origin.rmdir("missing")
    assert ei2.value.errno == errno.ENOENT
    with pytest.raises(NotADir) as ei3:
        origin.rmdir("d/f")
    assert ei3.value.errno == errno.ENOTDIR
    origin.rmdir("e/sub")
    origin.rmdir("e")
    with pytest.raises(NotFound):
        origin.stat("e")
    assert names(origin) == {"d": Kind.DIR}


# -- rename ------------------------------------------------------------------------------------


def test_rename_file(case: Case, origin: Origin) -> None:
    case.put_bytes("a", b"content a")
    origin.rename("a", "b")
    with pytest.raises(NotFound):
        origin.stat("a")
    assert case.read_all("b") == b"content a"
    assert names(origin) == {"b": Kind.FILE}

    case.put_bytes("c", b"content c")
    origin.rename("c", "b")  # replaces
    assert case.read_all("b") == b"content c"
    assert names(origin) == {"b": Kind.FILE}

    case.put_bytes("d", b"content d")
    with pytest.raises(Exists) as ei:
        origin.rename("d", "b", replace=False)
    assert ei.value.errno == errno.EEXIST
    assert case.read_all("b") == b"content c"
    assert case.read_all("d") == b"content d"
    origin.rename("d", "e", replace=False)
    assert names(origin) == {"b": Kind.FILE, "e": Kind.FILE}

    origin.mkdir("dir")
    origin.rename("e", "dir/e")  # into a directory
    assert case.read_all("dir/e") == b"content d"
    assert names(origin, "dir") == {"e": Kind.FILE}


def test_rename_errors(case: Case, origin: Origin) -> None:
    case.put_bytes("f", b"x")
    origin.mkdir("d")
    case.put_bytes("d/inner", b"i")
    origin.mkdir("empty")
    with pytest.raises(NotFound):
        origin.rename("missing", "x")
    with pytest.raises(NotFound):
        origin.rename("f", "nodir/f")
    with pytest.raises(IsADir):
        origin.rename("f", "empty")  # a file cannot replace a directory
    with pytest.raises(NotADir):
        origin.rename("empty", "f")  # a directory cannot replace a file
    with pytest.raises(NotEmpty):
        origin.rename("empty", "d")  # nor a non-empty directory
    with pytest.raises(OriginError) as ei:
        origin.rename("d", "d/below")  # nor move into itself
    assert ei.value.errno == errno.EINVAL
    assert case.read_all("f") == b"x"
    assert case.read_all("d/inner") == b"i"


def test_rename_directory(case: Case, origin: Origin) -> None:
    origin.mkdir("src")
    origin.mkdir("src/sub")
    origin.mkdir("src/empty")
    case.put_bytes("src/a", b"A")
    case.put_bytes("src/sub/b", b"B")
    origin.rename("src", "dst")
    with pytest.raises(NotFound):
        origin.stat("src")
    assert names(origin) == {"dst": Kind.DIR}
    assert names(origin, "dst") == {"a": Kind.FILE, "sub": Kind.DIR, "empty": Kind.DIR}
    assert names(origin, "dst/empty") == {}
    assert case.read_all("dst/sub/b") == b"B"

    origin.mkdir("target")  # an empty directory may be replaced
    origin.rename("dst", "target")
    assert names(origin) == {"target": Kind.DIR}
    assert case.read_all("target/a") == b"A"

    origin.mkdir("other")
    with pytest.raises(Exists):
        origin.rename("other", "target", replace=False)
    origin.rename("other", "renamed-empty")
    assert names(origin) == {"target": Kind.DIR, "renamed-empty": Kind.DIR}


# -- names and sizes -------------------------------------------------------------------------

NAMES = [
    "with space.txt",
    "ünïcödé 日本語.bin",
    "emoji 😀",
    "per%cent#hash?q&amp+plus=eq;semi,comma",
    "brace{}[sq]|pipe^caret`tick'q\"dq<lt>gt",
    "tilde~!@$()*",
    ".hidden",
    "..dots",
    "-dash",
    "bucket",  # words that appear in error messages
    "not found",
]


def test_unusual_names(case: Case, origin: Origin) -> None:
    for i, name in enumerate(NAMES):
        e = case.put_bytes(name, name.encode())
        assert origin.stat(name).version == e.version
        assert case.read_all(name) == name.encode()
        origin.mkdir(f"dir {name}")
        case.put_bytes(f"dir {name}/{name}", bytes([i]))
    listing = names(origin)
    assert listing == {n: Kind.FILE for n in NAMES} | {f"dir {n}": Kind.DIR for n in NAMES}
    for i, name in enumerate(NAMES):
        assert names(origin, f"dir {name}") == {name: Kind.FILE}
        origin.rename(f"dir {name}/{name}", f"dir {name}/renamed {name}")
        assert case.read_all(f"dir {name}/renamed {name}") == bytes([i])
        origin.delete(name)
    assert names(origin) == {f"dir {n}": Kind.DIR for n in NAMES}


def _populate(case: Case, directory: str, count: int) -> None:
    if directory:
        case.origin.mkdir(directory)
    src = case.tmp / "small"
    src.write_bytes(b"0123456789")
    prefix = f"{directory}/" if directory else ""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: case.origin.put(f"{prefix}f{i:06d}", str(src)), range(count)))


def test_many_entries(case: Case, origin: Origin) -> None:
    """More entries than one S3 listing page (1000): listing must paginate."""
    _populate(case, "many", 2500)
    entries = origin.list("many")
    assert len(entries) == 2500
    assert {e.name for e in entries} == {f"f{i:06d}" for i in range(2500)}
    assert all(e.kind is Kind.FILE and e.size == 10 and e.version for e in entries)
    with pytest.raises(NotEmpty):
        origin.rmdir("many")


@pytest.mark.slow
def test_very_many_entries(case: Case, origin: Origin) -> None:
    _populate(case, "", 12_000)
    entries = origin.list("")
    assert len(entries) == 12_000
    assert len({e.name for e in entries}) == 12_000


# -- symlinks, attributes, statfs ----------------------------------------------------------------


def test_symlink(case: Case, origin: Origin) -> None:
    if not case.symlinks:
        with pytest.raises(NotSupported) as ei:
            origin.symlink("link", "target")
        assert ei.value.errno == errno.EOPNOTSUPP
        with pytest.raises(NotSupported) as ei:
            origin.readlink("link")
        assert ei.value.errno == errno.EOPNOTSUPP
        assert names(origin) == {}
        return
    e = origin.symlink("link", "some/target")
    assert e.kind is Kind.SYMLINK
    assert origin.stat("link").kind is Kind.SYMLINK
    assert origin.readlink("link") == "some/target"
    assert names(origin) == {"link": Kind.SYMLINK}
    with pytest.raises(Exists):
        origin.symlink("link", "other")
    origin.rename("link", "link2")
    assert origin.readlink("link2") == "some/target"
    origin.delete("link2")
    assert names(origin) == {}


def test_put_over_a_symlink_makes_a_plain_file(case: Case, origin: Origin) -> None:
    if not case.symlinks:
        pytest.skip("no symlinks on this origin")
    # bug (fixed): put() gave the new file the symlink's mode 0o777 (world-writable)
    origin.symlink("ln", "target")
    e = case.put_bytes("ln", b"now a file")
    assert e.kind is Kind.FILE
    assert origin.stat("ln").mode == e.mode == 0o644


def test_set_attrs(case: Case, origin: Origin) -> None:
    e = case.put_bytes("f", b"x")
    out = origin.set_attrs("f", mode=0o600, mtime_ns=1_000_000_000_000_000_000)
    st = origin.stat("f")
    if case.modes:
        assert out.mode == st.mode == 0o600
    else:  # accepted; nothing changes at the origin (the version stays)
        assert out == st
        assert st.version == e.version
    if case.mtimes:
        assert out.mtime_ns == st.mtime_ns == 1_000_000_000_000_000_000
    with pytest.raises(NotFound):
        origin.set_attrs("missing", mode=0o600)


def test_statfs(origin: Origin) -> None:
    fs = origin.statfs()
    assert fs.block_size > 0
    assert fs.total_blocks > 0 and 0 <= fs.free_blocks <= fs.total_blocks
    assert fs.total_files > 0


# -- concurrency -------------------------------------------------------------------------------


def test_concurrent_calls_from_threads(case: Case, origin: Origin) -> None:
    origin.mkdir("t")

    def work(i: int) -> None:
        data = os.urandom(1000 + i)
        e = case.put_bytes(f"t/{i}", data)
        assert origin.read_range(f"t/{i}", 0, len(data) + 10, e.version) == data
        assert origin.stat(f"t/{i}").version == e.version
        origin.rename(f"t/{i}", f"t/r{i}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(32)))
    assert names(origin, "t") == {f"r{i}": Kind.FILE for i in range(32)}


# -- owners, links, special files (issue 13): run where the capabilities say so --------------


def test_owners_are_kept(case: Case, origin: Origin) -> None:
    if not origin.capabilities.owners:
        pytest.skip("this origin keeps no owners")
    src = case.tmp / "owned"
    src.write_bytes(b"owned")
    e = origin.put("f", str(src), None, mode=0o640, uid=1234, gid=5678)
    assert (e.uid, e.gid, e.mode) == (1234, 5678, 0o640)
    st = origin.stat("f")
    assert (st.uid, st.gid, st.mode) == (1234, 5678, 0o640)
    assert {x.name: (x.uid, x.gid) for x in origin.list("")} == {"f": (1234, 5678)}
    # a put without an owner keeps the replaced file's; a new owner replaces it
    src.write_bytes(b"replaced")
    assert (origin.put("f", str(src)).uid, origin.stat("f").gid) == (1234, 5678)
    assert origin.put("f", str(src), uid=4321).uid == 4321
    assert origin.stat("f").gid == 5678
    # a new file without one has no owner (the mount's default applies), or, where the
    # origin has real owners (POSIX), the daemon's
    plain = case.put_bytes("plain", b"x")
    assert (plain.uid, plain.gid) in ((None, None), (os.geteuid(), os.getegid()))


def test_directory_owners_are_kept(case: Case, origin: Origin) -> None:
    if not origin.capabilities.owners or not case.dir_attrs:
        pytest.skip("this origin keeps no owners of directories")
    d = origin.mkdir("d", 0o750, uid=1234, gid=5678)
    assert (d.uid, d.gid, d.mode) == (1234, 5678, 0o750)
    st = origin.stat("d")
    assert (st.uid, st.gid, st.mode) == (1234, 5678, 0o750)
    assert {x.name: (x.uid, x.gid) for x in origin.list("")} == {"d": (1234, 5678)}
    origin.set_attrs("d", uid=1, gid=2)
    assert (origin.stat("d").uid, origin.stat("d").gid) == (1, 2)


def test_set_attrs_changes_only_what_it_is_given(case: Case, origin: Origin) -> None:
    caps = origin.capabilities
    if not caps.owners:
        pytest.skip("this origin keeps no owners")
    case.put_bytes("f", b"content")
    before = origin.set_attrs("f", mode=0o600, mtime_ns=1_500_000_000_123_456_789)
    out = origin.set_attrs("f", uid=1000, gid=1001)
    st = origin.stat("f")
    assert (out.uid, out.gid) == (st.uid, st.gid) == (1000, 1001)
    assert st.mode == 0o600
    if case.mtimes:
        assert st.mtime_ns == before.mtime_ns == 1_500_000_000_123_456_789
    origin.set_attrs("f", gid=1002)
    assert (origin.stat("f").uid, origin.stat("f").gid) == (1000, 1002)
    assert case.read_all("f") == b"content"
    with pytest.raises(NotFound):
        origin.set_attrs("missing", uid=1)


def test_set_attrs_keeps_atimes(case: Case, origin: Origin) -> None:
    if not origin.capabilities.atimes:
        pytest.skip("this origin keeps no access times")
    case.put_bytes("f", b"x")
    out = origin.set_attrs(
        "f", mtime_ns=1_600_000_000_000_000_000, atime_ns=1_700_000_000_000_000_005
    )
    st = origin.stat("f")
    assert out.atime_ns == st.atime_ns == 1_700_000_000_000_000_005
    assert st.mtime_ns == 1_600_000_000_000_000_000
    origin.set_attrs("f", atime_ns=1_800_000_000_000_000_000)
    assert origin.stat("f").atime_ns == 1_800_000_000_000_000_000
    assert origin.stat("f").mtime_ns == 1_600_000_000_000_000_000


def test_link(case: Case, origin: Origin) -> None:
    caps = origin.capabilities
    if not (caps.hard_links or caps.link_copies):
        with pytest.raises(NotSupported):
            origin.link("a", "b")
        return
    origin.mkdir("d")
    src = case.tmp / "src"
    src.write_bytes(b"version 1")
    a = origin.put("d/a", str(src), None, mode=0o640, mtime_ns=1_500_000_000_000_000_000)
    b = origin.link("d/a", "b")
    assert b.name == "b" and b.kind is Kind.FILE
    assert (b.size, b.mode, b.uid, b.gid) == (a.size, 0o640, a.uid, a.gid)
    if case.mtimes:
        assert b.mtime_ns == 1_500_000_000_000_000_000
    assert case.read_all("b") == b"version 1"
    assert names(origin) == {"d": Kind.DIR, "b": Kind.FILE}
    # the new name exists: EEXIST, whatever it is, and it is left alone
    case.put_bytes("c", b"other")
    for taken in ("c", "d", "b"):
        with pytest.raises(Exists):
            origin.link("d/a", taken)
    assert case.read_all("c") == b"other"
    with pytest.raises(NotFound):
        origin.link("missing", "x")
    with pytest.raises(NotFound):
        origin.link("d/a", "nodir/x")
    with pytest.raises(OriginError) as ei:
        origin.link("d", "d2")  # no links to directories
    assert ei.value.errno in (errno.EPERM, errno.EISDIR)
    assert "d2" not in names(origin)
    src.write_bytes(b"version 2, longer")
    origin.put("d/a", str(src))
    # a put writes a new file at its name (atomically): the names part, on every origin
    # (link copies: they were independent files already)
    assert case.read_all("b") == b"version 1"
    assert origin.stat("b").nlink == origin.stat("d/a").nlink == 1
    origin.delete("d/a")
    assert case.read_all("b") == b"version 1"


def test_link_race_has_exactly_one_winner(case: Case, origin: Origin) -> None:
    """What delta-rs does to commit a table version: every writer links its own temporary
    file to the same final name; exactly one succeeds, the others get EEXIST."""
    caps = origin.capabilities
    if not (caps.hard_links or caps.link_copies):
        pytest.skip("no link on this origin")
    writers = 8
    for i in range(writers):
        case.put_bytes(f"tmp-{i}", f"commit by writer {i}".encode())
    barrier = threading.Barrier(writers)

    def attempt(i: int) -> int | None:
        barrier.wait()
        try:
            origin.link(f"tmp-{i}", "00000001.json")
        except Exists:
            return None
        return i

    with ThreadPoolExecutor(writers) as pool:
        won = [i for i in pool.map(attempt, range(writers)) if i is not None]
    assert len(won) == 1
    assert case.read_all("00000001.json") == f"commit by writer {won[0]}".encode()


def test_mknod(case: Case, origin: Origin) -> None:
    if not origin.capabilities.special_files:
        for kind in (Kind.FIFO, Kind.SOCKET):
            with pytest.raises(NotSupported) as ei:
                origin.mknod("n", kind, 0o644)
            assert ei.value.errno == errno.EOPNOTSUPP
        assert "n" not in names(origin)
        return
    e = origin.mknod("fifo", Kind.FIFO, 0o640)
    assert e.kind is Kind.FIFO and e.mode == 0o640
    assert origin.stat("fifo").kind is Kind.FIFO
    assert names(origin) == {"fifo": Kind.FIFO}
    with pytest.raises(Exists):
        origin.mknod("fifo", Kind.FIFO, 0o640)
