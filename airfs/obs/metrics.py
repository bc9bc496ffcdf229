"""Prometheus exposition of the daemon's statistics records (``airfs mount --metrics``).

The daemon already keeps typed statistics per component (the core, the read path and its
block cache, the write-back uploader, the origin's async wrapper, the background prefetcher,
the FUSE transport). :class:`StatsCollector` turns one snapshot of them into Prometheus
metric families at scrape time, so nothing is counted twice and the numbers are those of
``airfs status``. Names start with ``airfs_``; counters end in ``_total``; sizes are bytes,
durations seconds. The two latency histograms (:data:`HISTOGRAMS`) are made from the
bucket counts the core and the origin wrapper keep (:mod:`airfs.obs.histogram`): nothing on the
request path calls prometheus-client. :data:`METRICS` lists every name (the README's table is
made from it).

The endpoint is a small HTTP/1.1 server on the trio loop (:func:`serve`): ``GET /metrics``
renders the snapshot there, so a scrape never reads the components' state from another
thread. It listens on 127.0.0.1 unless an address is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .histogram import LatencyHistogram, bucket_label

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1"


def parse_address(text: str) -> tuple[str, int]:
    """``[ADDR:]PORT`` (``[v6]:PORT`` for IPv6) to (address, port); ValueError with a
    one-line reason otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = DEFAULT_ADDRESS, text
    host = host.strip("[]") or DEFAULT_ADDRESS
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"not [ADDRESS:]PORT: {text!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be 1-65535, got {port}")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"not an IP address: {host!r}") from None
    return host, port


@dataclass(frozen=True)
class Snapshot:
    """One reading of every component's statistics record (None: not present)."""

    core: Any
    readpath: Any
    writeback: Any
    origin: Any
    prefetch: Any
    transport: Mapping[str, Any] | None
    #: the daemon's garbage collector (:class:`airfs.daemon.gcpolicy.GcStats`)
    gc: Any = None


