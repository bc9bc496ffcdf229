"""Walking one big cold S3 directory through a fresh mount: ``find -type f`` (names only),
``ls -l`` (every name's attributes) and ``du -s`` — seconds, and the HEADs the daemon made
(``airfs status``: ``origin_calls.requests.head``, where the tree has that count). N objects
of 1 KiB in one directory (SeaweedFS on loopback), half with a stored mode (written by
airfs), half without (another tool's). One fresh mount and empty cache per command.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench/big_dir_walk.py --files 15000 --rounds 2
    ... --before /tmp/before    # each command also from that checkout, the order alternating
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airfs.testing.mountfix import airfs_cmd, mount, mount_from, teardown

COMMANDS = {
    "find -type f": "find {d} -type f | wc -l",
    "ls -l": "ls -l {d} | wc -l",
    "du -s": "du -s {d}",
}


def one(srv: Any, work: Path, cmd: str, tree: Path | None) -> dict[str, Any]:
    mp, cache = work / "mnt", work / "cache"
    mp.mkdir(exist_ok=True)
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(srv.env)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    m = mount(srv.url("bench"), mp, cache, "--fuse", "kernel", "--s3-endpoint", srv.endpoint,
              "--s3-path-style", env=env)  # fmt: skip
    try:
        t0 = time.perf_counter()
        out = subprocess.run(["bash", "-c", cmd.format(d=mp / "big")], check=True,
                             capture_output=True, text=True).stdout.split()[0]  # fmt: skip
        dt = time.perf_counter() - t0
        st = json.loads(subprocess.run([*airfs_cmd(), "status", "--json", str(mp)],
                                       capture_output=True, check=True).stdout)  # fmt: skip
    finally:
        m.umount()
        teardown(m, check=False)
    return {
        "seconds": round(dt, 2),
        "out": out,
        "heads": st["origin_calls"].get("requests", {}).get("head"),
        "lookups": st["fs"]["ops"].get("lookup", 0),
        "ops": st["fs"]["ops"],
        "p50_ms": {k: round(v["p50"] * 1e3, 2) for k, v in st["fs"]["latency"].items()},
        "ahead_hits": st["fs"].get("ahead_hits"),
        "joined_asks": st["fs"].get("joined_asks"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=15000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", type=Path, help="another checkout, measured alternately")
    ap.add_argument("--only", default=",".join(COMMANDS), help="commands, comma-separated")
    a = ap.parse_args()

    import obstore
    from obstore.store import S3Store

    from airfs.origin.s3 import S3Origin
    from airfs.testing.seaweed import seaweed_server

    work = Path(tempfile.mkdtemp(prefix="airfs-big-dir-")).resolve()
    mount_from(work)
    try:
        with seaweed_server(work / "sw") as srv:
            store = S3Store(srv.bucket, endpoint=srv.endpoint, access_key_id=srv.access_key,
                            secret_access_key=srv.secret_key, region="us-east-1",
                            client_options={"allow_http": True})  # fmt: skip
            writer = S3Origin.from_url(srv.url("bench"), env=srv.env)
            src = work / "src"
            src.write_bytes(b"x" * 1024)

            def put(i: int) -> None:
                if i % 2:
                    obstore.put(store, f"bench/big/f{i:06d}", b"x" * 1024)
                else:
                    writer.put(f"big/f{i:06d}", str(src), None, mode=0o600)

            with ThreadPoolExecutor(32) as ex:
                list(ex.map(put, range(a.files)))
            writer.close()
            trees: list[Path | None] = [None] if a.before is None else [None, a.before.resolve()]
            for r in range(a.rounds):
                for name, cmd in COMMANDS.items():
                    if name not in a.only.split(","):
                        continue
                    for tree in trees if r % 2 == 0 else trees[::-1]:
                        got = one(srv, work, cmd, tree)
                        got["tree"] = "this" if tree is None else "before"
                        print(f"round {r + 1} {name}: {json.dumps(got)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
