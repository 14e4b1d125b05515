"""Settings that hold lists, maps and models are typed and refused at load, before a service starts:
FERRY_INTERRUPTION_SOURCES, FERRY_PRICE_FEEDS and FERRY_NODE_SPEC."""

from pathlib import Path

import pytest

from ferry.common.config import Settings, load_settings
from ferry.common.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("FERRY_"):
            monkeypatch.delenv(name)


def test_the_variable_forms_become_maps_lists_and_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_INTERRUPTION_SOURCES", "aws=http://127.0.0.1:1, azure=https://meta")
    monkeypatch.setenv("FERRY_PRICE_FEEDS", "a.json,,b.csv ")
    monkeypatch.setenv("FERRY_NODE_SPEC", '{"id": "n1", "cpus": 3}')
    s = load_settings()
    assert s.interruption_sources == {"aws": "http://127.0.0.1:1", "azure": "https://meta"}
    assert s.price_feeds == [Path("a.json"), Path("b.csv")]
    assert s.node_spec is not None and s.node_spec.id == "n1" and s.node_spec.cpus == 3


def test_a_config_file_may_use_the_native_forms(tmp_path: Path) -> None:
    f = tmp_path / "ferry.yaml"
    f.write_text("interruption_sources: {gcp: 'http://x:1'}\nprice_feeds: [a.json]\nnode_spec: {id: n2, cpus: 1}\n")
    s = load_settings(f)
    assert s.interruption_sources == {"gcp": "http://x:1"} and s.price_feeds == [Path("a.json")]
    assert s.node_spec is not None and s.node_spec.id == "n2"


@pytest.mark.parametrize(("name", "value", "says"), [
    ("FERRY_INTERRUPTION_SOURCES", "aws", "interruption_sources"),
    ("FERRY_INTERRUPTION_SOURCES", "ibm=http://x", "interruption_sources"),
    ("FERRY_INTERRUPTION_SOURCES", "aws=ftp://x", "interruption_sources"),
    ("FERRY_NODE_SPEC", '{"id": ', "node_spec"),
    ("FERRY_NODE_SPEC", '{"id": "n", "cpus": -1}', "node_spec"),
])
def test_bad_values_are_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert says in str(err.value) and "\n" not in str(err.value)


def test_empty_values_mean_none() -> None:
    s = Settings(interruption_sources="", price_feeds="", node_spec="")
    assert s.interruption_sources == {} and s.price_feeds == [] and s.node_spec is None