#: (record, field) -> (metric name, kind, help). Kind "counter" or "gauge".
_FIELDS: dict[tuple[str, str], tuple[str, str, str]] = {
    # core
    ("core", "inodes"): ("airfs_core_inodes", "gauge", "inodes known to the core"),
    ("core", "open_files"): ("airfs_core_open_files", "gauge", "open file handles"),
    ("core", "listings"): ("airfs_core_listings", "gauge", "directory listings cached"),
    ("core", "listing_hits"): (
        "airfs_core_listing_hits_total",
        "counter",
        "lookups answered from a cached listing",
    ),
    ("core", "listing_negative_hits"): (
        "airfs_core_listing_negative_hits_total",
        "counter",
        "lookups of absent names answered from a cached listing",
    ),
    ("core", "relists"): ("airfs_core_relists_total", "counter", "listings fetched again"),
    ("core", "ahead_hits"): (
        "airfs_core_ahead_hits_total",
        "counter",
        "lookups answered by stats asked ahead of a directory walk",
    ),
    ("core", "fast_opens"): ("airfs_core_fast_opens_total", "counter", "opens answered inline"),
    ("core", "joined_asks"): (
        "airfs_core_joined_asks_total",
        "counter",
        "names answered by an origin question already in flight for the same name",
    ),
    ("core", "fetched_ahead"): (
        "airfs_core_fetched_ahead_total",
        "counter",
        "files of a directory read in order handed to the background prefetch",
    ),
    # read path / block cache
    ("readpath", "cache_bytes_used"): (
        "airfs_cache_used_bytes",
        "gauge",
        "cached blocks plus space reserved for fetches",
    ),
    ("readpath", "cache_bytes_limit"): ("airfs_cache_limit_bytes", "gauge", "--cache-size"),
    ("readpath", "cache_bytes_limit_now"): (
        "airfs_cache_effective_limit_bytes",
        "gauge",
        "cache limit after the free-disk floor",
    ),
    ("readpath", "disk_free_bytes"): (
        "airfs_cache_disk_free_bytes",
        "gauge",
        "free space of the cache's disk",
    ),
    ("readpath", "cache_objects"): ("airfs_cache_objects", "gauge", "object versions cached"),
    ("readpath", "reads"): ("airfs_cache_reads_total", "counter", "reads served"),
    ("readpath", "hit_bytes"): ("airfs_cache_hit_bytes_total", "counter", "bytes read from cache"),
    ("readpath", "miss_bytes"): (
        "airfs_cache_miss_bytes_total",
        "counter",
        "bytes read that waited for the origin",
    ),
    ("readpath", "origin_bytes_read"): (
        "airfs_cache_origin_read_bytes_total",
        "counter",
        "bytes fetched from the origin",
    ),
    ("readpath", "origin_requests"): (
        "airfs_cache_origin_requests_total",
        "counter",
        "range reads sent to the origin",
    ),
    ("readpath", "evictions"): ("airfs_cache_evictions_total", "counter", "evictions"),
    ("readpath", "evicted_bytes"): (
        "airfs_cache_evicted_bytes_total",
        "counter",
        "bytes evicted",
    ),
    ("readpath", "corrupt_blocks"): (
        "airfs_cache_corrupt_blocks_total",
        "counter",
        "blocks that failed their checksum (refetched)",
    ),
    ("readpath", "uncached_bytes"): (
        "airfs_cache_uncached_bytes_total",
        "counter",
        "bytes fetched but not kept (no room)",
    ),
    ("readpath", "warm_bytes"): ("airfs_cache_warm_bytes_total", "counter", "bytes warmed"),
    ("readpath", "warm_batches"): (
        "airfs_cache_warm_batches_total",
        "counter",
        "worker-thread jobs that fetched a batch of small files of a warm",
    ),
    ("readpath", "adopted_bytes"): (
        "airfs_cache_adopted_bytes_total",
        "counter",
        "committed bytes taken into the cache",
    ),
    ("readpath", "direct_write_bytes"): (
        "airfs_cache_direct_write_bytes_total",
        "counter",
        "bytes written into cache files bypassing the page cache",
    ),
    ("readpath", "kept_bytes"): (
        "airfs_cache_kept_bytes",
        "gauge",
        "stored prefetched bytes kept in memory for their reader",
    ),
    ("readpath", "kept_hit_bytes"): (
        "airfs_cache_kept_hit_bytes_total",
        "counter",
        "bytes served from buffers kept for their reader",
    ),
    ("readpath", "part_buffers_leased"): (
        "airfs_cache_part_buffers_leased_total",
        "counter",
        "fetched parts read into a reused page-aligned buffer",
    ),
    ("readpath", "part_buffers_mapped"): (
        "airfs_cache_part_buffers_mapped_total",
        "counter",
        "page-aligned part buffers mapped (new memory)",
    ),
    ("readpath", "fetched_at_lookup"): (
        "airfs_cache_fetched_at_lookup_total",
        "counter",
        "cold small files read whole by the request that revalidated their name",
    ),
    ("readpath", "prefetch_window_current"): (
        "airfs_prefetch_window_bytes",
        "gauge",
        "largest read-ahead window of the open streams",
    ),
    ("readpath", "prefetch_bytes"): (
        "airfs_prefetch_bytes_total",
        "counter",
        "bytes fetched ahead of reads",
    ),
    ("readpath", "prefetch_hits"): (
        "airfs_prefetch_hits_total",
        "counter",
        "prefetched blocks later read",
    ),
    ("readpath", "prefetch_waits"): (
        "airfs_prefetch_waits_total",
        "counter",
        "reads that waited for a prefetch",
    ),
    ("readpath", "prefetch_resets"): (
        "airfs_prefetch_resets_total",
        "counter",
        "sequential streams broken by jumps",
    ),
    ("readpath", "inflight_bytes"): (
        "airfs_cache_inflight_bytes",
        "gauge",
        "bytes of fetches in flight",
    ),
    ("readpath", "readers_open"): ("airfs_cache_readers_open", "gauge", "open read streams"),
    # write-back
    ("writeback", "pending_files"): (
        "airfs_writeback_pending_files",
        "gauge",
        "closed files not yet committed",
    ),
    ("writeback", "pending_bytes"): (
        "airfs_writeback_pending_bytes",
        "gauge",
        "bytes not yet committed",
    ),
    ("writeback", "oldest_pending_s"): (
        "airfs_writeback_oldest_pending_seconds",
        "gauge",
        "age of the oldest pending file",
    ),
    ("writeback", "uploading"): ("airfs_writeback_uploading", "gauge", "commits in progress"),
    ("writeback", "staging_bytes"): (
        "airfs_writeback_staging_bytes",
        "gauge",
        "space used by staged files",
    ),
    ("writeback", "staging_limit"): (
        "airfs_writeback_staging_limit_bytes",
        "gauge",
        "--staging-size",
    ),
    ("writeback", "committed_files"): (
        "airfs_writeback_committed_files_total",
        "counter",
        "files committed to the origin",
    ),
    ("writeback", "committed_bytes"): (
        "airfs_writeback_committed_bytes_total",
        "counter",
        "bytes committed to the origin",
    ),
    ("writeback", "already_committed"): (
        "airfs_writeback_already_committed_total",
        "counter",
        "commits found already at the origin",
    ),
    ("writeback", "cancelled_uploads"): (
        "airfs_writeback_cancelled_uploads_total",
        "counter",
        "uploads stopped by a rename or unlink of their file",
    ),
    ("writeback", "errors"): ("airfs_writeback_errors_total", "counter", "failed commit attempts"),
    # background prefetch (the torch dataset's hints)
    ("prefetch", "submitted"): (
        "airfs_background_prefetch_submitted_total",
        "counter",
        "paths submitted",
    ),
    ("prefetch", "dropped"): (
        "airfs_background_prefetch_dropped_total",
        "counter",
        "paths dropped (queue full)",
    ),
    ("prefetch", "warmed"): ("airfs_background_prefetch_warmed_total", "counter", "paths warmed"),
    ("prefetch", "failed"): ("airfs_background_prefetch_failed_total", "counter", "paths failed"),
}

