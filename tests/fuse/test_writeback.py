"""Write-back through a real mount: crash safety, fsync/flush/umount contracts, ENOSPC,
pending-state visibility, atomic commits, and a random-operation model test."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import subprocess
import sys
import threading
import time

import pytest

from airfs.testing.fixtures import Volume
from airfs.testing.mountfix import teardown

pytestmark = pytest.mark.mount


def test_close_then_kill9_then_remount_commits_everything(make_volume) -> None:  # type: ignore[no-untyped-def]
    """Files closed before a crash are committed by the next mount (journal replay)."""
    v: Volume = make_volume("--emulate-latency", "0.2")  # slow origin: commits lag behind
    expected = {}
    for i in range(20):
        data = os.urandom(50_000 + i)
        (v.root / f"f{i}.bin").write_bytes(data)
        expected[f"f{i}.bin"] = data
    (v.root / "sub").mkdir()
    (v.root / "sub" / "x").write_bytes(b"x" * 3_000_000)
    expected["sub/x"] = b"x" * 3_000_000
    assert v.m.status()["writeback"]["pending_files"] > 0, "nothing pending: test is moot"
    v.m.kill9()
    m2 = v.mount()
    try:
        m2.flush()
        for rel, data in expected.items():
            assert v.origin_bytes(rel) == data, rel
        assert (v.root / "sub" / "x").read_bytes() == expected["sub/x"]
    finally:
        teardown(m2)
        v.m = m2


def test_file_open_during_crash_is_kept_aside(make_volume) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume()
    f = open(v.root / "open.bin", "wb")  # noqa: SIM115
    f.write(b"partial" * 1000)
    f.flush()
    pid = v.m.pid
    v.m.kill9()
    with contextlib.suppress(OSError):
        f.close()  # the descriptor died with the mount
    m2 = v.mount()
    try:
        recovered = list((v.tmp / "cache" / "recovered").iterdir())
        assert any(p.read_bytes() == b"partial" * 1000 for p in recovered)
        assert "kept in" in m2.log.read_text()
    finally:
        teardown(m2)
        v.m = m2
    assert pid != m2.pid


def test_fsync_returns_when_at_origin(make_volume) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--emulate-latency", "0.05")
    with open(v.root / "durable.bin", "wb") as f:
        f.write(b"d" * 200_000)
        f.flush()
        os.fsync(f.fileno())
        assert v.origin_bytes("durable.bin") == b"d" * 200_000
        f.write(b"more")
        f.flush()
        os.fsync(f.fileno())
        assert v.origin_bytes("durable.bin") == b"d" * 200_000 + b"more"


def test_flush_waits_for_writes_under_path(make_volume) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--emulate-latency", "0.1")
    (v.root / "a").mkdir()
    (v.root / "b").mkdir()
    for i in range(10):
        (v.root / "a" / f"{i}").write_bytes(bytes([i]) * 10_000)
    p = subprocess.run(
        [sys.executable, "-m", "airfs.cli", "flush", str(v.root / "a")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    for i in range(10):
        assert v.origin_bytes(f"a/{i}") == bytes([i]) * 10_000
    st = v.m.status()["writeback"]
    assert st["pending_files"] == 0


def test_staging_full_gives_enospc_and_keeps_what_fit(make_volume) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume(
        "--staging-size",
        "4M",
        "--emulate-latency",
        "0.05",
        "--emulate-bandwidth",
        "1M",
        "--write-wait",
        "1",
    )
    v.m.expect_errors(r"write: \[Errno 28\] staging area full")
    with pytest.raises(OSError) as info, open(v.root / "huge.bin", "wb") as f:
        for _ in range(64):
            f.write(b"h" * (256 << 10))
            f.flush()
    assert info.value.errno == errno.ENOSPC
    v.m.flush(timeout=120)
    assert v.spec.view.stat("huge.bin").size <= 4 << 20


def test_pending_rename_and_delete_visible_at_once(make_volume) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--emulate-latency", "0.3")
    (v.root / "p.txt").write_text("pending")
    (v.root / "gone.txt").write_text("bye")
    os.rename(v.root / "p.txt", v.root / "q.txt")
    os.unlink(v.root / "gone.txt")
    out = subprocess.run(["ls", str(v.root)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["q.txt"]
    out = subprocess.run(["cat", str(v.root / "q.txt")], capture_output=True, text=True)
    assert out.stdout == "pending"
    v.m.flush()
    assert v.origin_bytes("q.txt") == b"pending"
    names = {e.name for e in v.spec.view.list("")}
    assert names == {"q.txt"}


def test_atomic_writes_are_committed_once_at_their_final_name(make_volume) -> None:  # type: ignore[no-untyped-def]
    """The commit delay: temporary files written, closed and renamed over their target (git,
    pip, JSON writers, checkpoint savers) are renamed locally, never uploaded under their
    temporary names; the target is committed once. (A long delay, so that a slow machine
    cannot start a commit between a close and its rename.) Before it, each rename waited for
    the temporary name's upload and renamed (on S3: copied) it at the origin."""
    v: Volume = make_volume("--commit-delay", "60")
    for i in range(20):
        tmp = v.root / f".state.json.{i}.tmp"
        tmp.write_bytes(f"v{i}".encode())
        os.replace(tmp, v.root / "state.json")
    scratch = v.root / "scratch.bin"
    scratch.write_bytes(b"s" * 100_000)
    scratch.unlink()  # a scratch file deleted soon after its close: never uploaded
    assert (v.root / "state.json").read_bytes() == b"v19"
    assert v.m.status()["writeback"]["committed_files"] == 0
    v.m.flush()  # a barrier does not wait for the delay
    assert v.origin_bytes("state.json") == b"v19"
    assert {e.name for e in v.spec.view.list("")} == {"state.json"}
    assert v.m.status()["writeback"]["committed_files"] == 1


