"""The governance model: catalogs → schemas → volumes, owners and grants, with Unity Catalog's
names and inheritance; and :func:`allowed`, the one pure decision every check goes through.

Objects. A *metastore* document holds catalogs; a catalog holds schemas; a schema holds volumes
and tables (:mod:`.table`; one namespace: a table and a volume of a schema never share a name).
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
``CREATE SCHEMA``, ``SELECT``, ``MODIFY``, ``CREATE TABLE``, ``MANAGE``, ``ALL PRIVILEGES``.
A grant on an object applies to everything below it. ``ALL PRIVILEGES`` stands for every
privilege but ``MANAGE``. The owner of an object has every privilege, ``MANAGE`` included,
on it and below it. As in Unity Catalog:

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

Tables (``SELECT`` to read, ``MODIFY`` to change, both held on the table or granted on its
schema or catalog, with ``USE CATALOG`` and ``USE SCHEMA``), where their files are:

* under a table's location, a read is allowed with ``SELECT``, a change *under* it (not of the
  location directory itself) with ``MODIFY`` (which also looks names up, not lists or reads),
  whatever the caller holds on the volume around;
  what the table's grants do not allow, the volume's rules may (path access to an external
  table inside a volume is the union of the two);
* a managed table's directory (``CAT/SCH/.table-NAME``) exists only for holders of
  ``SELECT`` or ``MODIFY`` on it: for everyone else it is ENOENT, and it is not listed;
* a directory on the way to a table's location (inside a volume, or outside every catalog) can
  be looked up (not listed) by holders of ``SELECT`` or ``MODIFY`` on the table: it is how
  their path is reached.
"""

from __future__ import annotations

import copy
import errno
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .names import RESERVED as RESERVED
from .names import CatalogError as CatalogError
from .names import Privilege as Privilege
from .names import check_location as check_location
from .names import check_name as check_name
from .names import check_principal as check_principal
from .names import parse_privilege as parse_privilege
from .table import ABOVE, AT, Table, TableIndex, TableMatch

FORMAT = 1

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
#: what may be granted on a table
GRANTABLE_TABLE = frozenset({P.SELECT, P.MODIFY, P.MANAGE, P.ALL_PRIVILEGES})
LEVELS = {1: "catalog", 2: "schema", 3: "volume"}


