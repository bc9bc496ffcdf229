"""POSIX semantics through a real mount, on both origins (directory and S3)."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import multiprocessing
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_seed_first_example(volume: Volume) -> None:
    """The seed's first sample: os.makedirs + open(..., "w"), then ls -l / mkdir -p / touch."""
    dir_path = volume.root / "main" / "default" / "my_volume" / "sub-dir"
    file_path = dir_path / "test_file"
    os.makedirs(dir_path, exist_ok=True)
    with open(file_path, "w") as f:
        f.write("Hello, World!")
    assert file_path.read_text() == "Hello, World!"
    vol = volume.root / "main" / "default" / "my_volume"
    out = subprocess.run(["ls", "-l", str(vol)], capture_output=True, text=True, check=True)
    assert "sub-dir" in out.stdout
    subprocess.run(["mkdir", "-p", str(vol / "sub-dir" / "a" / "b")], check=True)
    subprocess.run(["touch", str(vol / "sub-dir" / "test_file2")], check=True)
    assert (vol / "sub-dir" / "test_file2").stat().st_size == 0
    assert volume.m.umount().returncode == 0
    assert volume.origin_bytes("main/default/my_volume/sub-dir/test_file") == b"Hello, World!"
    assert volume.spec.view.stat("main/default/my_volume/sub-dir/a/b").kind.value == "dir"
    assert volume.spec.view.stat("main/default/my_volume/sub-dir/test_file2").size == 0


def _make_tree(root: Path) -> dict[str, str]:
    sums = {}
    for i in range(4):
        d = root / f"dir {i}" / "sub-é"
        d.mkdir(parents=True)
        for j in range(6):
            data = os.urandom(1000 * (i * 7 + j) + j)
            p = d / f"file {j}.bin"
            p.write_bytes(data)
            sums[str(p.relative_to(root))] = hashlib.sha256(data).hexdigest()
    (root / "empty dir").mkdir()
    return sums


