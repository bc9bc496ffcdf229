"""``airfs catalog --origin URL serve`` and ``airfs catalog --origin URL token ...``: the REST
API server and its bearer tokens (registered on ``airfs catalog`` by
:func:`airfs.catalog.cli.register`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import time
from types import FrameType
from typing import Any

from airfs.catalog.model import CatalogError
from airfs.origin.base import OriginError

log = logging.getLogger(__name__)


def _fail(msg: str, code: int = 1) -> int:
    print(f"airfs catalog: {msg}", file=sys.stderr)
    return code


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ADDR:PORT (PORT 0: any free one)")
    return host.strip("[]") or "127.0.0.1", int(port)


def _size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in units else ""
    try:
        value = int(float(t[: len(t) - len(unit)]) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a size such as 512M or 5G") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be positive")
    return value


def _origin(args: argparse.Namespace) -> Any:
    if not args.origin:
        raise CatalogError(f"{args.catalog_cmd} needs --origin DIR|s3://BUCKET[/PREFIX]")
    from airfs.catalog.cli import open_origin

    try:
        return open_origin(args)
    except OriginError as exc:
        raise CatalogError(f"origin {args.origin}: {exc.strerror or exc}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    host, port = args.listen
    if bool(args.tls_cert) != bool(args.tls_key):
        return _fail("give --tls-cert and --tls-key together", 2)
    try:
        origin = _origin(args)
    except CatalogError as exc:
        return _fail(str(exc))
    import tempfile  # here: every airfs command builds this parser, and few serve

    stage = args.stage_dir or tempfile.mkdtemp(prefix="airfs-api-")
    try:
        return _serve(args, origin, stage, host, port)
    finally:
        origin.close()
        if not args.stage_dir:
            shutil.rmtree(stage, ignore_errors=True)


def _serve(args: argparse.Namespace, origin: Any, stage: str, host: str, port: int) -> int:
    from .context import Api, Limits
    from .errors import ApiError
    from .server import make_server, tls_context
    from .tokens import TokenStore

    try:
        api = Api(origin, stage_dir=stage, limits=Limits(max_file=args.max_file_size))
        api.meta()
        tls = tls_context(args.tls_cert, args.tls_key) if args.tls_cert else None
        server = make_server(
            api,
            TokenStore(origin),
            host,
            port,
            tls=tls,
            allow_insecure_remote=args.allow_insecure_remote,
        )
    except ApiError as exc:  # no catalog at the origin
        return _fail(f"{origin.url}: {exc.message}")
    except (CatalogError, OSError) as exc:  # origin errors are OSErrors too
        return _fail(str(exc))

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"airfs catalog serve: listening on {server.url} (origin {origin.url})", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.uploads.close()
        log.info("stopped")
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from .tokens import TokenStore

    if os.geteuid() != 0:
        return _fail("only root manages API tokens (they are kept at the origin)")
    try:
        origin = _origin(args)
    except CatalogError as exc:
        return _fail(str(exc))
    try:
        store = TokenStore(origin)
        if args.token_cmd == "create":
            text, tok = store.create(args.principal, args.group or [], args.comment or "")
            out: Any = {**tok.public(), "token": text}
        elif args.token_cmd == "list":
            out = [t.public() for t in store.list()]
        else:
            out = store.revoke(args.id).public()
    except (CatalogError, OriginError) as exc:
        return _fail(str(exc))
    finally:
        origin.close()
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True))
    elif args.token_cmd == "create":
        print(out["token"])
        print(
            f"(token {out['id']} for {out['principal']}; shown once, kept hashed)", file=sys.stderr
        )
    elif args.token_cmd == "list":
        for t in out:
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(t["created_at"] / 1000))
            groups = ",".join(t["groups"]) or "-"
            print(f"{t['id']}  {t['principal']}  groups {groups}  created {when}  {t['comment']}")
    else:
        print(f"revoked {out['id']} ({out['principal']})")
    return 0


def register(cs: Any) -> None:
    """Add ``serve`` and ``token`` to the ``airfs catalog`` subcommands ``cs``."""
    p = cs.add_parser(
        "serve",
        help="serve the catalog's REST API and the Files API",
        description="Serve Unity Catalog's REST API (/api/2.1/unity-catalog/: catalogs, schemas, "
        "volumes, permissions) and the Files API (/api/2.0/fs/) for the catalog at --origin, "
        "the one every node mounts. Callers authenticate with bearer tokens (airfs catalog "
        "token create) and get the privileges of the token's principal. Without TLS it listens "
        "on loopback only. Stops on SIGTERM or Ctrl-C.",
    )
    p.add_argument(
        "--listen",
        type=_listen,
        default=("127.0.0.1", 8080),
        metavar="ADDR:PORT",
        help="address and port (default 127.0.0.1:8080; port 0: any free one, printed at start)",
    )
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate chain")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument(
        "--allow-insecure-remote",
        action="store_true",
        help="listen on a non-loopback address without TLS (tokens in the clear)",
    )
    p.add_argument(
        "--stage-dir",
        metavar="DIR",
        help="where uploads are staged before they go to the origin (default: a "
        "temporary directory, removed at exit)",
    )
    p.add_argument(
        "--max-file-size",
        type=_size,
        default=5 << 30,
        metavar="SIZE",
        help="the largest file one upload may write (default 5G)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")
    p.set_defaults(func=cmd_serve)

    t = cs.add_parser(
        "token",
        help="manage the REST API's bearer tokens",
        description="Tokens map to a principal (and its groups) of the catalog; only their "
        "SHA-256 is kept, at the origin next to the catalog. Root only, with --origin.",
    )
    t.set_defaults(func=cmd_token)
    ts = t.add_subparsers(dest="token_cmd", required=True, metavar="COMMAND")
    c = ts.add_parser("create", help="make a token (printed once)")
    c.add_argument("--principal", required=True, help="the catalog principal it acts as")
    c.add_argument(
        "--group",
        action="append",
        metavar="NAME",
        help="a group of the principal (repeatable): grants to group:NAME apply",
    )
    c.add_argument("--comment", help="what the token is for")
    ts.add_parser("list", help="the tokens (never their secret)")
    r = ts.add_parser("revoke", help="remove a token: it stops working at once")
    r.add_argument("id", metavar="ID", help="its id, as token list shows")
