"""The generated gRPC code committed beside proto/ferry/v1/*.proto matches what protoc makes now."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_has_not_drifted(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = module.generate(tmp_path)
    modules = ("ferry_pb2", "ferry_pb2_grpc", "cri_pb2", "cri_pb2_grpc")
    assert {p.name for p in fresh} == {f"{name}{ext}" for name in modules for ext in (".py", ".pyi")}
    for path in fresh:
        committed = ROOT / "proto" / "ferry" / "v1" / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} is out of date: run `python proto/generate.py` and commit the result")
