"""What the REST API costs (issue 24): a real ``airfs catalog serve`` on a directory origin
under /tmp, driven with databricks-sdk as an admin token: catalog calls per second (list
volumes), small files PUT over the Files API per second, and a large file's upload (the SDK's
multipart flow above its 50 MiB threshold) and download throughput.

    python scripts/bench/api_files.py [--mib 128] [--calls 200]

Prints one line per figure; short by design (the machine is shared)."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import requests
from databricks.sdk import WorkspaceClient


def airfs(origin: str, *argv: str) -> str:
    cmd = [sys.executable, "-m", "airfs.cli", "catalog", "--origin", origin, *argv]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="airfs-api-bench-", dir="/tmp")
    origin = os.path.join(base, "origin")
    os.mkdir(origin)
    airfs(origin, "init", "--admin", "ops")
    for cmd, name in (
        ("create-catalog", "main"),
        ("create-schema", "main.raw"),
        ("create-volume", "main.raw.v"),
    ):
        airfs(origin, cmd, name)
    tok = json.loads(airfs(origin, "--json", "token", "create", "--principal", "ops"))["token"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "airfs.cli",
            "catalog",
            "--origin",
            origin,
            "serve",
            "--listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        m = re.search(r"listening on (\S+)", proc.stdout.readline())
        assert m, "the server did not start"
        url = m.group(1)
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {tok}"
        t0 = time.perf_counter()
        for _ in range(args.calls):
            s.get(f"{url}/api/2.1/unity-catalog/volumes?catalog_name=main&schema_name=raw")
        dt = time.perf_counter() - t0
        each = dt / args.calls * 1e3
        print(f"catalog list volumes: {args.calls / dt:.0f} calls/s ({each:.2f} ms each)")
        t0 = time.perf_counter()
        for i in range(args.calls):
            s.put(f"{url}/api/2.0/fs/files/Volumes/main/raw/v/small/{i}", data=b"x" * 4096)
        dt = time.perf_counter() - t0
        print(f"Files API PUT 4 KiB: {args.calls / dt:.0f} files/s")
        w = WorkspaceClient(host=url, token=tok)
        data = os.urandom(args.mib << 20)
        t0 = time.perf_counter()
        w.files.upload("/Volumes/main/raw/v/big.bin", io.BytesIO(data), overwrite=True)
        up = time.perf_counter() - t0
        t0 = time.perf_counter()
        stream = w.files.download("/Volumes/main/raw/v/big.bin").contents
        chunks = []  # in 8 MiB reads: one read() of everything is slow in the SDK itself
        while chunk := stream.read(8 << 20):
            chunks.append(chunk)
        got = b"".join(chunks)
        down = time.perf_counter() - t0
        assert got == data
        print(
            f"SDK upload {args.mib} MiB (multipart): {args.mib / up:.0f} MiB/s; "
            f"download: {args.mib / down:.0f} MiB/s"
        )
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
