"""``airfs catalog [--mount MOUNTPOINT | --origin URL] COMMAND ...``: the argparse wiring.

With ``--mount`` (default ``/Volumes``) the command goes to the mount's daemon through its
control socket and is applied with the caller's identity (its peer credentials); with
``--origin`` it edits the catalog at the origin directly (set-up before the first mount; root
only). Exit codes: 0; 1 refused or failed (one line on stderr); 2 bad usage.
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import sys
from typing import Any

from .commands import TYPES
from .model import CatalogError, Privilege, check_location, parse_privilege, who
from .table import check_format
from .tablecmds import parse_flag

DEFAULT_MOUNT = "/Volumes"
_PRIVS = ", ".join(f"'{p.value}'" for p in Privilege)


def _fail(msg: str, code: int = 1) -> int:
    print(f"airfs catalog: {msg}", file=sys.stderr)
    return code


def _privilege(text: str) -> str:
    try:
        return parse_privilege(text).value
    except CatalogError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _securable(text: str) -> str:
    if text.lower() not in TYPES:
        raise argparse.ArgumentTypeError(f"{text!r}: CATALOG, SCHEMA, VOLUME or TABLE")
    return text.lower()


def _format(text: str) -> str:
    try:
        return check_format(text)
    except CatalogError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _table_location(args: argparse.Namespace) -> str:
    """``--location`` as the origin-relative path the catalog stores: a path on the mount
    (``/Volumes/main/default/raw/sales``), with ``--origin DIR`` a path under DIR, or a path
    relative to the origin root as it is."""
    loc: str = args.location
    if args.origin and not args.origin.startswith("s3://"):
        root = os.path.realpath(args.origin.removeprefix("file://"))
    else:
        root = os.path.realpath(args.mount)
    if args.origin and args.origin.startswith("s3://") and loc.startswith(args.origin):
        return loc[len(args.origin) :].strip("/")
    if not loc.startswith("/"):
        return loc
    full = os.path.realpath(loc) if os.path.exists(loc) else os.path.normpath(loc)
    if full != root and not full.startswith(root.rstrip("/") + "/"):
        where = args.origin or args.mount
        raise CatalogError(
            f"--location {loc}: not under {where} (a path there, or relative to its root)"
        )
    return os.path.relpath(full, root)


def _word(word: str) -> Any:
    def check(text: str) -> str:
        if text.upper() != word:
            raise argparse.ArgumentTypeError(f"expected {word}, got {text!r}")
        return word

    check.__name__ = word
    return check


def _boolean(text: str) -> bool:
    try:
        return bool(parse_flag(text))
    except CatalogError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}") from None


def _location(text: str) -> str:
    try:
        return check_location(text)
    except CatalogError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The command name and its arguments, as the store and the daemon take them."""
    c = args.catalog_cmd
    if c == "init":
        return c, {"admins": args.admin or [], "root_admin": args.root_admin}
    if c in ("grant", "revoke"):
        keys = ("privilege", "type", "name", "principal")
        return c, {k: getattr(args, k) for k in keys}
    if c == "set-owner":
        return c, {"type": args.type, "name": args.name, "principal": args.principal}
    if c == "create-table":
        tab: dict[str, Any] = {"name": args.name, "format": args.format}
        if args.location:
            tab["location"] = _table_location(args)
        for k in ("owner", "comment"):
            if getattr(args, k, None):
                tab[k] = getattr(args, k)
        return c, tab
    if c == "describe":
        return c, {"type": args.type, "name": args.name}
    if c == "update":
        upd: dict[str, Any] = {"type": args.type, "name": args.name}
        if args.comment is not None:
            upd["comment"] = args.comment
        if args.owner:
            upd["owner"] = args.owner
        if args.immutable is not None:
            upd["immutable"] = args.immutable
        return c, upd
    if c == "show-grants" and args.type:
        return c, {
            "type": args.type,
            "name": args.name,
            **({"principal": args.principal} if args.principal else {}),
        }
    if c.startswith("rename-"):
        return c, {"name": args.name, "new_name": args.new_name}
    if c == "map-principal":
        return c, {"local": args.local, "principal": args.principal}
    out: dict[str, Any] = {"name": args.name or ""}
    for k in ("owner", "location", "principal", "comment"):
        if getattr(args, k, None):
            out[k] = getattr(args, k)
    return c, out


