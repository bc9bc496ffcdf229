"""The guard and the daemon's catalog service without a kernel (an in-memory origin): the
ungoverned case, principals from a caller's uid and groups, denials counted and logged once per
interval, a damaged catalog, a change seen after the TTL, the control checks and ``why``."""

from __future__ import annotations

import errno
import logging
import os

import pytest
import trio

from airfs.catalog.model import RESERVED, Who
from airfs.catalog.service import CatalogService
from airfs.catalog.store import CATALOG_PATH
from airfs.core.context import Caller
from airfs.testing.memory import MemoryOrigin

ROOT = Who(frozenset({"root"}), is_root=True)
ROOT_CALLER = Caller(0, 0, os.getpid())
NOBODY = Caller(65534, 65534, 0)  # "nobody" / "nogroup" on Debian


def service(ttl: float = 60.0) -> tuple[CatalogService, MemoryOrigin]:
    o = MemoryOrigin()
    return CatalogService(o, ttl), o


def setup(s: CatalogService) -> None:
    run = s.store.run
    run(ROOT, "init", {})
    run(ROOT, "create-catalog", {"name": "main"})
    run(ROOT, "create-schema", {"name": "main.raw"})
    run(ROOT, "create-volume", {"name": "main.raw.v"})
    for priv, kind, name in (("USE CATALOG", "catalog", "main"),
                             ("USE SCHEMA", "schema", "main.raw")):  # fmt: skip
        run(ROOT, "grant", {"privilege": priv, "type": kind, "name": name,
                            "principal": "nobody"})  # fmt: skip


async def refused(s: CatalogService, caller: Caller, op: str, path: str) -> int:
    with pytest.raises(OSError) as e:
        await s.guard.check(caller, op, path)
    assert e.value.errno is not None
    return e.value.errno


def test_ungoverned_allows_all_but_the_reserved_name() -> None:
    s, _ = service()

    async def main() -> None:
        await s.guard.check(NOBODY, "mkdir", "anything")
        assert await refused(s, NOBODY, "lookup", RESERVED) == errno.ENOENT
        assert await refused(s, ROOT_CALLER, "open_read", CATALOG_PATH) == errno.ENOENT
        assert not s.guard.visible(ROOT_CALLER, "", RESERVED)
        assert s.guard.visible(NOBODY, "", "x")
        assert s.guard.statistics().catalog.governed is False

    trio.run(main)


def test_denials_are_counted_and_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s, _ = service()
    setup(s)

    async def main() -> None:
        await s.guard.check(NOBODY, "lookup", "main/raw/v")  # USE on both levels: visible
        for _ in range(3):
            assert await refused(s, NOBODY, "open_read", "main/raw/v/f") == errno.EACCES
        assert await refused(s, NOBODY, "create", "main/raw/v/g") == errno.EACCES
        assert await refused(s, ROOT_CALLER, "mkdir", "main/x") == errno.EPERM
        assert await refused(s, NOBODY, "lookup", "other") == errno.ENOENT
        st = s.guard.statistics()
        assert st.denied == 6
        assert st.denied_by_errno == {"EACCES": 4, "EPERM": 1, "ENOENT": 1}
        assert st.denied_by_privilege == {"READ VOLUME": 4}
        assert st.catalog.governed and st.catalog.serial == 5  # five changes after init

    with caplog.at_level(logging.INFO, logger="airfs.catalog.guard"):
        trio.run(main)
    lines = [r.getMessage() for r in caplog.records if r.name == "airfs.catalog.guard"]
    assert (
        lines.count(
            "catalog: denied nobody (uid 65534, pid 0) open_read /main/raw/v/f: missing READ "
            "VOLUME on volume main.raw.v (EACCES)"
        )
        == 1
    )  # the two repeats are counted, not logged
    assert any("mkdir /main/x" in x and "(EPERM)" in x for x in lines)


def test_groups_are_principals_and_root_can_lose_admin() -> None:
    s, _ = service(ttl=0.0)
    setup(s)
    s.store.run(ROOT, "grant", {"privilege": "READ VOLUME", "type": "volume",
                                "name": "main.raw.v", "principal": "group:nogroup"})  # fmt: skip

    async def main() -> None:
        await s.guard.check(NOBODY, "open_read", "main/raw/v/f")
        await s.guard.check(ROOT_CALLER, "open_read", "main/raw/v/f")
        meta, version = s.store.load()
        assert meta is not None
        meta.root_admin = False
        meta.catalogs["main"].owner = "someone"
        meta.catalogs["main"].children["raw"].owner = "someone"
        meta.catalogs["main"].children["raw"].children["v"].owner = "someone"
        s.store._put(meta, version)
        assert await refused(s, ROOT_CALLER, "open_read", "main/raw/v/f") == errno.ENOENT

    trio.run(main)


