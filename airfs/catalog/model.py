"""The governance model: catalogs → schemas → volumes, owners and grants, with Unity Catalog's
names and inheritance; and :func:`allowed`, the one pure decision every check goes through.

Objects. A *metastore* document holds catalogs; a catalog holds schemas; a schema holds volumes.
Each object has a name (letters, digits, ``_`` and ``-``; at most 255 characters; case kept),
an owner and grants (principal → privileges). A volume's storage is the origin prefix
``<catalog>/<schema>/<volume>`` of the mount (*managed*), or an origin URL of its own
(*external*: stored and validated, not served yet).

Principals are user names (``alice``) or groups (``group:ml``). A local user or group may be
mapped to another principal name (``aliases``: ``{"alice": "alice@corp.example"}``), which is
then the name grants use. Root on the node is an admin unless ``root_admin`` is off; the
principals in ``admins`` are admins too (Unity Catalog's metastore admins).

Privileges (Unity Catalog's names, written with a space or an underscore, any case):
``USE CATALOG``, ``USE SCHEMA``, ``READ VOLUME``, ``WRITE VOLUME``, ``CREATE VOLUME``,
``CREATE SCHEMA``, ``MANAGE``, ``ALL PRIVILEGES``. A grant on an object applies to everything
below it. ``ALL PRIVILEGES`` stands for every privilege but ``MANAGE``. The owner of an object
has every privilege, ``MANAGE`` included, on it and below it. As in Unity Catalog:

* reading or listing files in a volume needs ``USE CATALOG``, ``USE SCHEMA`` and
  ``READ VOLUME``; creating, changing or removing them needs ``WRITE VOLUME`` as well;
* a catalog without ``USE CATALOG`` (a schema without ``USE SCHEMA``) is neither listed nor
  reachable: ENOENT, so that a name nobody granted you does not even show that it exists;
* without ``READ VOLUME`` a visible volume's content is EACCES, without ``WRITE VOLUME`` every
  change in it is EACCES;
* the three levels are catalog objects: creating, removing or renaming anything there is
  EPERM (for every caller, admins included: use the catalog commands); names there that are
  not in the catalog are shown to admins only;
* the reserved name :data:`RESERVED` at the root is hidden from everyone.
"""

from __future__ import annotations

import copy
import enum
import errno
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: where the catalog lives at the origin root; invisible and unreachable through the mount
RESERVED = ".airfs-catalog"
FORMAT = 1

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,254}$")
_PRINCIPAL = re.compile(r"^(group:)?[^\s:/][^\s/]{0,254}$")


class CatalogError(ValueError):
    """A request the model refuses (bad name, unknown object, not allowed); the message is the
    one line shown to the user; ``errno`` the error a daemon answers with."""

    def __init__(self, message: str, err: int = errno.EINVAL) -> None:
        super().__init__(message)
        self.errno = err


class Privilege(enum.Enum):
    USE_CATALOG = "USE CATALOG"
    USE_SCHEMA = "USE SCHEMA"
    READ_VOLUME = "READ VOLUME"
    WRITE_VOLUME = "WRITE VOLUME"
    CREATE_VOLUME = "CREATE VOLUME"
    CREATE_SCHEMA = "CREATE SCHEMA"
    MANAGE = "MANAGE"
    ALL_PRIVILEGES = "ALL PRIVILEGES"

    def __str__(self) -> str:
        return self.value


P = Privilege
EVERY = frozenset(P)
#: what ``ALL PRIVILEGES`` stands for (not MANAGE, as in Unity Catalog)
ALL = frozenset(set(P) - {P.MANAGE, P.ALL_PRIVILEGES})
#: what may be granted on an object of each level (1 catalog, 2 schema, 3 volume)
GRANTABLE: dict[int, frozenset[Privilege]] = {
    1: frozenset(P),
    2: frozenset(set(P) - {P.USE_CATALOG, P.CREATE_SCHEMA}),
    3: frozenset({P.READ_VOLUME, P.WRITE_VOLUME, P.MANAGE, P.ALL_PRIVILEGES}),
}
LEVELS = {1: "catalog", 2: "schema", 3: "volume"}


def parse_privilege(text: str) -> Privilege:
    """``'READ VOLUME'``, ``READ_VOLUME``, ``read volume`` → :attr:`Privilege.READ_VOLUME`."""
    key = " ".join(text.replace("_", " ").split()).upper()
    for p in Privilege:
        if p.value == key:
            return p
    names = ", ".join(p.value for p in Privilege)
    raise CatalogError(f"unknown privilege {text!r} (one of {names})")