def test_cp_r_tree_and_checksums(volume: Volume, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    sums = _make_tree(src)
    subprocess.run(["cp", "-r", str(src), str(volume.root / "tree")], check=True)
    for rel, digest in sums.items():
        assert sha(volume.root / "tree" / rel) == digest
    back = tmp_path / "back"
    subprocess.run(["cp", "-r", str(volume.root / "tree"), str(back)], check=True)
    for rel, digest in sums.items():
        assert sha(back / rel) == digest
    assert (back / "empty dir").is_dir()
    assert volume.m.umount().returncode == 0
    for rel, digest in sums.items():
        assert hashlib.sha256(volume.origin_bytes(f"tree/{rel}")).hexdigest() == digest


def test_errors_have_the_right_errno(volume: Volume) -> None:
    r = volume.root
    (r / "d").mkdir()
    (r / "d" / "f").write_text("x")
    (r / "file").write_text("y")
    cases = [
        (lambda: os.stat(r / "missing"), errno.ENOENT),
        (lambda: os.mkdir(r / "d"), errno.EEXIST),
        (lambda: os.open(r / "file", os.O_CREAT | os.O_EXCL | os.O_WRONLY), errno.EEXIST),
        (lambda: os.rmdir(r / "d"), errno.ENOTEMPTY),
        (lambda: os.open(r / "d", os.O_WRONLY), errno.EISDIR),
        (lambda: os.listdir(r / "file"), errno.ENOTDIR),
        (lambda: os.stat(r / "file" / "x"), errno.ENOTDIR),
        (lambda: os.open(r / ("n" * 256), os.O_CREAT | os.O_WRONLY), errno.ENAMETOOLONG),
        (lambda: os.unlink(r / "missing"), errno.ENOENT),
        (lambda: os.rmdir(r / "file"), errno.ENOTDIR),
        (lambda: os.link(r / "d", r / "hard"), errno.EPERM),
        (lambda: os.link(r / "file", r / "d"), errno.EEXIST),
        (lambda: os.mknod(r / "dev", stat.S_IFCHR | 0o600, os.makedev(1, 3)), errno.EPERM),
    ]
    if volume.spec.kind == "s3":  # no special files in a bucket
        cases.append((lambda: os.mkfifo(r / "fifo"), errno.EOPNOTSUPP))
    for fn, code in cases:
        with pytest.raises(OSError) as info:
            fn()
        assert info.value.errno == code, (fn, info.value)


def test_permission_denied_for_other_users(volume: Volume) -> None:
    """default_permissions + allow_other: a non-root user gets EACCES on a 0755 root dir."""
    (volume.root / "private").mkdir(mode=0o700)
    (volume.root / "private").chmod(0o700)
    script = (
        "import os, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        f"    os.listdir({str(volume.root / 'private')!r})\n"
        "except PermissionError:\n"
        "    sys.exit(13)\n"
    )
    p = subprocess.run([os.sys.executable, "-c", script], capture_output=True, text=True)
    assert p.returncode == 13, p.stderr


def test_truncate_chmod_utime(volume: Volume) -> None:
    p = volume.root / "t.bin"
    p.write_bytes(b"0123456789")
    os.truncate(p, 4)
    assert p.read_bytes() == b"0123"
    os.truncate(p, 8)
    assert p.read_bytes() == b"0123\0\0\0\0"
    with open(p, "r+b") as f:
        f.truncate(2)
        f.seek(5)
        f.write(b"Z")
    assert p.read_bytes() == b"01\0\0\0Z"
    os.utime(p, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    if volume.spec.kind == "posix":
        os.chmod(p, 0o600)
        assert p.stat().st_mode & 0o777 == 0o600
    assert volume.m.umount().returncode == 0
    assert volume.origin_bytes("t.bin") == b"01\0\0\0Z"


def test_append_and_partial_overwrite(volume: Volume) -> None:
    p = volume.root / "log.txt"
    p.write_text("line1\n")
    volume.m.flush()
    with open(p, "a") as f:
        f.write("line2\n")
    with open(p, "r+") as f:
        f.seek(2)
        f.write("NE")
    assert p.read_text() == "liNE1\nline2\n"
    volume.m.flush()
    assert volume.origin_bytes("log.txt") == b"liNE1\nline2\n"


def _renameat2(src: Path, dst: Path, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, bytes(src), at_fdcwd, bytes(dst), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def test_rename_replace_and_noreplace(volume: Volume) -> None:
    r = volume.root
    (r / "a").write_text("new")
    (r / "b").write_text("old")
    volume.m.flush()
    os.rename(r / "a", r / "b")
    assert (r / "b").read_text() == "new"
    assert not (r / "a").exists()
    (r / "c").write_text("c")
    with pytest.raises(OSError) as info:
        _renameat2(r / "c", r / "b", 1)  # RENAME_NOREPLACE
    assert info.value.errno == errno.EEXIST
    _renameat2(r / "c", r / "d", 1)
    assert (r / "d").read_text() == "c"
    (r / "dir1" / "inner").mkdir(parents=True)
    (r / "dir1" / "inner" / "f").write_text("deep")
    os.rename(r / "dir1", r / "dir2")
    assert (r / "dir2" / "inner" / "f").read_text() == "deep"
    assert sorted(os.listdir(r)) == ["b", "d", "dir2"]
    assert volume.m.umount().returncode == 0
    assert volume.origin_bytes("b") == b"new"
    assert volume.origin_bytes("dir2/inner/f") == b"deep"
    names = {e.name for e in volume.spec.view.list("")}
    assert names == {"b", "d", "dir2"}


def test_write_temp_then_rename_like_torch_save(volume: Volume) -> None:
    """Savers write a temp file and rename it over the target: readers see old or new."""
    target = volume.root / "ckpt.pt"
    for gen in range(5):
        tmp = volume.root / f".ckpt.pt.tmp{gen}"
        payload = bytes([gen]) * (256 << 10)
        tmp.write_bytes(payload)
        os.replace(tmp, target)
        assert target.read_bytes() == payload
    volume.m.flush()
    assert volume.origin_bytes("ckpt.pt") == bytes([4]) * (256 << 10)
    assert sorted(os.listdir(volume.root)) == ["ckpt.pt"]


def test_symlink_and_readlink(volume: Volume) -> None:
    if volume.spec.kind == "s3":
        with pytest.raises(OSError) as info:
            os.symlink("target", volume.root / "link")
        assert info.value.errno == errno.EOPNOTSUPP
        return
    (volume.root / "target").write_text("t")
    os.symlink("target", volume.root / "link")
    assert os.readlink(volume.root / "link") == "target"
    assert (volume.root / "link").read_text() == "t"
    assert volume.spec.dir is not None
    assert os.readlink(volume.spec.dir / "link") == "target"


def test_statfs(volume: Volume) -> None:
    st = os.statvfs(volume.root)
    assert st.f_bsize > 0 and st.f_blocks > 0 and st.f_namemax == 255


def test_names_with_spaces_and_unicode(volume: Volume) -> None:
    names = ["with space.txt", "ünïcødé-文件.bin", "emoji 🚀.dat", "a'b\"c"]
    for n in names:
        (volume.root / n).write_text(n)
    assert sorted(os.listdir(volume.root)) == sorted(names)
    for n in names:
        assert (volume.root / n).read_text() == n
    volume.m.flush()
    assert {e.name for e in volume.spec.view.list("")} == set(names)


def test_sparse_write_past_4gib(volume: Volume) -> None:
    if volume.spec.kind == "s3":
        pytest.skip("would upload 4 GiB of zeros to the test server")
    p = volume.root / "big.bin"
    off = (4 << 30) + 12345
    with open(p, "wb") as f:
        f.seek(off)
        f.write(b"END")
    assert p.stat().st_size == off + 3
    with open(p, "rb") as f:
        f.seek(off - 2)
        assert f.read(5) == b"\0\0END"
        f.seek(1 << 30)
        assert f.read(4) == b"\0\0\0\0"
    volume.m.flush()
    assert volume.spec.view.stat("big.bin").size == off + 3
    assert volume.spec.view.read_range("big.bin", off, 3) == b"END"


def test_directory_with_10000_entries(volume: Volume) -> None:
    if volume.spec.kind == "s3":
        pytest.skip("the S3 listing of many entries is covered by the origin conformance suite")
    assert volume.spec.dir is not None
    d = volume.spec.dir / "many"
    d.mkdir()
    for i in range(10_000):
        (d / f"f{i:05d}").write_bytes(b"")
    time.sleep(1.1)  # entry TTL of the root listing
    names = os.listdir(volume.root / "many")
    assert len(names) == 10_000
    assert sorted(names) == [f"f{i:05d}" for i in range(10_000)]
    out = subprocess.run(["ls", "-l", str(volume.root / "many")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.count("\n") == 10_001


def _reader(path: str, q: multiprocessing.Queue, started: multiprocessing.Event) -> None:
    try:
        with open(path, "rb") as f:
            first = f.read(1 << 20)
            started.set()
            time.sleep(1.0)
            rest = f.read()
        q.put(("ok", first + rest))
    except OSError as exc:
        started.set()
        q.put(("err", exc.errno))


def test_rename_over_while_another_process_reads(volume: Volume) -> None:
    old = os.urandom(4 << 20)
    new = os.urandom(4 << 20)
    target = volume.root / "data.bin"
    target.write_bytes(old)
    volume.m.flush()
    time.sleep(1.1)
    ctx = multiprocessing.get_context("spawn")
    q: multiprocessing.Queue = ctx.Queue()
    started = ctx.Event()
    proc = ctx.Process(target=_reader, args=(str(target), q, started))
    proc.start()
    assert started.wait(30)
    tmp = volume.root / "data.tmp"
    tmp.write_bytes(new)
    os.replace(tmp, target)
    volume.m.flush()
    kind, value = q.get(timeout=60)
    proc.join(30)
    if kind == "ok":
        assert value == old, "a reader of the replaced file saw a mix of versions"
    else:  # S3 without the old object: an error, never a mix
        assert volume.spec.kind == "s3" and value == errno.EIO
    assert target.read_bytes() == new


def _writer(root: str, i: int) -> None:
    data = bytes([i]) * (100_000 + i)
    for k in range(5):
        with open(os.path.join(root, f"w{i}-{k}.bin"), "wb") as f:
            f.write(data)


def test_several_processes_write_different_files(volume: Volume) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(volume.root), i)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert volume.m.umount().returncode == 0
    for i in range(6):
        for k in range(5):
            assert volume.origin_bytes(f"w{i}-{k}.bin") == bytes([i]) * (100_000 + i)


def test_change_at_origin_is_seen_without_refresh(volume: Volume) -> None:
    p = volume.root / "shared.txt"
    p.write_text("v1")
    volume.m.flush()
    assert p.read_text() == "v1"
    src = volume.tmp / "v2"
    src.write_text("version two")
    volume.spec.view.put("shared.txt", str(src))
    deadline = time.monotonic() + 5
    while p.read_text() != "version two":
        assert time.monotonic() < deadline, "origin change not seen within the TTL"
        time.sleep(0.1)
