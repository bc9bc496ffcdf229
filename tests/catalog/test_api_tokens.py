"""The REST API's token store on a directory and on SeaweedFS S3, without a server: tokens
made concurrently by several writers all survive (conditional writes), each verifies as its
principal and groups, a revoked one stops verifying at once, and a damaged document is a
clear error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airfs.catalog.api.tokens import TOKENS_PATH, TokenStore
from airfs.catalog.model import CatalogError
from airfs.testing.fixtures import OriginSpec


def test_concurrent_creates_all_survive_and_revoke_is_immediate(origin_spec: OriginSpec) -> None:
    made: dict[str, str] = {}
    lock = threading.Lock()

    def create(i: int) -> None:
        store = TokenStore(origin_spec.view)  # one writer each, as separate admins would be
        text, tok = store.create(f"user{i}", [f"g{i}"])
        with lock:
            made[tok.id] = text

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader = TokenStore(origin_spec.view)
    assert sorted(t.principal for t in reader.list()) == [f"user{i}" for i in range(6)]
    for tid, text in made.items():
        tok = reader.verify(text)
        assert tok is not None and tok.id == tid
        assert tok.who().principals == {tok.principal, f"group:g{tok.principal[4:]}"}
        assert not tok.who().is_root
    victim = next(iter(made))
    reader.revoke(victim)
    assert reader.verify(made[victim]) is None
    assert all(reader.verify(t) is not None for k, t in made.items() if k != victim)
    assert reader.verify("airfs-" + "0" * 12 + "-" + "f" * 64) is None
    assert reader.verify("not a token") is None
    with pytest.raises(CatalogError, match="no token"):
        reader.revoke(victim)


def test_a_damaged_token_list_is_a_clear_error(origin_spec: OriginSpec, tmp_path: Path) -> None:
    store = TokenStore(origin_spec.view)
    store.create("alice", [])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    origin_spec.view.put(TOKENS_PATH, str(bad))
    with pytest.raises(CatalogError, match="damaged"):
        TokenStore(origin_spec.view).list()
    with pytest.raises(CatalogError, match="bad principal"):
        store.create("has space", [])