def test_a_closed_file_is_committed_after_the_commit_delay(make_volume) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--commit-delay", "0.3")
    (v.root / "f.txt").write_text("later")
    deadline = time.monotonic() + 30  # a hang guard, not a time bound
    while v.m.status()["writeback"]["committed_files"] < 1:
        assert time.monotonic() < deadline, "never committed without a barrier"
        time.sleep(0.05)
    assert v.origin_bytes("f.txt") == b"later"


def test_a_rename_or_unlink_during_an_upload_stops_it_on_s3(make_volume) -> None:  # type: ignore[no-untyped-def]
    """A checkpoint directory renamed into place, and a scratch file deleted, while their
    files upload (a 4 MiB/s emulated link: an upload of 8 MiB takes 2 s): on S3 the uploads
    stop (``cancelled_uploads``), the files commit once at their new names and the deleted
    one never reaches the origin; on POSIX (no ``cancel_puts``) the operations wait for the
    uploads, with the same result at the origin."""
    v: Volume = make_volume("--commit-delay", "0", "--emulate-bandwidth", "4M")
    data = {n: os.urandom(8 << 20) for n in ("model.bin", "optim.bin")}
    (v.root / "tmp-ckpt").mkdir()
    for n, b in data.items():
        (v.root / "tmp-ckpt" / n).write_bytes(b)
    (v.root / "scratch.bin").write_bytes(os.urandom(8 << 20))
    deadline = time.monotonic() + 30  # a hang guard, not a time bound
    while v.m.status()["writeback"]["uploading"] < 1:
        assert time.monotonic() < deadline, "no upload started"
        time.sleep(0.02)
    os.rename(v.root / "tmp-ckpt", v.root / "ckpt")
    os.unlink(v.root / "scratch.bin")
    v.m.flush()
    for n, b in data.items():
        assert (v.root / "ckpt" / n).read_bytes() == b
        assert v.origin_bytes(f"ckpt/{n}") == b
    names = {e.name for e in v.spec.view.list("")}
    assert "tmp-ckpt" not in names and "scratch.bin" not in names
    assert {e.name for e in v.spec.view.list("ckpt")} == set(data)
    wb = v.m.status()["writeback"]
    assert wb["errors"] == 0
    if v.spec.kind == "s3":
        assert wb["cancelled_uploads"] >= 1
        assert wb["committed_files"] == len(data)  # each once, at its new name
    else:
        assert wb["cancelled_uploads"] == 0