@dataclass
class Securable:
    """A catalog, schema or volume: owner, grants (principal → privileges) and children
    (a schema's volumes are its children, its tables are in ``tables``)."""

    owner: str
    grants: dict[str, set[Privilege]] = field(default_factory=dict)
    children: dict[str, Securable] = field(default_factory=dict)
    #: volumes only: None for a managed volume, else the external location
    location: str | None = None
    #: volumes only: its files never change at the origin (set by a holder of MANAGE):
    #: mounts trust the names and versions they know until ``airfs refresh`` or a remount
    immutable: bool = False
    comment: str = ""
    #: schemas only
    tables: dict[str, Table] = field(default_factory=dict)
    #: milliseconds since the epoch (0: made before airfs recorded it)
    created_at: int = 0
    updated_at: int = 0

    def to_json(self, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "owner": self.owner,
            "grants": {p: sorted(x.value for x in s) for p, s in sorted(self.grants.items()) if s},
        }
        if self.comment:
            out["comment"] = self.comment
        if self.created_at:
            out["created_at"] = self.created_at
        if self.updated_at:
            out["updated_at"] = self.updated_at
        if depth == 3:
            out["location"] = self.location
            if self.immutable:
                out["immutable"] = True
        else:
            key = "schemas" if depth == 1 else "volumes"
            out[key] = {n: c.to_json(depth + 1) for n, c in sorted(self.children.items())}
        if depth == 2 and self.tables:
            out["tables"] = {n: t.to_json() for n, t in sorted(self.tables.items())}
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
        tables = {}
        if depth == 2:
            for n, t in obj.get("tables", {}).items():
                tables[check_name(n, "table")] = Table.from_json(t)
        loc = obj.get("location") if depth == 3 else None
        return cls(
            owner=check_principal(obj["owner"]),
            grants=grants,
            children=children,
            location=check_location(loc) if loc else None,
            immutable=depth == 3 and obj.get("immutable", False) is True,
            comment=str(obj.get("comment", "")),
            tables=tables,
            created_at=int(obj.get("created_at", 0)),
            updated_at=int(obj.get("updated_at", 0)),
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

    def table(self, names: tuple[str, ...]) -> Table | None:
        """Table ``(catalog, schema, table)``, or None."""
        found = self.find(names[:2]) if len(names) == 3 else None
        return found[-1].tables.get(names[2]) if found is not None else None

    def tables(self) -> dict[str, tuple[str, str, str]]:
        """Every table: location → names."""
        return {
            t.location: (c, s, n)
            for c, cat in self.catalogs.items()
            for s, sch in cat.children.items()
            for n, t in sch.tables.items()
        }


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


def privileges(
    meta: Metastore, w: Who, names: tuple[str, ...], *, table: bool = False
) -> frozenset[Privilege] | None:
    """What ``w`` holds on the object ``names`` (grants on it and above; ownership of it or
    an object above gives everything; ``ALL PRIVILEGES`` expanded). None: no such object.
    ``table``: ``names`` is a table (else a catalog, schema or volume)."""
    path: list[Securable | Table] | None
    if table:
        t = meta.table(names)
        path = None if t is None else [*(meta.find(names[:2]) or []), t]
    else:
        found = meta.find(names)
        path = list(found) if found is not None else None
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


def table_index(meta: Metastore) -> TableIndex:
    """The tables of ``meta`` by location (for :func:`allowed`; build it once per document)."""
    return TableIndex(meta.tables())


def allowed(
    meta: Metastore | None, w: Who, op: str, path: str, index: TableIndex | None = None
) -> Decision:
    """May ``w`` do core operation ``op`` on mount path ``path`` (relative, ``""`` the root)?

    Pure: no I/O. ``meta`` None means the origin has no catalog: everything is allowed (the
    mode bits still apply) but the reserved name. ``index``: :func:`table_index` of ``meta``
    (built here when not given). See the module docstring for the rules."""
    parts = split_path(path)
    if parts and parts[0] == RESERVED:
        return Decision(errno.ENOENT, "", f"{RESERVED} is reserved for the catalog")
    if meta is None:
        return OK
    base = _by_volume(meta, w, op, parts)
    if base.ok or base.errno == errno.EPERM:
        return base
    match = (index if index is not None else table_index(meta)).match(path)
    if match is None:
        return base
    d, holder = _by_table(meta, w, op, match)
    return d if d.ok or holder else base


def _by_table(meta: Metastore, w: Who, op: str, match: TableMatch) -> tuple[Decision, bool]:
    """The table rule for a path ``match`` found; and whether ``w`` holds ``SELECT`` or
    ``MODIFY`` on (one of) the table(s), with ``USE`` on the levels above (a holder's
    refusal is the table's; anyone else's is the volume's)."""
    holds: list[tuple[tuple[str, str, str], frozenset[Privilege]]] = []
    for names in match.tables:
        use = privileges(meta, w, names[:1]) or frozenset()
        use_s = privileges(meta, w, names[:2]) or frozenset()
        held = privileges(meta, w, names, table=True) or frozenset()
        if P.USE_CATALOG in use and P.USE_SCHEMA in use_s and held & {P.SELECT, P.MODIFY}:
            holds.append((names, held))
    if not holds:
        return Decision(errno.EACCES, "", "no table privilege"), False
    if match.relation == ABOVE:
        if op in _LOOK:
            return OK, True
        # not listed: the volume's (or the levels') answer stands
        return Decision(errno.EACCES, "", f"{op} on a directory above a table's location"), False
    names, held = holds[0]
    dotted = ".".join(names)
    if op in READ_OPS:
        if P.SELECT in held or (op in _LOOK and P.MODIFY in held):  # a writer finds its way
            return OK, True
        return Decision(errno.EACCES, f"SELECT on table {dotted}", f"{op} denied"), True
    if match.relation == AT:
        return Decision(
            errno.EACCES,
            "",
            f"{op} of the location of table {dotted} itself (drop-table removes a table)",
        ), True
    if P.MODIFY in held:
        return OK, True
    return Decision(errno.EACCES, f"MODIFY on table {dotted}", f"{op} denied"), True


def _by_volume(meta: Metastore, w: Who, op: str, parts: tuple[str, ...]) -> Decision:
    """The catalog levels' and the volumes' rules (no table's)."""
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


def visible(
    meta: Metastore | None, w: Who, dir_path: str, name: str, index: TableIndex | None = None
) -> bool:
    """Whether ``name`` is listed in ``dir_path`` to ``w`` (a listing already allowed)."""
    if not dir_path and name == RESERVED:
        return False
    if meta is None or len(split_path(dir_path)) >= 3:
        return True
    return allowed(meta, w, "lookup", f"{dir_path}/{name}" if dir_path else name, index).ok