def check_name(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise CatalogError(
            f"bad {what} name {name!r}: letters, digits, '_' and '-' only (not first), "
            "1 to 255 characters"
        )
    return name


def check_principal(text: str) -> str:
    """A user name or ``group:NAME`` (no spaces or slashes)."""
    if not _PRINCIPAL.match(text) or text == "group:":
        raise CatalogError(f"bad principal {text!r}: a user name or group:NAME")
    return text


def check_location(url: str) -> str:
    """An external volume's location: ``s3://BUCKET[/PREFIX]`` or an absolute directory."""
    if url.startswith("s3://"):
        bucket = url[5:].split("/", 1)[0]
        if not re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", bucket):
            raise CatalogError(f"bad location {url!r}: not an s3://BUCKET[/PREFIX] URL")
        return url.rstrip("/")
    path = url.removeprefix("file://")
    if not path.startswith("/") or "\0" in path or "/../" in path + "/":
        raise CatalogError(f"bad location {url!r}: an s3:// URL or an absolute directory")
    return path.rstrip("/") or "/"


@dataclass
class Securable:
    """A catalog, schema or volume: owner, grants (principal → privileges) and children."""

    owner: str
    grants: dict[str, set[Privilege]] = field(default_factory=dict)
    children: dict[str, Securable] = field(default_factory=dict)
    #: volumes only: None for a managed volume, else the external location
    location: str | None = None
    comment: str = ""

    def to_json(self, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "owner": self.owner,
            "grants": {p: sorted(x.value for x in s) for p, s in sorted(self.grants.items()) if s},
        }
        if self.comment:
            out["comment"] = self.comment
        if depth == 3:
            out["location"] = self.location
        else:
            key = "schemas" if depth == 1 else "volumes"
            out[key] = {n: c.to_json(depth + 1) for n, c in sorted(self.children.items())}
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any], depth: int) -> Securable:
        grants = {
            check_principal(p): {parse_privilege(x) for x in privs}
            for p, privs in obj.get("grants", {}).items()
        }
        key = "schemas" if depth == 1 else "volumes"
        children = {}
        if depth < 3:
            for n, c in obj.get(key, {}).items():
                children[check_name(n, LEVELS[depth + 1])] = cls.from_json(c, depth + 1)
        loc = obj.get("location") if depth == 3 else None
        return cls(
            owner=check_principal(obj["owner"]),
            grants=grants,
            children=children,
            location=check_location(loc) if loc else None,
            comment=str(obj.get("comment", "")),
        )


@dataclass
class Metastore:
    """The whole catalog document stored at the origin. ``serial`` counts its changes."""

    catalogs: dict[str, Securable] = field(default_factory=dict)
    admins: set[str] = field(default_factory=set)
    root_admin: bool = True
    aliases: dict[str, str] = field(default_factory=dict)
    serial: int = 0

    def copy(self) -> Metastore:
        return copy.deepcopy(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "serial": self.serial,
            "root_admin": self.root_admin,
            "admins": sorted(self.admins),
            "aliases": dict(sorted(self.aliases.items())),
            "catalogs": {n: c.to_json(1) for n, c in sorted(self.catalogs.items())},
        }

    @classmethod
    def from_json(cls, obj: Any) -> Metastore:
        """Raises :class:`CatalogError` (or KeyError/TypeError) for a damaged document."""
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise CatalogError(f"not an airfs catalog of format {FORMAT}")
        return cls(
            catalogs={
                check_name(n, "catalog"): Securable.from_json(c, 1)
                for n, c in obj.get("catalogs", {}).items()
            },
            admins={check_principal(a) for a in obj.get("admins", [])},
            root_admin=bool(obj.get("root_admin", True)),
            aliases={
                check_principal(k): check_principal(v) for k, v in obj.get("aliases", {}).items()
            },
            serial=int(obj.get("serial", 0)),
        )

    def find(self, names: tuple[str, ...]) -> list[Securable] | None:
        """The objects on the way to ``names`` (catalog first), or None if one is missing."""
        out: list[Securable] = []
        level = self.catalogs
        for n in names:
            obj = level.get(n)
            if obj is None:
                return None
            out.append(obj)
            level = obj.children
        return out


@dataclass(frozen=True, slots=True)
class Who:
    """A caller as the catalog sees it: the principal names it acts as (its user name, its
    groups as ``group:NAME``, after ``aliases``), and whether it is root on this node."""

    principals: frozenset[str]
    is_root: bool = False

    @property
    def name(self) -> str:
        users = sorted(p for p in self.principals if not p.startswith("group:"))
        return users[0] if users else "?"


def who(meta: Metastore | None, user: str, groups: Iterable[str], *, is_root: bool) -> Who:
    """The principals of local ``user`` in ``groups`` (names), mapped by the aliases."""
    aliases = meta.aliases if meta is not None else {}
    names = {user, *(f"group:{g}" for g in groups)}
    return Who(frozenset(aliases.get(n, n) for n in names), is_root)


