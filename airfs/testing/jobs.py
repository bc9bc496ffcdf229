"""Jobs that run in a mount while its daemon is replaced (``--restartable`` tests and the
hand-over benchmark): real processes, each reporting what it saw as one JSON line on stdout.

``python -m airfs.testing.jobs reader MOUNTDIR FILE [CHUNK] [PAUSE]``: with its working
directory in ``MOUNTDIR``, maps ``FILE`` (relative), reads it again in ``CHUNK``-byte
requests with ``PAUSE`` seconds between them (each read's latency kept), and at the end
prints the SHA-256 of what it read, of the mapping, the names ``.`` lists (through the
working directory), the read latencies and the first error (None: none).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import sys
import time


def reader(mountdir: str, name: str, chunk: int, pause: float) -> dict[str, object]:
    os.chdir(mountdir)
    out: dict[str, object] = {"error": None}
    lat: list[float] = []
    try:
        with open(name, "rb") as mf:
            mapped = mmap.mmap(mf.fileno(), 0, prot=mmap.PROT_READ)
        h = hashlib.sha256()
        with open(name, "rb", buffering=0) as f:
            while True:
                t0 = time.perf_counter()
                b = f.read(chunk)
                lat.append(time.perf_counter() - t0)
                if not b:
                    break
                h.update(b)
                time.sleep(pause)
        out["read"] = h.hexdigest()
        out["mmap"] = hashlib.sha256(mapped[:]).hexdigest()
        mapped.close()
        out["listed"] = sorted(os.listdir("."))
    except OSError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["latencies"] = lat
    return out


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "reader":
        chunk = int(argv[3]) if len(argv) > 3 else 1 << 20
        pause = float(argv[4]) if len(argv) > 4 else 0.01
        print(json.dumps(reader(argv[1], argv[2], chunk, pause)), flush=True)
        return 0
    print("usage: python -m airfs.testing.jobs reader MOUNTDIR FILE [CHUNK] [PAUSE]")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
