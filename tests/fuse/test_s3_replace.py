"""S3: a file replaced by ``os.replace`` on this node is read as the old or the new content,
never EIO. When the temporary file was already committed, the rename is a copy at the origin
and the replaced version is gone from the bucket the moment the copy lands; an open of the
replaced name in the moments before the mount took the new name (it waited for the delete
of the source and a HEAD) used the old version's tag and failed with ``changed at the origin
(version ... is gone)``. The emulated latency widens that window so the test finds it every
time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from airfs.testing.mountfix import fuse_available, mount, teardown
from airfs.testing.seaweed import SeaweedServer

pytestmark = [pytest.mark.mount, pytest.mark.s3]

READER = """
import sys
with open(sys.argv[1], "rb") as f:
    sys.stdout.buffer.write(f.read())
"""


def read_elsewhere(path: Path) -> bytes:
    """``path``'s content as another process reads it (its own open and reads)."""
    p = subprocess.run(
        [sys.executable, "-c", READER, str(path)], capture_output=True, timeout=60
    )
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return p.stdout


def test_replaced_file_reads_old_or_new_never_eio(
    tmp_path: Path, seaweed: SeaweedServer
) -> None:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    from airfs.origin.s3 import S3Origin

    url = seaweed.url(f"replace-{uuid.uuid4().hex[:10]}")
    view = S3Origin.from_url(url, env=seaweed.env)  # the bucket itself, not through the mount
    (tmp_path / "mnt").mkdir()
    m = mount(
        url,
        tmp_path / "mnt",
        tmp_path / "cache",
        "--s3-endpoint",
        seaweed.endpoint,
        "--emulate-latency",
        "0.25",
        "--ttl",
        "30",
        env=seaweed.env,
    )
    try:
        root = m.mountpoint
        target = root / "model.bin"
        versions = [os.urandom(300_000 + i) for i in range(4)]
        for gen, data in enumerate(versions):
            tmp = root / f".model.bin.tmp{gen}"
            tmp.write_bytes(data)
            m.flush()  # the temporary file is committed: the rename is a copy at the origin
            if gen == 0:
                os.replace(tmp, target)
                os.stat(target)  # this node knows the name and its version (fresh: TTL 30 s)
                continue
            before = view.stat("model.bin").version
            done = threading.Event()
            failed: list[BaseException] = []

            def replace(
                src: Path = tmp,
                done: threading.Event = done,
                failed: list[BaseException] = failed,
            ) -> None:
                try:
                    os.replace(src, target)
                except BaseException as exc:
                    failed.append(exc)
                finally:
                    done.set()

            t = threading.Thread(target=replace)
            t.start()
            # wait for the copy to land at the origin, while the rename is still going on
            deadline = time.monotonic() + 30
            while view.stat("model.bin").version == before and not done.is_set():
                assert time.monotonic() < deadline, "the rename did not reach the origin"
                time.sleep(0.005)
            got = read_elsewhere(target)  # the other process: old or new, whole
            t.join(60)
            assert not failed, failed
            assert got in (versions[gen - 1], versions[gen]), (gen, len(got))
            assert read_elsewhere(target) == data
        m.flush()
        e = view.stat("model.bin")
        assert view.read_range("model.bin", 0, e.size) == versions[-1]
    finally:
        teardown(m)
        view.close()


def test_reader_open_across_a_replace_keeps_the_old_content(
    tmp_path: Path, seaweed: SeaweedServer
) -> None:
    """A reader that opened the file before it was replaced reads the old content to the end
    (it failed with EIO): the version it reads is gone from the bucket, but its bytes were
    written on this node, and the cache keeps them through the rename (a copy at the origin
    that keeps the version)."""
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    from airfs.origin.s3 import S3Origin

    url = seaweed.url(f"replace-{uuid.uuid4().hex[:10]}")
    view = S3Origin.from_url(url, env=seaweed.env)
    (tmp_path / "mnt").mkdir()
    m = mount(url, tmp_path / "mnt", tmp_path / "cache", "--s3-endpoint", seaweed.endpoint,
              env=seaweed.env)  # fmt: skip
    try:
        root = m.mountpoint
        target = root / "data.bin"
        # larger than what an open with FUSE passthrough fetches whole (8 MiB)
        old, new = os.urandom(10 << 20), os.urandom(10 << 20)
        (root / ".data.tmp0").write_bytes(old)
        m.flush()  # committed first: the rename is a copy at the origin
        os.replace(root / ".data.tmp0", target)
        held = os.open(target, os.O_RDONLY)  # opened before the replace, read after it
        held_version = view.stat("data.bin").version
        (root / ".data.tmp1").write_bytes(new)
        m.flush()
        os.replace(root / ".data.tmp1", target)
        try:
            assert view.stat("data.bin").version != held_version  # the old one is gone
            os.posix_fadvise(held, 0, 0, os.POSIX_FADV_DONTNEED)
            assert os.pread(held, len(old) + 1, 0) == old
        finally:
            os.close(held)
        assert read_elsewhere(target) == new
    finally:
        teardown(m)
        view.close()
