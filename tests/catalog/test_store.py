"""The catalog at a real origin (a directory and SeaweedFS S3): commands and who may run
them, conditional updates that never lose a concurrent change, and the daemon's TTL cache."""

from __future__ import annotations

import errno
import threading
from typing import Any

import pytest
import trio

from airfs.catalog.commands import apply
from airfs.catalog.model import CatalogError, Metastore, P, Who
from airfs.catalog.store import CATALOG_PATH, CatalogBusy, CatalogCache, CatalogStore
from airfs.origin.base import Conflict, NotFound, Origin
from airfs.testing.fixtures import OriginSpec

ROOT = Who(frozenset({"root"}), is_root=True)
ALICE = Who(frozenset({"alice", "group:alice"}))
BOB = Who(frozenset({"bob", "group:ml"}))


def setup(store: CatalogStore) -> None:
    store.run(ROOT, "init", {})
    store.run(ROOT, "create-catalog", {"name": "main"})
    store.run(ROOT, "create-schema", {"name": "main.raw"})
    store.run(ROOT, "create-volume", {"name": "main.raw.images"})


def grant(store: CatalogStore, w: Who, priv: str, kind: str, name: str, to: str) -> Any:
    return store.run(w, "grant", {"privilege": priv, "type": kind, "name": name, "principal": to})


def test_commands_at_the_origin(origin_spec: OriginSpec) -> None:
    store = CatalogStore(origin_spec.view)
    assert store.load() == (None, "")
    setup(store)
    assert origin_spec.view.stat("main/raw/images").kind.value == "dir"
    with pytest.raises(CatalogError, match="exists already"):
        store.run(ROOT, "init", {})
    with pytest.raises(CatalogError, match="not a catalog admin") as e:
        store.run(ALICE, "create-catalog", {"name": "mine"})
    assert e.value.errno == errno.EACCES
    # alice cannot even see main: ENOENT, not EACCES
    with pytest.raises(CatalogError, match="does not exist") as e:
        grant(store, ALICE, "READ VOLUME", "volume", "main.raw.images", "alice")
    assert e.value.errno == errno.ENOENT
    grant(store, ROOT, "USE_CATALOG", "catalog", "main", "alice")
    grant(store, ROOT, "use schema", "schema", "main.raw", "alice")
    grant(store, ROOT, "CREATE VOLUME", "schema", "main.raw", "alice")
    out = store.run(ALICE, "create-volume", {"name": "main.raw.mine"})
    assert out["location"] == "main/raw/mine"
    meta, _ = store.load()
    assert meta is not None and meta.find(("main", "raw", "mine"))[-1].owner == "alice"  # type: ignore[index]
    # the owner manages her volume; she may not drop the one she does not own
    grant(store, ALICE, "READ VOLUME", "volume", "main.raw.mine", "group:ml")
    with pytest.raises(CatalogError, match="lacks MANAGE"):
        store.run(ALICE, "drop-volume", {"name": "main.raw.images"})
    with pytest.raises(CatalogError, match="cannot be granted on a volume"):
        grant(store, ROOT, "USE CATALOG", "volume", "main.raw.mine", "bob")
    with pytest.raises(CatalogError, match="not empty"):
        store.run(ROOT, "drop-schema", {"name": "main.raw"})
    names = [x["name"] for x in store.run(ALICE, "list", {"name": "main.raw"})]
    assert names == ["main.raw.images", "main.raw.mine"]
    assert store.run(BOB, "list", {}) == []  # no USE CATALOG: nothing listed
    mine = store.run(ALICE, "show-grants", {"name": "main.raw.mine"})
    assert {"principal": "group:ml", "privilege": "READ VOLUME", "object": "main.raw.mine",
            "inherited_from": None} in mine  # fmt: skip
    store.run(ALICE, "revoke", {"privilege": "READ_VOLUME", "type": "volume",
                                "name": "main.raw.mine", "principal": "group:ml"})  # fmt: skip
    assert not [g for g in store.run(ROOT, "show-grants", {"name": "main.raw.mine"})
                if g["principal"] == "group:ml"]  # fmt: skip
    store.run(ALICE, "drop-volume", {"name": "main.raw.mine"})
    meta, _ = store.load()
    assert meta is not None and meta.find(("main", "raw", "mine")) is None