def test_origin_reader_never_sees_a_partial_file(make_volume) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume()
    old = b"A" * (16 << 20)
    new = b"B" * (16 << 20)
    (v.root / "big.bin").write_bytes(old)
    v.m.flush()
    seen: set[bytes] = set()
    stop = threading.Event()
    bad: list[str] = []

    def poll() -> None:
        while not stop.is_set():
            try:
                e = v.spec.view.stat("big.bin")
                data = v.spec.view.read_range("big.bin", 0, e.size, e.version)
            except OSError:
                continue
            kinds = set(data[:: 1 << 16])
            if len(data) != len(old) or len(kinds) != 1:
                bad.append(f"len {len(data)} kinds {kinds}")
            seen.add(bytes(kinds))

    t = threading.Thread(target=poll)
    t.start()
    try:
        (v.root / "big.bin").write_bytes(new)
        v.m.flush()
        time.sleep(0.2)
    finally:
        stop.set()
        t.join()
    assert not bad, bad[:3]
    assert b"B" in seen


def test_umount_drains_pending(make_volume) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--emulate-latency", "0.1")
    for i in range(15):
        (v.root / f"d{i}").write_bytes(b"q" * 20_000)
    p = v.m.umount()
    assert p.returncode == 0, p.stderr
    for i in range(15):
        assert v.origin_bytes(f"d{i}") == b"q" * 20_000


def test_random_operations_match_a_model(volume: Volume) -> None:
    """An fsx-style exerciser: random writes, truncates, renames, reads and deletes through
    the mount, checked against an in-memory model, then against the origin."""
    rng = random.Random(1234)
    model: dict[str, bytearray] = {}
    names = [f"m{i}" for i in range(6)]
    for step in range(400):
        op = rng.choice(["write", "write", "truncate", "rename", "read", "delete", "append"])
        name = rng.choice(names)
        p = volume.root / name
        if op in ("write", "append"):
            data = rng.randbytes(rng.randint(1, 70_000))
            cur = model.setdefault(name, bytearray())
            off = len(cur) if op == "append" else rng.randint(0, len(cur) + 10_000)
            mode = "r+b" if p.exists() else "wb"
            with open(p, mode) as f:
                f.seek(off)
                f.write(data)
            if off > len(cur):
                cur.extend(b"\0" * (off - len(cur)))
            cur[off : off + len(data)] = data
        elif op == "truncate" and name in model:
            size = rng.randint(0, len(model[name]) + 5000)
            os.truncate(p, size)
            cur = model[name]
            del cur[size:]
            cur.extend(b"\0" * (size - len(cur)))
        elif op == "rename" and name in model:
            dst = rng.choice(names)
            os.rename(p, volume.root / dst)
            if dst != name:
                model[dst] = model.pop(name)
        elif op == "delete" and name in model:
            os.unlink(p)
            del model[name]
        elif op == "read" and name in model:
            assert p.read_bytes() == bytes(model[name]), f"step {step}: {name}"
        if step % 50 == 0:
            assert sorted(os.listdir(volume.root)) == sorted(model), f"step {step}"
    for name, data in model.items():
        assert (volume.root / name).read_bytes() == bytes(data)
    assert volume.m.umount().returncode == 0
    assert {e.name for e in volume.spec.view.list("")} == set(model)
    for name, data in model.items():
        assert volume.origin_bytes(name) == bytes(data), name