def is_admin(meta: Metastore, w: Who) -> bool:
    return (w.is_root and meta.root_admin) or bool(w.principals & meta.admins)


def privileges(meta: Metastore, w: Who, names: tuple[str, ...]) -> frozenset[Privilege] | None:
    """What ``w`` holds on the object ``names`` (grants on it and above; ownership of it or
    an object above gives everything; ``ALL PRIVILEGES`` expanded). None: no such object."""
    path = meta.find(names)
    if path is None:
        return None
    if is_admin(meta, w):
        return EVERY
    held: set[Privilege] = set()
    for obj in path:
        if obj.owner in w.principals:
            return EVERY
        for p in w.principals:
            held |= obj.grants.get(p, set())
    if P.ALL_PRIVILEGES in held:
        held |= ALL
    return frozenset(held)


# -- filesystem operations --------------------------------------------------------------------

#: core operations that only look (the rest change something)
READ_OPS = frozenset(
    {"lookup", "getattr", "readdir", "opendir", "open_read", "readlink", "link_from"}
)
#: core operations that change something (unknown operations are treated as these)
WRITE_OPS = frozenset(
    {
        "open_write",
        "create",
        "write",
        "setattr",
        "mkdir",
        "rmdir",
        "unlink",
        "rename_from",
        "rename_to",
        "symlink",
        "link",
        "mknod",
    }
)
#: operations that only need the object to be visible (names and attributes), at the levels
_LOOK = frozenset({"lookup", "getattr", "readlink"})


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer of :func:`allowed`: ``errno`` 0 means allowed; otherwise ``missing`` says
    what was missing (``"USE SCHEMA on schema main.raw"``), ``reason`` says it for a log."""

    errno: int = 0
    missing: str = ""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.errno == 0


OK = Decision()


def split_path(path: str) -> tuple[str, ...]:
    return tuple(path.split("/")) if path else ()


def allowed(meta: Metastore | None, w: Who, op: str, path: str) -> Decision:
    """May ``w`` do core operation ``op`` on mount path ``path`` (relative, ``""`` the root)?

    Pure: no I/O. ``meta`` None means the origin has no catalog: everything is allowed (the
    mode bits still apply) but the reserved name. See the module docstring for the rules."""
    parts = split_path(path)
    if parts and parts[0] == RESERVED:
        return Decision(errno.ENOENT, "", f"{RESERVED} is reserved for the catalog")
    if meta is None:
        return OK
    depth = len(parts)
    changes = op not in READ_OPS
    if changes and depth <= 3:
        what = LEVELS.get(depth, "root")
        return Decision(
            errno.EPERM,
            "",
            f"{op} at the {what} level: catalogs, schemas and volumes are catalog objects "
            "(use airfs catalog create-/drop-...)",
        )
    admin = is_admin(meta, w)
    level = meta.catalogs
    for i, name in enumerate(parts[:3]):
        obj = level.get(name)
        dotted = ".".join(parts[: i + 1])
        if obj is None:
            if admin:
                return OK  # an unregistered name: only admins see it
            return Decision(errno.ENOENT, "", f"{LEVELS[i + 1]} {dotted} is not in the catalog")
        level = obj.children
        if i == 2 or admin:
            continue
        need = P.USE_CATALOG if i == 0 else P.USE_SCHEMA
        held = privileges(meta, w, parts[: i + 1]) or frozenset()
        if need not in held:
            return Decision(errno.ENOENT, f"{need} on {LEVELS[i + 1]} {dotted}", "not visible")
    if depth < 3 or (depth == 3 and op in _LOOK):
        return OK
    vol = parts[:3]
    dotted = ".".join(vol)
    found = meta.find(vol)
    assert found is not None
    if found[-1].location is not None:
        return Decision(
            errno.EACCES,
            "",
            f"volume {dotted} is external ({found[-1].location}): external volumes are not "
            "served by airfs mounts yet",
        )
    held = privileges(meta, w, vol) or frozenset()
    for need in (P.READ_VOLUME, P.WRITE_VOLUME) if changes else (P.READ_VOLUME,):
        if need not in held:
            return Decision(errno.EACCES, f"{need} on volume {dotted}", f"{op} denied")
    return OK


def visible(meta: Metastore | None, w: Who, dir_path: str, name: str) -> bool:
    """Whether ``name`` is listed in ``dir_path`` to ``w`` (a listing already allowed)."""
    if not dir_path and name == RESERVED:
        return False
    if meta is None or len(split_path(dir_path)) >= 3:
        return True
    return allowed(meta, w, "lookup", f"{dir_path}/{name}" if dir_path else name).ok
