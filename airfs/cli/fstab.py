"""``mount.fuse.airfs``: the helper mount(8) runs for ``mount -t fuse.airfs`` and for
``/etc/fstab`` lines of type ``fuse.airfs``::

    mount -t fuse.airfs ORIGIN MOUNTPOINT -o cache_dir=/local/airfs,ttl=1
    # /etc/fstab
    s3://bucket/vols  /Volumes  fuse.airfs  cache_dir=/local/airfs,_netdev,nofail  0 0

ORIGIN is a directory, ``s3://BUCKET[/PREFIX]``, or the mountpoint itself (overlay in place).
``-o`` options are ``airfs mount`` options with underscores (``cache_dir=``, ``cache_size=``,
``staging_size=``, ``staging_min_free=``, ``ttl=``, ``log_file=``, ``s3_endpoint=``,
``s3_region=``, ``s3_timeout=``,
``s3_path_style``, ``allow_other``, ``no_allow_other``, ``drain_timeout=``,
``commit_delay=``, ``fuse=``,
``debug``, ``immutable``); generic mount options (``rw``, ``defaults``, ``noauto``,
``nofail``, ``_netdev``, ``x-systemd.*``...) are accepted and ignored. Install it with
``mount/install.sh``.
"""

from __future__ import annotations

import sys

from . import app as cli

_VALUED = {
    "cache_dir",
    "cache_size",
    "staging_size",
    "staging_min_free",
    "ttl",
    "log_file",
    "s3_endpoint",
    "s3_region",
    "s3_timeout",
    "drain_timeout",
    "commit_delay",
    "fuse",
}
_FLAGS = {"s3_path_style", "allow_other", "no_allow_other", "debug", "rebuild_cache", "immutable"}
_IGNORED = {
    "rw",
    "ro",
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "nofail",
    "_netdev",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "relatime",
    "async",
    "sync",
    "default_permissions",
}


def to_cli_args(origin: str, mountpoint: str, options: str) -> list[str]:
    """Translate a mount(8) call into ``airfs mount`` arguments. Raises ``ValueError`` for an
    unknown option."""
    args = ["mount"]
    if origin not in ("", "none", "airfs") and origin != mountpoint:
        args += ["--origin", origin]
    for opt in filter(None, (o.strip() for o in options.split(","))):
        key, eq, value = opt.partition("=")
        if key in _IGNORED or key.startswith(("x-", "comment=")):
            continue
        if key in _VALUED and eq:
            args += ["--" + key.replace("_", "-"), value]
        elif key in _FLAGS and not eq:
            args.append("--" + key.replace("_", "-"))
        else:
            raise ValueError(f"unknown or malformed option {opt!r}")
    return [*args, "--quiet", mountpoint]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    positional: list[str] = []
    options: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "-o":
            options.append(next(it, ""))
        elif a.startswith("-o") and len(a) > 2:
            options.append(a[2:])
        elif a in ("-n", "-s", "-f", "-v", "-r", "-w"):
            continue  # mount(8)'s own flags: nothing to do for a FUSE helper
        else:
            positional.append(a)
    if len(positional) != 2:
        print("usage: mount.fuse.airfs ORIGIN MOUNTPOINT [-o OPTIONS]", file=sys.stderr)
        return 2
    try:
        args = to_cli_args(positional[0], positional[1], ",".join(options))
    except ValueError as exc:
        print(f"mount.fuse.airfs: {exc}", file=sys.stderr)
        return 1
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