def _via_origin(args: argparse.Namespace, command: str, cargs: dict[str, Any]) -> Any:
    if os.geteuid() != 0:
        raise CatalogError(
            "only root edits the catalog at the origin directly; use --mount (the daemon "
            "applies the command with your identity)"
        )
    from airfs.origin.base import OriginError

    from .store import CatalogStore

    try:
        origin = open_origin(args)
    except OriginError as exc:
        raise CatalogError(f"origin {args.origin}: {exc.strerror or exc}") from None
    try:
        store = CatalogStore(origin)
        meta, _ = store.load()
        user = pwd.getpwuid(os.getuid()).pw_name
        groups = [grp.getgrgid(g).gr_name for g in {os.getgid(), *os.getgroups()}]
        return store.run(who(meta, user, groups, is_root=True), command, cargs)
    except OriginError as exc:
        raise CatalogError(f"origin {origin.url}: {exc.strerror or exc}") from None
    finally:
        origin.close()


def open_origin(args: argparse.Namespace) -> Any:
    spec: str = args.origin
    if spec.startswith("s3://"):
        from airfs.origin.s3 import S3Origin

        return S3Origin.from_url(
            spec, endpoint=args.s3_endpoint, region=args.s3_region, path_style=args.s3_path_style
        )
    if "://" in spec and not spec.startswith("file://"):
        raise CatalogError(f"unsupported origin {spec!r} (a directory or s3://bucket/prefix)")
    from airfs.origin.posix import PosixOrigin

    path = spec.removeprefix("file://")
    if not os.path.isdir(path):
        raise CatalogError(f"origin {path} is not a directory")
    return PosixOrigin(path)


def _via_mount(args: argparse.Namespace, command: str, cargs: dict[str, Any]) -> Any:
    from airfs.control import client

    mp = client.find_mount(args.mount)
    if mp is None:
        raise CatalogError(f"{args.mount} is not an airfs mount")
    try:
        return client.request(mp, "catalog", command=command, args=cargs, timeout=120)
    except client.ControlError as exc:
        raise CatalogError(str(exc)) from None
    except TimeoutError as exc:
        raise CatalogError(str(exc)) from None


def _show(command: str, out: Any) -> None:
    if command == "list":
        for item in out:
            loc = f"  {item['location']}" if "location" in item else ""
            print(f"{item['type']:<8} {item['name']}  owner {item['owner']}{loc}")
    elif command == "show-grants":
        for g in out:
            frm = "  (inherited)" if g["inherited_from"] else ""
            print(f"{g['principal']}  {g['privilege']}  on {g['object']}{frm}")
    elif command == "show-tables":
        for t in out:
            kind = t["table_type"].lower()
            print(f"{t['full_name']}  {kind} {t['data_source_format']}  owner {t['owner']}  "
                  f"{t['location']}")  # fmt: skip
    elif command in ("describe", "update", "create-table"):
        for k, v in out.items():
            if k != "created" and v not in (None, "", [], {}):
                print(f"{k:<20} {', '.join(v) if isinstance(v, list) and k == 'privileges' else v}")
    else:
        print(" ".join(f"{k} {v}" for k, v in out.items() if v is not None))


def run(args: argparse.Namespace) -> int:
    try:
        command, cargs = _request(args)
        out = _via_origin(args, command, cargs) if args.origin else _via_mount(args, command, cargs)
    except CatalogError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(exc.strerror or str(exc))
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True))
    else:
        _show(command, out)
    return 0


