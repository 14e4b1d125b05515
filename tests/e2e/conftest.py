"""Fixtures of the end-to-end tests beyond the session cluster of tests/conftest.py."""

from collections.abc import Iterator

import pytest

from tests.conftest import Cluster
from tests.e2e.test_control import SMALL, make_cluster


@pytest.fixture
def small_cluster(criu_bin: str) -> Iterator[Cluster]:
    """Two 2-cpu nodes, n1 and n2, with fast heartbeats (a loss is noticed after 3 s)."""
    yield from make_cluster(SMALL)


THREE = """
nodes:
  - {id: n1, cpus: 2}
  - {id: n2, cpus: 2}
  - {id: n3, cpus: 2}
"""


@pytest.fixture
def three_nodes(criu_bin: str) -> Iterator[Cluster]:
    """Three 2-cpu nodes, n1 to n3, with fast heartbeats (a lost node is noticed after 3 s)."""
    yield from make_cluster(THREE)
