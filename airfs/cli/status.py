"""``airfs status`` as text: one line per part of a mount (origin, operations and their
latency, cache, reads, prefetch, pending and committed writes, FUSE transport, catalog), from
the JSON record the daemon's ``status`` returns (:meth:`airfs.daemon.control.Daemon.status`). Pure
formatting: no I/O but ``print``.
"""

from __future__ import annotations

import json
from typing import Any


def human(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 MiB`` (powers of 1024, up to TiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _duration(s: float | None) -> str:
    """A duration for people: µs below 1 ms, ms below 1 s, else s."""
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f}µs"
    if s < 1.0:
        return f"{s * 1e3:.3g}ms"
    return f"{s:.3g}s"


def _latency_line(hists: dict[str, Any], most: int = 6) -> str:
    """``op p50/p99`` for the ``most`` operations with the most calls (status JSON records:
    see :meth:`airfs.obs.histogram.LatencyHistogram.to_dict`)."""
    top = sorted(hists.items(), key=lambda kv: (-int(kv[1].get("count") or 0), kv[0]))[:most]
    return ", ".join(
        f"{op} {_duration(h.get('p50'))}/{_duration(h.get('p99'))}"
        for op, h in top
        if h.get("count")
    )


def print_status(st: dict[str, Any]) -> None:
    """Print a daemon's status record for people (``airfs status`` without ``--json``)."""
    wb, cache = st["writeback"], st["cache"]
    print(f"mountpoint   {st['mountpoint']}")
    print(f"origin       {st['origin']}")
    print(f"cache dir    {st['cache_dir']}")
    print(f"pid          {st['pid']}   uptime {st['uptime_s']} s   ttl {st['ttl']} s")
    ops = st["fs"]["ops"]
    print("operations   " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())) or "-")
    fs_lat = _latency_line(st["fs"].get("latency") or {})
    if fs_lat:
        print(f"latency      {fs_lat} (p50/p99)")
    origin_lat = _latency_line((st.get("origin_calls") or {}).get("latency") or {})
    if origin_lat:
        print(f"origin time  {origin_lat} (p50/p99 per attempt)")
    if "cache_bytes_used" in cache:
        print(
            f"cache        {human(cache['cache_bytes_used'])} of "
            f"{human(cache['cache_bytes_limit'])} in {cache['cache_objects']} objects; "
            f"evictions {cache['evictions']}, corrupt blocks refetched {cache['corrupt_blocks']}"
        )
        print(
            f"reads        hits {human(cache['hit_bytes'])}, misses {human(cache['miss_bytes'])}"
            f", origin {human(cache['origin_bytes_read'])} in {cache['origin_requests']} "
            "requests"
        )
        print(
            f"prefetch     window {human(cache['prefetch_window_current'])} (max "
            f"{human(cache['prefetch_window_max'])}), prefetched "
            f"{human(cache['prefetch_bytes'])}, in flight {human(cache['inflight_bytes'])}"
        )
    else:
        print(f"cache        {json.dumps(cache)}")
    print(
        f"pending      {wb['pending_files']} file(s), {human(wb['pending_bytes'])}, oldest "
        f"{wb['oldest_pending_s']} s; uploading {wb['uploading']}"
    )
    print(
        f"committed    {wb['committed_files']} file(s), {human(wb['committed_bytes'])} at "
        f"{wb['commit_mib_s']} MiB/s; errors {wb['errors']}"
    )
    if wb.get("last_error"):
        print(f"last error   {wb['last_error']}")
    fuse = st.get("fuse") or {}
    if fuse:
        extra = ""
        if fuse.get("protocol"):
            extra = (
                f" {fuse['protocol']}, requests up to {human(fuse['max_write'])}, passthrough "
                f"{'on' if fuse.get('passthrough') else 'off'}; {' '.join(fuse['flags'])}"
            )
        print(f"fuse         {fuse.get('transport')}{extra}")
    gcs = st.get("gc")
    if gcs:
        print(
            f"gc           young threshold {gcs['thresholds'][0]}; collections "
            f"{'/'.join(map(str, gcs['collections']))} (young/middle/full), "
            f"{sum(gcs['seconds']):.2f} s"
        )
    gov = st.get("catalog") or {}
    if gov.get("catalog", {}).get("governed"):
        print(
            f"catalog      governed (serial {gov['catalog']['serial']}); denied "
            f"{gov['denied']} of {gov['checks']} checks"
            + "".join(f", {k} {v}" for k, v in sorted(gov["denied_by_privilege"].items()))
        )