def register(sub: Any) -> None:
    """Add ``catalog`` to the ``airfs`` subcommands ``sub``."""
    c = sub.add_parser(
        "catalog",
        help="governed volumes: catalogs, schemas, volumes and grants",
        description="Manage the catalog of governed volumes (/Volumes/CATALOG/SCHEMA/VOLUME) "
        "with Unity Catalog's privileges. Through a mount (its daemon applies the command "
        "with your identity) or, as root, directly at an origin before the first mount. "
        "Exit 0; 1 refused or failed (one line); 2 bad usage.",
    )
    where = c.add_mutually_exclusive_group()
    where.add_argument(
        "--mount",
        default=DEFAULT_MOUNT,
        metavar="MOUNTPOINT",
        help=f"an airfs mount (default {DEFAULT_MOUNT})",
    )
    where.add_argument(
        "--origin", metavar="DIR|s3://BUCKET[/PREFIX]", help="edit the origin's catalog directly"
    )
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--s3-endpoint", metavar="URL", help="with --origin s3://...: the endpoint")
    c.add_argument("--s3-region", metavar="REGION")
    c.add_argument("--s3-path-style", action="store_true", default=None)
    c.set_defaults(func=run)
    cs = c.add_subparsers(dest="catalog_cmd", required=True, metavar="COMMAND")

    p = cs.add_parser(
        "init",
        help="create the catalog at the origin",
        description="Create an empty catalog: from now on the mount is governed. Root only.",
    )
    p.add_argument(
        "--admin", action="append", metavar="PRINCIPAL", help="a catalog admin (repeatable)"
    )
    p.add_argument(
        "--no-root-admin",
        dest="root_admin",
        action="store_false",
        help="root on the nodes is not an admin (default: it is)",
    )

    for depth, kind, form in ((1, "catalog", "NAME"), (2, "schema", "CAT.SCH"),
                              (3, "volume", "CAT.SCH.VOL")):  # fmt: skip
        p = cs.add_parser(
            f"create-{kind}", help=f"create a {kind}", description=f"Create {kind} {form}; "
            "you become its owner."
        )  # fmt: skip
        p.add_argument("name", metavar=form)
        p.add_argument("--owner", metavar="PRINCIPAL", help="owner (default: you)")
        if depth == 1:
            p.add_argument("--comment", default="")
        if depth == 3:
            p.add_argument(
                "--location",
                type=_location,
                metavar="URL",
                help="external volume: s3://BUCKET/PREFIX or a directory (stored; not "
                "served by mounts yet). Default: the origin prefix CAT/SCH/VOL",
            )
        p = cs.add_parser(
            f"drop-{kind}",
            help=f"drop an empty {kind}" if depth < 3 else "drop a volume",
            description=f"Remove {kind} {form} from the catalog (needs MANAGE or ownership)."
            + (" A managed volume's files move aside at the origin, to "
               ".airfs-catalog/dropped/CAT.SCH.VOL@SERIAL (no mount shows them; an admin "
               "restores or deletes them there): a volume created again with the name starts "
               "empty." if depth == 3 else
               " It must be empty."),
        )  # fmt: skip
        p.add_argument("name", metavar=form)
        p = cs.add_parser(
            f"rename-{kind}",
            help=f"rename a {kind}",
            description=f"Rename {kind} {form} to NEW_NAME (same parent); its directory at "
            "the origin moves too. Needs MANAGE or ownership"
            + (", and CREATE SCHEMA on the catalog." if depth == 2 else
               ", and CREATE VOLUME on the schema." if depth == 3 else "; admins only."),
        )  # fmt: skip
        p.add_argument("name", metavar=form)
        p.add_argument("new_name", metavar="NEW_NAME")

    p = cs.add_parser(
        "create-table",
        help="register a table",
        description="Register table CAT.SCH.TABLE; you become its owner. Needs USE CATALOG, "
        "USE SCHEMA and CREATE TABLE on the schema. With --location an EXTERNAL table over "
        "the files there (a path inside a volume: you need READ VOLUME and WRITE VOLUME on "
        "it; a path outside every catalog: admins only); without it a MANAGED table whose "
        "files airfs keeps at CAT/SCH/.table-TABLE (hidden from all without SELECT or "
        "MODIFY on the table).",
    )
    p.add_argument("name", metavar="CAT.SCH.TABLE")
    p.add_argument(
        "--location",
        metavar="PATH",
        help="external table: a path on the mount (/Volumes/CAT/SCH/VOL/...), under the "
        "--origin directory, or relative to the origin root",
    )
    p.add_argument(
        "--format", type=_format, default="DELTA", metavar="delta|parquet",
        help="the files' format (default delta)",
    )  # fmt: skip
    p.add_argument("--comment", default="")
    p.add_argument("--owner", metavar="PRINCIPAL", help="owner (default: you)")
    p = cs.add_parser(
        "drop-table",
        help="drop a table",
        description="Remove table CAT.SCH.TABLE from the catalog (needs MANAGE or ownership). "
        "A managed table's files move aside at the origin, to "
        ".airfs-catalog/dropped/CAT.SCH.TABLE@SERIAL; an external table's files stay.",
    )
    p.add_argument("name", metavar="CAT.SCH.TABLE")
    p = cs.add_parser(
        "show-tables",
        help="list the tables of a schema",
        description="The tables of CAT.SCH (needs USE CATALOG and USE SCHEMA).",
    )
    p.add_argument("name", metavar="CAT.SCH")
    p = cs.add_parser(
        "describe",
        help="show an object's details",
        description="Owner, comment, times, location, format and your privileges on it.",
    )
    p.add_argument("type", type=_securable, metavar="CATALOG|SCHEMA|VOLUME|TABLE")
    p.add_argument("name", metavar="NAME")
    p = cs.add_parser(
        "update",
        help="change an object's comment or owner, or a volume's immutable property",
        description="Needs MANAGE or ownership.",
    )
    p.add_argument("type", type=_securable, metavar="CATALOG|SCHEMA|VOLUME|TABLE")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--comment", help="the new comment ('' clears it)")
    p.add_argument("--owner", metavar="PRINCIPAL", help="the new owner")
    p.add_argument(
        "--immutable", type=_boolean, metavar="true|false",
        help="a volume only: true declares that its files never change at the origin (every "
        "mount then trusts the names and versions it knows of them until `airfs refresh PATH` "
        "or a remount, seen by each node within its TTL; writes through a mount still work); "
        "false ends it",
    )  # fmt: skip

    p = cs.add_parser(
        "list", help="list catalogs, schemas, volumes and tables", description="What you may see."
    )
    p.add_argument("name", nargs="?", metavar="CAT[.SCH]")

    for verb, prep in (("grant", "TO"), ("revoke", "FROM")):
        p = cs.add_parser(
            verb,
            help=f"{verb} a privilege",
            description=f"{verb.capitalize()} PRIVILEGE ({_PRIVS}; or with underscores) ON "
            f"CATALOG|SCHEMA|VOLUME|TABLE NAME {prep} PRINCIPAL (a user, or group:NAME). On a "
            "table: SELECT, MODIFY, MANAGE, ALL PRIVILEGES.",
        )
        p.add_argument("privilege", type=_privilege, metavar="PRIVILEGE")
        p.add_argument("on", type=_word("ON"), metavar="ON")
        p.add_argument("type", type=_securable, metavar="CATALOG|SCHEMA|VOLUME|TABLE")
        p.add_argument("name", metavar="NAME")
        p.add_argument("prep", type=_word(prep), metavar=prep)
        p.add_argument("principal", metavar="PRINCIPAL")

    p = cs.add_parser(
        "show-grants",
        help="show the grants on an object",
        description="Grants on NAME and inherited from above (all of them with MANAGE, else "
        "your own).",
    )
    p.add_argument("name", metavar="CAT[.SCH[.VOL]]")
    p.add_argument("--principal", metavar="PRINCIPAL", help="only this principal's")
    p.add_argument(
        "--type", type=_securable, metavar="TABLE", help="TABLE: NAME is a table (CAT.SCH.TABLE)"
    )

    p = cs.add_parser(
        "set-owner", help="change an object's owner", description="Needs MANAGE or ownership."
    )
    p.add_argument("type", type=_securable, metavar="CATALOG|SCHEMA|VOLUME|TABLE")
    p.add_argument("name", metavar="NAME")
    p.add_argument("principal", metavar="PRINCIPAL")

    p = cs.add_parser(
        "map-principal",
        help="map a local user or group to a principal name",
        description="Grants to PRINCIPAL then apply to the local user (or group:NAME) LOCAL; "
        "without PRINCIPAL the mapping is removed. Admins only.",
    )
    p.add_argument("local", metavar="LOCAL")
    p.add_argument("principal", nargs="?", metavar="PRINCIPAL")

    from .api.cli import register as register_api

    register_api(cs)
