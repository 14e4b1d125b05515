"""The cluster file of `ferry up --cluster`: good files parse, bad ones name the file and field."""

from pathlib import Path

import pytest

from ferry.common.cluster import load_cluster, parse_cluster
from ferry.common.errors import UsageError


def test_a_good_file() -> None:
    spec = parse_cluster("nodes:\n - {id: a, spot: true, price_per_hour: 0.9, memory: 2GiB, gpus: 1}\n - id: b\n",
                         "c.yaml")
    a, b = spec.nodes
    assert a.spot and a.price_per_hour == 0.9 and a.memory == 2 * 2**30 and a.gpus == 1
    assert a.labels()["market"] == "spot" and b.labels()["market"] == "on-demand"


@pytest.mark.parametrize(("text", "message"), [
    ("nodes: []", "c.yaml: nodes"),
    ("nodes:\n - {id: a, memory: lots}", "bad size 'lots'"),
    ("nodes:\n - {id: a}\n - {id: a}", "appears twice"),
    ("nodes: [", "c.yaml: line 1"),
    ("nodes:\n - {id: a, colour: red}", "c.yaml: nodes[0].colour"),
    ("nodes:\n - {id: 'a b'}", "c.yaml: nodes[0].id"),
    ("nodes:\n - {id: a, price_per_hour: -1}", "c.yaml: nodes[0].price_per_hour"),
    ("- just a list", "c.yaml: expected a mapping"),
])
def test_bad_files_name_the_field(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_cluster(text, "c.yaml")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read cluster file"):
        load_cluster(tmp_path / "none.yaml")