#: the labelled families: (record, field) -> (name, kind, help, label)
_BY_LABEL: dict[tuple[str, str], tuple[str, str, str, str]] = {
    ("core", "ops"): ("airfs_core_ops_total", "counter", "filesystem requests by operation", "op"),
    ("origin", "calls"): (
        "airfs_origin_requests_total",
        "counter",
        "origin calls by operation",
        "op",
    ),
    ("origin", "retries"): (
        "airfs_origin_retries_total",
        "counter",
        "origin calls retried, by operation",
        "op",
    ),
    ("origin", "errors"): (
        "airfs_origin_errors_total",
        "counter",
        "origin calls failed, by operation",
        "op",
    ),
    ("origin", "seconds"): (
        "airfs_origin_seconds_total",
        "counter",
        "time spent in origin calls, by operation",
        "op",
    ),
}

#: the latency histograms: (record, field) -> (name, help); label ``op``
_HISTOGRAMS: dict[tuple[str, str], tuple[str, str]] = {
    ("core", "latency"): (
        "airfs_fuse_op_seconds",
        "filesystem requests by core operation (both transports): time from the call to its "
        "reply or error",
    ),
    ("origin", "latency"): (
        "airfs_origin_op_seconds",
        "origin requests by operation, one observation per attempt",
    ),
}

#: the histogram families (each exports ``_bucket``, ``_sum`` and ``_count`` samples)
HISTOGRAMS: tuple[str, ...] = tuple(v[0] for v in _HISTOGRAMS.values())

#: the transport's counters (``airfs_fuse_<key>_total``)
_TRANSPORT = {
    "requests": "requests read from /dev/fuse",
    "inline": "requests answered without a task",
    "tasks": "requests that waited in a task",
    "interrupts": "interrupted requests given up (their caller was being killed)",
    "interrupts_ignored": "interrupted requests answered normally (a signal the caller handles)",
    "errors": "requests answered with an error",
    "passthrough_opens": "opens served by kernel passthrough",
    "dropped_behind_bytes": "page cache given back behind sequential readers (bytes)",
    "thread_replies": "replies of file data written by the reply thread, not the loop",
}

#: the garbage collector's counters, labelled ``generation`` (0 young, 2 full)
_GC = {
    "collections": (
        "airfs_gc_collections_total",
        "collections of the daemon's cyclic garbage collector",
    ),
    "seconds": ("airfs_gc_seconds_total", "time the daemon's cyclic garbage collector ran"),
}

#: every metric name (without the ``_created`` samples prometheus-client does not add here)
METRICS: tuple[str, ...] = (
    *(v[0] for v in _FIELDS.values()),
    *(v[0] for v in _BY_LABEL.values()),
    *HISTOGRAMS,
    "airfs_origin_in_flight",
    "airfs_origin_down",
    *(f"airfs_fuse_{k}_total" for k in _TRANSPORT),
    *(v[0] for v in _GC.values()),
)


