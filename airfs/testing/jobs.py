"""Jobs that run in a mount while its daemon is replaced (``--restartable`` tests and the
hand-over benchmark): real processes, each reporting what it saw as one JSON line on stdout.

``python -m airfs.testing.jobs reader MOUNTDIR FILE [CHUNK] [PAUSE] [direct]``: with its
working directory in ``MOUNTDIR``, maps ``FILE`` (relative), reads it again in
``CHUNK``-byte requests with ``PAUSE`` seconds between them (each read's latency kept;
``direct``: with ``O_DIRECT``, so that every read reaches the daemon), and at the end
prints the SHA-256 of what it read, of the mapping, the names ``.`` lists (through the
working directory), the read latencies and the first error (None: none).

``python -m airfs.testing.jobs writer MOUNTDIR NAME CHUNKS [CHUNK] [PAUSE]``: writes a
checkpoint as ``torch.save`` into a temporary name then a rename do: ``NAME.tmp`` opened
once, ``CHUNKS`` random ``CHUNK``-byte writes ``PAUSE`` seconds apart, ``close``, then
renamed to ``NAME``; prints the SHA-256 of what it wrote, the write latencies and the first
error.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import sys
import time


def _read_direct(fd: int, off: int, buf: mmap.mmap) -> bytes:
    n = os.preadv(fd, [buf], off)
    return buf[:n]


def reader(
    mountdir: str, name: str, chunk: int, pause: float, direct: bool = False
) -> dict[str, object]:
    os.chdir(mountdir)
    out: dict[str, object] = {"error": None}
    lat: list[float] = []
    try:
        with open(name, "rb") as mf:
            mapped = mmap.mmap(mf.fileno(), 0, prot=mmap.PROT_READ)
        h = hashlib.sha256()
        fd = os.open(name, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
        off = 0
        try:
            while True:
                t0 = time.perf_counter()
                b = _read_direct(fd, off, buf)
                lat.append(time.perf_counter() - t0)
                if not b:
                    break
                off += len(b)
                h.update(b)
                time.sleep(pause)
        finally:
            os.close(fd)
        out["read"] = h.hexdigest()
        out["mmap"] = hashlib.sha256(mapped[:]).hexdigest()
        mapped.close()
        out["listed"] = sorted(os.listdir("."))
    except OSError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["latencies"] = lat
    return out


def writer(mountdir: str, name: str, chunks: int, chunk: int, pause: float) -> dict[str, object]:
    os.chdir(mountdir)
    out: dict[str, object] = {"error": None}
    lat: list[float] = []
    h = hashlib.sha256()
    try:
        fd = os.open(f"{name}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for _ in range(chunks):
                data = os.urandom(chunk)
                t0 = time.perf_counter()
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                lat.append(time.perf_counter() - t0)
                h.update(data)
                time.sleep(pause)
        finally:
            os.close(fd)
        os.rename(f"{name}.tmp", name)
        out["wrote"] = h.hexdigest()
    except OSError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["latencies"] = lat
    return out


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "reader":
        chunk = int(argv[3]) if len(argv) > 3 else 1 << 20
        pause = float(argv[4]) if len(argv) > 4 else 0.01
        direct = len(argv) > 5 and argv[5] == "direct"
        print(json.dumps(reader(argv[1], argv[2], chunk, pause, direct)), flush=True)
        return 0
    if len(argv) >= 4 and argv[0] == "writer":
        chunk = int(argv[4]) if len(argv) > 4 else 1 << 20
        pause = float(argv[5]) if len(argv) > 5 else 0.01
        print(json.dumps(writer(argv[1], argv[2], int(argv[3]), chunk, pause)), flush=True)
        return 0
    print(
        "usage: python -m airfs.testing.jobs reader MOUNTDIR FILE [CHUNK] [PAUSE] [direct]\n"
        "       python -m airfs.testing.jobs writer MOUNTDIR NAME CHUNKS [CHUNK] [PAUSE]"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
