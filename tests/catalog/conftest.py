"""Fixtures shared by the mounted catalog tests: real users and a group (``folks``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cattest_util import People, people


@pytest.fixture
def folks() -> Iterator[People]:
    """Two users and a group made with ``useradd`` for the test, removed after it."""
    with people() as p:
        yield p