def test_a_change_is_seen_after_the_ttl_and_a_damaged_catalog_fails_closed(
    tmp_path: object,
) -> None:
    s, o = service(ttl=0.2)
    setup(s)

    async def main() -> None:
        assert await refused(s, NOBODY, "open_read", "main/raw/v/f") == errno.EACCES
        s.store.run(ROOT, "grant", {"privilege": "READ_VOLUME", "type": "volume",
                                    "name": "main.raw.v", "principal": "nobody"})  # fmt: skip
        await trio.sleep(0.25)
        await s.guard.check(NOBODY, "open_read", "main/raw/v/f")
        src = os.path.join(str(tmp_path), "bad.json")
        with open(src, "w") as f:
            f.write('{"format": 99}')
        o.put(CATALOG_PATH, src)
        await trio.sleep(0.25)
        assert await refused(s, NOBODY, "open_read", "main/raw/v/f") == errno.EACCES
        assert not s.guard.visible(NOBODY, "", "main")
        await s.guard.check(ROOT_CALLER, "open_read", "main/raw/v/f")  # root gets through

    trio.run(main)


def test_control_checks_and_why() -> None:
    s, _ = service()
    setup(s)

    async def main() -> None:
        for op, path, code in (
            ("warm", "", errno.EACCES),
            ("warm", "main", errno.EACCES),
            ("warm", "main/raw/v", errno.EACCES),
            ("flush", "main/raw/v/d", errno.EACCES),
            ("prefetch", "main/raw/nothere/f", errno.ENOENT),
        ):
            with pytest.raises(OSError) as e:
                await s.check_control(NOBODY, op, path)
            assert e.value.errno == code, (op, path)
        await s.check_control(ROOT_CALLER, "warm", "")
        out = await s.command(NOBODY, "why", {"path": "main/raw/v/f", "access": "read"})
        missing = "READ VOLUME on volume main.raw.v"
        assert out == {"governed": True, "volume": "main.raw.v", "missing": missing,
                       "errno": errno.EACCES}  # fmt: skip
        with pytest.raises(OSError) as e:
            args = {"privilege": "READ VOLUME", "type": "volume", "name": "main.raw.v",
                    "principal": "nobody"}  # fmt: skip
            await s.command(NOBODY, "grant", args)
        assert e.value.errno == errno.EACCES and "lacks MANAGE" in str(e.value)
        assert s.guard.statistics().denied_by_op["catalog grant"] == 1

    trio.run(main)


def test_control_mode_check_takes_each_objects_owner() -> None:
    """The control socket's mode check (warm/flush) uses the owner the mount reports for each
    object (issue 13's per-file owners), falling back to the mount's owner."""
    from airfs.control.auth import Denied, Peer, W, check_path
    from airfs.core.attrs import Owner
    from airfs.origin.base import Kind

    async def lookup(path: str) -> tuple[Kind, int] | tuple[Kind, int, int, int] | None:
        if path == "":
            return Kind.DIR, 0o755  # no owner of its own: the mount's (root)
        return (Kind.DIR, 0o755, 1000, 1000) if path == "d" else None

    async def main() -> None:
        owner = Owner(0, 0)
        await check_path(Peer(1000, 1000, 1), "d", W, owner, lookup)
        with pytest.raises(Denied):
            await check_path(Peer(1001, 1001, 1), "d", W, owner, lookup)
        with pytest.raises(Denied):
            await check_path(Peer(1000, 1000, 1), "", W, owner, lookup)

    trio.run(main)


def test_governs_and_storage_name_each_volume_once_a_catalog_exists() -> None:
    s, _ = service()

    async def main() -> None:
        await s.cache.current()
        assert not s.guard.governs()
        assert s.guard.storage("main/raw/v/a") == s.guard.storage("other/x/y/b") == ""
        setup(s)
        s.cache.invalidate()
        await s.cache.current()
        assert s.guard.governs()
        assert s.guard.storage("main/raw/v/a/b") == s.guard.storage("main/raw/v") == "main/raw/v"
        assert s.guard.storage("main/raw/w/a") == "main/raw/w"
        # the file linked needs READ VOLUME (nobody has USE only)
        assert await refused(s, NOBODY, "link_from", "main/raw/v/a") == errno.EACCES

    trio.run(main)
