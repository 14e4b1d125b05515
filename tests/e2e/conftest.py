"""Fixtures of the end-to-end tests beyond the session cluster of tests/conftest.py."""

from collections.abc import Iterator

import pytest

from tests.conftest import Cluster
from tests.e2e.test_control import SMALL, make_cluster


@pytest.fixture
def small_cluster(criu_bin: str) -> Iterator[Cluster]:
    """Two 2-cpu nodes, n1 and n2, with fast heartbeats (a loss is noticed after 3 s)."""
    yield from make_cluster(SMALL)
