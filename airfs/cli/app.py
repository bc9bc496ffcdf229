"""``airfs``: mount, restart, umount, status, warm, flush, catalog (:mod:`airfs.catalog.cli`), csi
(:mod:`airfs.csi.cli`).

This module is the parser and the dispatch (the console script ``airfs.cli:main``); the commands
live beside it: :mod:`airfs.cli.mount` (``mount``, ``restart``), :mod:`airfs.cli.control`
(``umount``, ``status``, ``warm``, ``flush``), :mod:`airfs.cli.status` (the status text) and
:mod:`airfs.cli.options` (value types and one-line usage errors).

Exit codes: 0 success; 1 failure (a one-line reason on stderr); 2 bad usage; 3 unmounted with
writes still pending (they stay in the journal and commit at the next mount); 4 unmounted after
writes were lost to a conflict (named, with where their bytes are kept).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from airfs.catalog.cli import register as register_catalog
from airfs.csi.cli import register as register_csi
from airfs.fuse import DEFAULT_TRANSPORT, TRANSPORTS

from .control import cmd_flush as cmd_flush
from .control import cmd_refresh as cmd_refresh
from .control import cmd_status as cmd_status
from .control import cmd_umount as cmd_umount
from .control import cmd_warm as cmd_warm
from .mount import cmd_mount as cmd_mount
from .mount import cmd_restart as cmd_restart
from .options import Parser, octal_mode
from .options import fail as fail
from .options import join_negative_values as join_negative_values
from .options import metrics_address as metrics_address
from .options import parse_size as parse_size
from .options import positive_int as positive_int
from .options import positive_seconds as positive_seconds
from .options import positive_size as positive_size
from .options import seconds as seconds


def build_parser() -> argparse.ArgumentParser:
    """The ``airfs`` parser: every subcommand with its options; each sets ``func``, the
    command to run with the parsed arguments."""
    p = Parser(
        prog="airfs",
        description="Mount shared storage (a directory or an S3-compatible bucket) as a fast, "
        "cached local filesystem for ML training.",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    m = sub.add_parser(
        "mount",
        help="mount an origin on MOUNTPOINT",
        description="Mount ORIGIN on MOUNTPOINT. Returns once the mount is ready; the daemon "
        "runs detached and logs to a file (printed). Without --origin, MOUNTPOINT is overlaid "
        "in place: what is in it stays visible and becomes the origin.",
    )
    m.add_argument("mountpoint", metavar="MOUNTPOINT")
    m.add_argument(
        "--origin",
        metavar="DIR|s3://BUCKET[/PREFIX]",
        help="the storage to serve (default: MOUNTPOINT itself, overlaid in place)",
    )
    m.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="local cache and staging directory (default /var/cache/airfs/<id> as "
        "root, ~/.cache/airfs/<id> otherwise)",
    )
    m.add_argument(
        "--cache-size",
        type=positive_size,
        default=parse_size("50G"),
        metavar="SIZE",
        help="block cache limit (default 50G)",
    )
    m.add_argument(
        "--staging-size",
        type=positive_size,
        default=parse_size("100G"),
        metavar="SIZE",
        help="limit on written data not yet committed; writers wait, then get ENOSPC "
        "(default 100G)",
    )
    m.add_argument(
        "--staging-min-free",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="free space written data leaves on the cache filesystem; writers wait, then "
        "get ENOSPC (default 3%% of it, at most 512M; 0: none)",
    )
    m.add_argument(
        "--ttl",
        type=seconds,
        default=1.0,
        metavar="SECONDS",
        help="attribute/entry cache time; changes at the origin are seen within it (default "
        "1; the kernel keeps names longer in directories the daemon checks once per TTL)",
    )
    m.add_argument(
        "--immutable",
        action="store_true",
        help="the origin's files never change: names and versions are trusted until "
        "`airfs refresh PATH` or the next mount (writes through the mount still work); for "
        "one governed volume: airfs catalog update VOLUME NAME --immutable true",
    )
    m.add_argument(
        "--foreground", "-f", action="store_true", help="stay attached and log to stderr"
    )
    m.add_argument("--log-file", metavar="FILE", help="daemon log (default CACHE_DIR/airfs.log)")
    m.add_argument(
        "--allow-other",
        dest="allow_other",
        action="store_true",
        default=None,
        help="let other users access the mount (default: on as root, else only if "
        "/etc/fuse.conf has user_allow_other)",
    )
    m.add_argument("--no-allow-other", dest="allow_other", action="store_false")
    m.add_argument(
        "--s3-endpoint", metavar="URL", help="S3 endpoint (default $AWS_ENDPOINT_URL, else AWS)"
    )
    m.add_argument("--s3-region", metavar="REGION", help="S3 region (default from AWS config)")
    m.add_argument(
        "--s3-path-style",
        action="store_true",
        default=None,
        help="path-style S3 addressing (most self-hosted stores need it)",
    )
    m.add_argument(
        "--s3-default-mode",
        type=octal_mode,
        default=None,
        metavar="OCTAL",
        help="mode of S3 objects that carry none (written by other tools; default 644)",
    )
    m.add_argument(
        "--s3-timeout",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="S3 stall deadline: a request with no byte of answer for this long (first byte, "
        "then between reads; connect: at most 5 s) fails and the origin counts as down at "
        "once; slow transfers that keep moving are not cut (default 10; each request also "
        "has an overall limit of 300 s)",
    )
    m.add_argument(
        "--s3-trust-listings",
        dest="s3_list_heads",
        action="store_false",
        help="list objects not seen yet with the default mode instead of a HEAD each "
        "(faster first listings; only where no private files are written)",
    )
    m.add_argument(
        "--drain-timeout",
        type=seconds,
        default=3600.0,
        metavar="SECONDS",
        help="how long unmount waits for pending commits (default 3600)",
    )
    m.add_argument(
        "--write-wait",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long a writer waits for staging space before ENOSPC (default 30)",
    )
    m.add_argument(
        "--commit-delay",
        type=seconds,
        default=0.5,
        metavar="SECONDS",
        help="how long after a file's close its commit starts (default 0.5; fsync and "
        "'airfs flush' commit at once): a file renamed or deleted meanwhile (the temporary "
        "file of an atomic write, a scratch file) is renamed or dropped locally, never "
        "uploaded under its first name",
    )
    m.add_argument(
        "--allow-devices",
        action="store_true",
        help="let mknod create device nodes (POSIX origins; they cannot be opened through "
        "the mount, which is nodev)",
    )
    m.add_argument("--no-cache", action="store_true", help="read through to the origin, no cache")
    m.add_argument(
        "--fuse",
        choices=TRANSPORTS,
        default=DEFAULT_TRANSPORT,
        help=f"FUSE transport: airfs's own kernel-protocol loop, or libfuse through pyfuse3 "
        f"(default {DEFAULT_TRANSPORT})",
    )
    m.add_argument(
        "--no-passthrough",
        action="store_true",
        help="kernel transport: serve every read and write through the daemon, never by FUSE "
        "passthrough of local (cached or staged) files",
    )
    m.add_argument(
        "--no-drop-behind",
        action="store_true",
        help="kernel transport: keep the kernel's page cache of a file read through the "
        "daemon (by default, with passthrough, the pages a sequential reader passed are "
        "dropped 64 MiB behind it: the cache file holds them, and the file's next open is "
        "passed through to it)",
    )
    m.add_argument(
        "--rebuild-journal",
        action="store_true",
        help="rebuild a lost or damaged write-back journal from the staging files' own "
        "records (what the refusal to start says to run)",
    )
    m.add_argument(
        "--rebuild-cache",
        action="store_true",
        help="if the block cache's index is damaged, move it aside (CACHE_DIR/blocks/"
        "index.damaged-TIME) and start with an empty block cache; pending writes are kept",
    )
    m.add_argument(
        "--emulate-latency",
        type=seconds,
        default=0.0,
        metavar="SECONDS",
        help="testing/benchmarks: add this latency to every origin request",
    )
    m.add_argument(
        "--emulate-bandwidth",
        type=positive_size,
        default=None,
        metavar="SIZE",
        help="testing/benchmarks: cap origin transfer at SIZE bytes/s (e.g. 100M)",
    )
    m.add_argument(
        "--emulate-request-size",
        type=positive_size,
        default=None,
        metavar="SIZE",
        help="testing/benchmarks: a read pays --emulate-latency once per SIZE bytes, one "
        "request after the other, as an NFS client with rsize=SIZE does (e.g. 128K)",
    )
    m.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the mount to be ready (default 60)",
    )
    m.add_argument(
        "--metrics",
        type=metrics_address,
        default=None,
        metavar="[ADDR:]PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (default off; ADDR "
        "defaults to 127.0.0.1)",
    )
    m.add_argument(
        "--restartable",
        action="store_true",
        help="kernel transport: a holder process keeps the FUSE connection, so that the "
        "daemon can be replaced without unmounting: after a crash (taken over at once: open "
        "files, mappings and working directories keep working) and by 'airfs restart' "
        "(upgrade in place); reads are then never passed through",
    )
    m.add_argument("--debug", action="store_true", help="verbose daemon log")
    m.add_argument("--quiet", "-q", action="store_true")
    m.set_defaults(func=cmd_mount)

    r = sub.add_parser(
        "restart",
        help="replace a --restartable mount's daemon without unmounting",
        description="Start a new daemon (the code installed now) that takes the mount's "
        "FUSE connection over from the running one: the old daemon stops reading requests, "
        "answers those it is serving and exits; the new one rebuilds the kernel's node ids "
        "and file handles and serves the requests that waited meanwhile. Files open for "
        "reading or writing, working directories and mappings of running programs keep "
        "working (a file being written goes on, and its close commits it whole). Prints the "
        "hand-over time. "
        "Needs a mount made with --restartable.",
    )
    r.add_argument("mountpoint", metavar="MOUNTPOINT")
    r.add_argument("--timeout", type=positive_seconds, default=300.0, metavar="SECONDS")
    r.add_argument("--quiet", "-q", action="store_true")
    r.set_defaults(func=cmd_restart)

    u = sub.add_parser(
        "umount",
        help="drain pending writes, then unmount",
        description="Commit every pending write to the origin (with progress), then unmount "
        "and stop the daemon. Exit 3 if writes could not be committed (they stay in the "
        "journal for the next mount); exit 4 if writes were lost to a conflict with another "
        "version at the origin (each named, with where its bytes are kept).",
    )
    u.add_argument("mountpoint", metavar="MOUNTPOINT")
    u.add_argument(
        "--force",
        action="store_true",
        help="unmount even if the daemon does not answer (pending writes stay in the journal)",
    )
    u.add_argument("--timeout", type=positive_seconds, default=7200.0, metavar="SECONDS")
    u.add_argument("--quiet", "-q", action="store_true")
    u.set_defaults(func=cmd_umount)

    s = sub.add_parser(
        "status",
        help="show a mount's state",
        description="Origin, cache, operation counts, pending commits, errors.",
    )
    s.add_argument("mountpoint", metavar="MOUNTPOINT")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    w = sub.add_parser(
        "warm",
        help="prefetch files into the cache",
        description="Fetch whole files (directories recursively) into the mount's cache with "
        "many concurrent fetches; shows progress and a summary.",
    )
    w.add_argument("paths", nargs="+", metavar="PATH")
    w.add_argument(
        "-j", "--jobs", type=positive_int, default=128, help="concurrent fetches (default 128)"
    )
    w.add_argument("--quiet", "-q", action="store_true")
    w.set_defaults(func=cmd_warm)

    f = sub.add_parser(
        "flush",
        help="wait until writes are at the origin",
        description="Return once every write under PATH made before the call is committed "
        "at the origin. Exit 1 naming the files that cannot be committed.",
    )
    f.add_argument("path", metavar="PATH")
    f.add_argument("--timeout", type=positive_seconds, default=None, metavar="SECONDS")
    f.add_argument("--quiet", "-q", action="store_true")
    f.set_defaults(func=cmd_flush)
    r = sub.add_parser(
        "refresh",
        help="forget what the mount knows of PATH's names and versions",
        description="Make the mount ask the origin again about PATH and everything under it "
        "(its listings, names and versions), at the next use: with --immutable, how a change "
        "made at the origin is seen; otherwise within the TTL anyway.",
    )
    r.add_argument("path", metavar="PATH")
    r.set_defaults(func=cmd_refresh)
    register_catalog(sub)
    register_csi(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command; returns its exit code
    (usage errors exit 2 from the parser)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(join_negative_values(argv))
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (``airfs status MNT | head``): no traceback, and none from the
        # interpreter flushing stdout at exit either
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
