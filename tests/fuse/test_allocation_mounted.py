"""What the mount reports about space and time through the kernel: ``st_blocks`` (``du``) is
the allocation of the bytes' real home (the staging file, the POSIX origin's file; the size
on S3, where nothing else is known), and a directory's time on S3 stays the same across
remounts."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount

GiB = 1 << 30


def _du_kib(p: Path) -> int:
    out = subprocess.run(["du", "-k", str(p)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def _sparse(p: Path) -> None:
    """A 1 GiB file with 4 KiB of data at its start and the rest a hole."""
    with open(p, "wb") as f:
        f.write(b"x" * 4096)
        f.truncate(GiB)


def test_sparse_file_blocks_staged_and_committed(volume: Volume) -> None:
    """A 1 GiB hole takes no space, staged and committed: ``du`` and ``st_blocks`` tell the
    allocation of the staging file, then of the origin's file (not size/512)."""
    if volume.spec.kind != "posix":
        pytest.skip("allocation is known on a POSIX origin only (S3: size-based)")
    p = volume.root / "sparse.bin"
    _sparse(p)
    st = os.stat(p)
    assert st.st_size == GiB
    assert st.st_blocks * 512 < 1 << 20, st.st_blocks  # staged: the staging file's blocks
    assert _du_kib(p) < 1024
    volume.m.flush(p)
    assert volume.spec.dir is not None
    origin_blocks = os.stat(volume.spec.dir / "sparse.bin").st_blocks
    assert origin_blocks * 512 < 1 << 20  # the commit kept the hole
    volume.remount()
    st = os.stat(volume.root / "sparse.bin")
    assert (st.st_size, st.st_blocks) == (GiB, origin_blocks)
    assert _du_kib(volume.root / "sparse.bin") < 1024


def test_origin_file_blocks_are_the_origins(volume: Volume) -> None:
    """A file the origin holds (never staged here) reports the origin's ``st_blocks``: a
    sparse one its holes, a dense one its blocks."""
    if volume.spec.kind != "posix":
        pytest.skip("allocation is known on a POSIX origin only (S3: size-based)")
    assert volume.spec.dir is not None
    _sparse(volume.spec.dir / "o-sparse.bin")
    (volume.spec.dir / "o-dense.bin").write_bytes(os.urandom(100_000))
    for name in ("o-sparse.bin", "o-dense.bin"):
        want = os.stat(volume.spec.dir / name)
        got = os.stat(volume.root / name)
        assert (got.st_size, got.st_blocks) == (want.st_size, want.st_blocks), name
    assert _du_kib(volume.root / "o-sparse.bin") < 1024


def test_s3_blocks_follow_the_size(volume: Volume) -> None:
    """On S3 the object's size is the only truth: ``st_blocks`` is the size in 512-byte
    blocks, rounded up (a committed file and a listed one alike)."""
    if volume.spec.kind != "s3":
        pytest.skip("S3 only")
    p = volume.root / "f.bin"
    p.write_bytes(b"y" * 1000)
    volume.remount()
    assert os.stat(volume.root / "f.bin").st_blocks == 2


def _dir_times(root: Path) -> dict[str, int]:
    return {
        str(d.relative_to(root)): d.stat().st_mtime_ns
        for d in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]
    }


def test_s3_directory_times_survive_a_remount(volume: Volume, tmp_path: Path) -> None:
    """A directory's time on S3 is its marker's, or (a directory only implied by keys) the
    first object's under it: the same after a remount, so ``rsync -a`` from the mount a
    second time changes nothing (it re-set every directory's time when the time was the
    mount's start)."""
    if volume.spec.kind != "s3":
        pytest.skip("S3 only (a POSIX origin has real directory times)")
    (volume.root / "made" / "sub").mkdir(parents=True)
    (volume.root / "made" / "sub" / "f").write_bytes(b"1")
    src = tmp_path / "data"
    src.write_bytes(b"data")
    for key in ("implied/a/x.bin", "implied/b.bin"):  # no markers: other tools' uploads
        volume.spec.view.put(key, str(src))
    volume.remount()
    first = _dir_times(volume.root)
    assert set(first) >= {".", "made", "made/sub", "implied", "implied/a"}
    dst = tmp_path / "copy"
    subprocess.run(["rsync", "-a", f"{volume.root}/", f"{dst}/"], check=True)
    time.sleep(1.1)  # a time taken from the clock at mount would differ by a second or more
    volume.remount()
    assert _dir_times(volume.root) == first
    out = subprocess.run(
        ["rsync", "-a", "--itemize-changes", f"{volume.root}/", f"{dst}/"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "", out.stdout