def _family(
    name: str, kind: str, doc: str, labels: list[str] | None = None
) -> CounterMetricFamily | GaugeMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


def histogram_family(
    name: str, doc: str, hists: Mapping[str, LatencyHistogram]
) -> HistogramMetricFamily:
    """One Prometheus histogram family, labelled ``op``, from the frozen records: cumulative
    ``_bucket`` samples per bound ending at ``+Inf`` (== ``_count``), and ``_sum``."""
    fam = HistogramMetricFamily(name, doc, labels=["op"])
    for op, h in sorted(hists.items()):
        buckets = [(bucket_label(bound), float(n)) for bound, n in h.cumulative()]
        fam.add_metric([op], buckets, h.sum)
    return fam


class StatsCollector(Collector):
    """A prometheus-client collector over ``snapshot()`` (called once per scrape)."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        records = {f.name: getattr(snap, f.name) for f in dataclasses.fields(snap)}
        for (rec, field_name), (name, kind, doc) in _FIELDS.items():
            value = getattr(records[rec], field_name, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                fam = _family(name, kind, doc)
                fam.add_metric([], value)
                yield fam
        for (rec, field_name), (name, kind, doc, label) in _BY_LABEL.items():
            values = getattr(records[rec], field_name, None)
            if values is None:
                continue
            fam = _family(name, kind, doc, [label])
            for key, value in sorted(values.items()):
                fam.add_metric([key], value)
            yield fam
        for (rec, field_name), (name, doc) in _HISTOGRAMS.items():
            hists = getattr(records[rec], field_name, None)
            if hists is not None:
                yield histogram_family(name, doc, hists)
        if snap.origin is not None:
            fam = GaugeMetricFamily("airfs_origin_in_flight", "origin calls in flight")
            fam.add_metric([], snap.origin.in_flight)
            yield fam
            fam = GaugeMetricFamily("airfs_origin_down", "1 while the origin counts as down")
            fam.add_metric([], 1 if snap.origin.down else 0)
            yield fam
        for key, doc in _TRANSPORT.items():
            value = (snap.transport or {}).get(key)
            if isinstance(value, int):
                counter = CounterMetricFamily(f"airfs_fuse_{key}", doc)
                counter.add_metric([], value)
                yield counter
        if snap.gc is not None:
            for field_name, (name, doc) in _GC.items():
                counter = CounterMetricFamily(
                    name.removesuffix("_total"), doc, labels=["generation"]
                )
                for gen, value in enumerate(getattr(snap.gc, field_name)):
                    counter.add_metric([str(gen)], value)
                yield counter


def registry(snapshot: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry holding only the daemon's statistics (no process/platform collectors)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StatsCollector(snapshot))
    return reg


async def open_listener(address: str, port: int) -> trio.SocketListener:
    """Bind the metrics socket (before the mount, so a port in use fails the mount with a
    clear ``OSError``)."""
    listeners = await trio.open_tcp_listeners(port, host=address)
    return listeners[0]


async def serve(listener: trio.SocketListener, render: Callable[[], bytes]) -> None:
    """Answer ``GET /metrics`` with ``render()`` (Prometheus text format) until cancelled;
    any other path is 404, any other method 405. One request per connection."""

    async def handler(stream: trio.SocketStream) -> None:
        await _handle(stream, render)

    await trio.serve_listeners(handler, [listener])


async def _handle(stream: trio.abc.Stream, render: Callable[[], bytes]) -> None:
    async with stream:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            with trio.move_on_after(10):
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 8192:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    head += chunk
                method, _, rest = head.partition(b" ")
                target = rest.partition(b" ")[0].partition(b"?")[0]
                if method != b"GET":
                    await _reply(stream, 405, b"text/plain", b"only GET\n")
                elif target != b"/metrics":
                    await _reply(stream, 404, b"text/plain", b"see /metrics\n")
                else:
                    await _reply(stream, 200, CONTENT_TYPE_LATEST.encode(), render())


async def _reply(stream: trio.abc.Stream, code: int, ctype: bytes, body: bytes) -> None:
    reason = {200: b"OK", 404: b"Not Found", 405: b"Method Not Allowed"}[code]
    head = (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % (code, reason, ctype, len(body))
    )
    await stream.send_all(head + body)


def render_with(reg: CollectorRegistry) -> Callable[[], bytes]:
    """The ``render`` for :func:`serve` over ``reg``."""
    return lambda: generate_latest(reg)