def test_external_volume_is_stored_validated_and_admin_only(origin_spec: OriginSpec) -> None:
    store = CatalogStore(origin_spec.view)
    setup(store)
    grant(store, ROOT, "ALL PRIVILEGES", "catalog", "main", "alice")
    with pytest.raises(CatalogError, match="only admins create external"):
        store.run(ALICE, "create-volume", {"name": "main.raw.ext", "location": "s3://bkt/x"})
    with pytest.raises(CatalogError, match="bad location"):
        store.run(ROOT, "create-volume", {"name": "main.raw.ext", "location": "x/y"})
    out = store.run(ROOT, "create-volume", {"name": "main.raw.ext", "location": "s3://bkt/x"})
    assert out["location"] == "s3://bkt/x"
    with pytest.raises(NotFound):
        origin_spec.view.stat("main/raw/ext")  # nothing made at this origin


def test_a_lost_race_is_reapplied_not_lost(origin_spec: OriginSpec) -> None:
    """Between a command's read and its write another admin's change lands: the put
    conflicts, and the command is re-applied on top of it."""
    store = CatalogStore(origin_spec.view)
    setup(store)
    other = CatalogStore(origin_spec.view)
    real_put = store._put
    raced: list[Any] = []

    def put(meta: Metastore, if_match: str) -> None:
        if not raced:
            raced.append(grant(other, ROOT, "USE CATALOG", "catalog", "main", "bob"))
        real_put(meta, if_match)

    store._put = put  # type: ignore[method-assign]
    grant(store, ROOT, "USE CATALOG", "catalog", "main", "alice")
    assert store.conflicts == 1
    meta, _ = store.load()
    assert meta is not None
    assert meta.catalogs["main"].grants == {"alice": {P.USE_CATALOG}, "bob": {P.USE_CATALOG}}


