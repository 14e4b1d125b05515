"""Regenerates the Python code for proto/ferry/v1/*.proto next to the .proto files, with typed
stubs for the messages and the gRPC stubs (mypy-protobuf), so mypy checks the API's callers.

Run `python proto/generate.py` after editing a .proto; tests/unit/test_proto_drift.py fails when the
committed code differs from what this produces (grpcio-tools and mypy-protobuf are pinned in
pyproject.toml).
"""

import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent


def generate(out_dir: Path) -> list[Path]:
    """Writes the generated modules under out_dir (same relative layout) and returns them."""
    sources = sorted(PROTO_ROOT.glob("ferry/v1/*.proto"))
    out_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *[str(s.relative_to(PROTO_ROOT)) for s in sources],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in out_dir.glob("ferry/v1/*_pb2*.py*"))


if __name__ == "__main__":
    written = generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT)
    print("\n".join(str(p) for p in written))
