"""What keeping modes in S3 metadata costs a listing: a directory of N objects listed by a
client that has not seen them (one HEAD per object, in parallel, for its mode), listed again
(modes remembered), and the bare ListObjectsV2 underneath (what a listing cost before).

    python scripts/bench/s3_list_modes.py [N ...]     # default: 100 1000 5000
"""

from __future__ import annotations

import sys
import tempfile
import time

import obstore

from airfs.origin.s3 import S3Origin
from airfs.testing.seaweed import seaweed_server


def main(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp, seaweed_server(tmp) as srv:
        print("| objects | bare list (s) | first listing with HEADs (s) | listing again (s) |")
        print("| ---: | ---: | ---: | ---: |")
        for n in sizes:
            url = srv.url(f"bench-{n}")
            writer = S3Origin.from_url(url, env=srv.env)
            for i in range(n):  # written by "another tool": no airfs-mode metadata
                obstore.put(writer.client.store, f"d/f{i:06d}", b"x" * 100)
            fresh = S3Origin.from_url(url, env=srv.env)
            t0 = time.perf_counter()
            obstore.list_with_delimiter(fresh.client.store, "d")
            bare = time.perf_counter() - t0
            t0 = time.perf_counter()
            first = fresh.list("d")
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            fresh.list("d")
            warm = time.perf_counter() - t0
            assert len(first) == n
            print(f"| {n} | {bare:.3f} | {cold:.3f} | {warm:.3f} |")
            writer.close()
            fresh.close()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100, 1000, 5000])
