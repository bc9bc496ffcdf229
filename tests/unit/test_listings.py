"""The listing cache that answers lookups within the TTL."""

from __future__ import annotations

import time

from airfs.core.listings import ListingCache
from airfs.origin.base import Entry, Kind


def e(name: str, version: str = "v1") -> Entry:
    return Entry(name, Kind.FILE, 1, 0, 0o644, version)


def test_fresh_within_ttl_then_expired() -> None:
    c = ListingCache(0.05)
    c.put("d", [e("a")], time.monotonic())
    listing = c.fresh("d")
    assert listing is not None and set(listing.entries) == {"a"}
    time.sleep(0.06)
    assert c.fresh("d") is None
    assert c.worth_relisting("d")
    assert not c.worth_relisting("other")


def test_changes_through_the_mount_patch_listings() -> None:
    c = ListingCache(10)
    c.put("d", [e("a"), e("b")], time.monotonic())
    c.record("d/c", e("c"))
    c.record("d/a", None)
    listing = c.fresh("d")
    assert listing is not None and set(listing.entries) == {"b", "c"}


def test_a_fetch_that_raced_a_change_gets_the_change_replayed() -> None:
    c = ListingCache(10)
    t0 = time.monotonic()
    c.record("d/new", e("new"))  # committed while the listing was being fetched
    c.record("d/old", None)  # deleted meanwhile
    listing = c.put("d", [e("old"), e("x")], t0)
    assert c.fresh("d") is listing
    assert set(listing.entries) == {"new", "x"}


def test_a_fetch_that_raced_an_unknown_change_is_not_kept() -> None:
    c = ListingCache(10)
    t0 = time.monotonic()
    c.discard("d")  # e.g. something was renamed into it: entry unknown
    c.put("d", [e("x")], t0)
    assert c.fresh("d") is None
    c.put("d", [e("x")], time.monotonic())
    assert c.fresh("d") is not None


def test_drop_forgets_the_subtree() -> None:
    c = ListingCache(10)
    now = time.monotonic()
    for d in ("a", "a/b", "ab"):
        c.put(d, [], now)
    c.drop("a")
    assert c.fresh("a") is None and c.fresh("a/b") is None and c.fresh("ab") is not None


def test_names_answered_by_a_listing_do_not_count_toward_listing_it_again() -> None:
    """A slow listing (over 80% of the TTL) is fetched again only once the names asked of the
    origin one by one since it expired cost more than it did; the names it answered while
    fresh cost nothing and do not count (they did, and a busy directory was listed again at
    its first expired name)."""
    c = ListingCache(1.0)
    listing = c.put("d", [e(f"n{i}") for i in range(5000)], time.monotonic() - 2, took=0.9)
    listing.asked = 4000  # answered from it while it was fresh
    assert not c.worth_relisting("d", name_s=0.01)
    c.asked("d", 50)  # 50 names asked by name since: 0.5 s of requests, less than 0.9
    assert not c.worth_relisting("d", name_s=0.01)
    c.asked("d", 50)
    assert c.worth_relisting("d", name_s=0.01)


def test_a_listing_fetched_again_that_arrived_stale_is_not_fetched_again() -> None:
    """A first listing that took long (it HEADed the objects) is tried again; one fetched
    again that still took the whole TTL is stale when it arrives: names are asked by name."""
    c = ListingCache(1.0)
    first = c.put("d", [e(f"n{i}") for i in range(5000)], time.monotonic() - 5, took=3.0)
    assert not first.again
    c.asked("d", 400)
    assert c.worth_relisting("d", name_s=0.01)
    again = c.put("d", [e(f"n{i}") for i in range(5000)], time.monotonic() - 2, took=1.5)
    assert again.again
    c.asked("d", 10_000)
    assert not c.worth_relisting("d", name_s=0.01)