def test_concurrent_grants_lose_nothing(origin_spec: OriginSpec) -> None:
    store = CatalogStore(origin_spec.view)
    setup(store)
    users = [f"u{i}" for i in range(12)]
    errors: list[BaseException] = []

    def worker(names: list[str]) -> None:
        own = CatalogStore(origin_spec.view)  # another admin (same origin)
        try:
            for n in names:
                grant(own, ROOT, "READ VOLUME", "volume", "main.raw.images", n)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(users[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    meta, _ = store.load()
    assert meta is not None
    vol = meta.find(("main", "raw", "images"))
    assert vol is not None and set(vol[-1].grants) == set(users)
    assert meta.serial == 3 + len(users)


def test_busy_catalog_gives_up_with_a_clear_error(origin_spec: OriginSpec) -> None:
    store = CatalogStore(origin_spec.view, attempts=3)
    setup(store)

    def always_conflict(meta: Metastore, if_match: str) -> None:
        raise Conflict("changed")

    store._put = always_conflict  # type: ignore[method-assign]
    with pytest.raises(CatalogBusy, match="changed 3 times") as e:
        grant(store, ROOT, "USE CATALOG", "catalog", "main", "alice")
    assert e.value.errno == errno.EAGAIN


def _write_raw(origin: Origin, text: str, tmp: str) -> None:
    with open(tmp, "w") as f:
        f.write(text)
    origin.put(CATALOG_PATH, tmp)


@pytest.mark.expect_log(r"damaged catalog: ")
def test_cache_reloads_after_the_ttl_and_a_damaged_catalog_is_reported(
    origin_spec: OriginSpec, tmp_path: Any
) -> None:
    store = CatalogStore(origin_spec.view)
    # a TTL long enough that setting the catalog up (S3 PUTs, on a loaded machine) stays
    # inside it; then a short one, and the cache reloads once that one has passed
    cache = CatalogCache(store, ttl=600)

    async def main() -> None:
        assert await cache.current() is None
        setup(store)
        assert await cache.current() is None  # within the TTL: the cached answer
        cache.ttl = 0.2
        await trio.sleep(0.25)
        meta = await cache.current()
        assert meta is not None and "main" in meta.catalogs
        _write_raw(origin_spec.view, "{not json", str(tmp_path / "raw"))
        cache.invalidate()
        await cache.current()
        assert cache.damaged is not None and "damaged catalog" in cache.damaged
        assert cache.meta is meta  # the last good one is kept, but only admins pass (guard)

    trio.run(main)


def test_apply_is_pure() -> None:
    m = Metastore()
    m2, _ = apply(m, ROOT, "create-catalog", {"name": "c"})
    assert m.catalogs == {} and m2 is not None and "c" in m2.catalogs


def test_rename_moves_the_directory_and_keeps_the_grants(
    origin_spec: OriginSpec, tmp_path: Any
) -> None:
    store = CatalogStore(origin_spec.view)
    setup(store)
    src = tmp_path / "f"
    src.write_bytes(b"data")
    origin_spec.view.put("main/raw/images/f.bin", str(src))
    grant(store, ROOT, "READ VOLUME", "volume", "main.raw.images", "alice")
    # alice owns nothing and holds no CREATE VOLUME: refused, nothing moved
    grant(store, ROOT, "USE CATALOG", "catalog", "main", "alice")
    grant(store, ROOT, "USE SCHEMA", "schema", "main.raw", "alice")
    with pytest.raises(CatalogError, match=r"lacks MANAGE on volume main\.raw\.images"):
        store.run(ALICE, "rename-volume", {"name": "main.raw.images", "new_name": "pics"})
    assert origin_spec.view.stat("main/raw/images/f.bin").size == 4
    out = store.run(ROOT, "rename-volume", {"name": "main.raw.images", "new_name": "pics"})
    assert out["to"] == "main.raw.pics"
    assert origin_spec.view.stat("main/raw/pics/f.bin").size == 4
    with pytest.raises(NotFound):
        origin_spec.view.stat("main/raw/images/f.bin")
    meta, _ = store.load()
    assert meta is not None
    pics = meta.find(("main", "raw", "pics"))
    assert pics is not None and pics[-1].grants["alice"] == {P.READ_VOLUME}
    store.run(ROOT, "create-volume", {"name": "main.raw.other"})
    with pytest.raises(CatalogError, match=r"volume main\.raw\.other exists already"):
        store.run(ROOT, "rename-volume", {"name": "main.raw.pics", "new_name": "other"})
    assert origin_spec.view.stat("main/raw/pics/f.bin").size == 4
    with pytest.raises(CatalogError, match="alice lacks MANAGE on catalog main"):
        store.run(ALICE, "rename-catalog", {"name": "main", "new_name": "prod"})
    store.run(ROOT, "set-owner", {"type": "catalog", "name": "main", "principal": "alice"})
    with pytest.raises(CatalogError, match="only admins rename catalogs"):
        store.run(ALICE, "rename-catalog", {"name": "main", "new_name": "prod"})
    store.run(ROOT, "rename-catalog", {"name": "main", "new_name": "prod"})
    assert origin_spec.view.stat("prod/raw/pics/f.bin").size == 4


def test_a_dropped_managed_volume_moves_aside_and_its_name_starts_empty(
    origin_spec: OriginSpec, tmp_path: Any
) -> None:
    view = origin_spec.view
    store = CatalogStore(view)
    setup(store)
    src = tmp_path / "f"
    src.write_bytes(b"old bytes")
    view.put("main/raw/images/old.bin", str(src))
    out = store.run(ROOT, "drop-volume", {"name": "main.raw.images"})
    moved = out["files_moved_to"]
    assert out["dropped"] == "main.raw.images"
    assert moved.startswith(".airfs-catalog/dropped/main.raw.images@"), out
    assert view.read_range(f"{moved}/old.bin", 0, 100) == b"old bytes"
    store.run(ROOT, "create-volume", {"name": "main.raw.images"})
    assert [e.name for e in view.list("main/raw/images")] == []
    # a volume with no directory at the origin moves nothing
    view.rmdir("main/raw/images")
    assert store.run(ROOT, "drop-volume", {"name": "main.raw.images"})["files_moved_to"] is None
