"""Store URLs: file, plain paths, s3 with credentials from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.common.errors import UsageError
from ferry.store.local import LocalBackend
from ferry.store.s3 import S3Backend
from ferry.store.url import open_backend

CREDS = {"FERRY_S3_ACCESS_KEY": "ak", "FERRY_S3_SECRET_KEY": "sk"}


def test_local_urls(tmp_path: Path) -> None:
    backend = open_backend(f"file://{tmp_path}/store")
    assert isinstance(backend, LocalBackend) and backend.root == tmp_path / "store"
    backend = open_backend(str(tmp_path / "plain"))
    assert isinstance(backend, LocalBackend) and backend.root == tmp_path / "plain"
    backend = open_backend("file://localhost/srv/ferry%20store")
    assert isinstance(backend, LocalBackend) and backend.root == Path("/srv/ferry store")


def test_s3_url() -> None:
    backend = open_backend("s3://ckpts/team/a?endpoint=127.0.0.1:9000&secure=0&region=us-east-1", env=CREDS)
    assert isinstance(backend, S3Backend)
    assert (backend.endpoint, backend.bucket, backend.prefix) == ("127.0.0.1:9000", "ckpts", "team/a/")
    assert backend.describe() == "s3://ckpts/team/a/ at 127.0.0.1:9000"
    backend = open_backend("s3://ckpts", env={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"})
    assert isinstance(backend, S3Backend)
    assert (backend.endpoint, backend.prefix) == ("s3.amazonaws.com", "")


@pytest.mark.parametrize(
    "url",
    [
        "",
        "s3:bucket",
        "ftp://host/x",
        "file://otherhost/x",
        "file:///x?y=1",
        "s3://",
        "s3://bucket:9000/x",
        "s3://key:secret@bucket",
        "s3://bucket?endpiont=h:1",
        "s3://bucket?secure=maybe",
        "s3://bucket?secure=0&secure=1",
        "s3://Bad_Bucket",
        "s3://bucket?endpoint=http://h:9000",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(UsageError) as info:
        open_backend(url, env=CREDS)
    assert "\n" not in str(info.value)


def test_bad_url_names_the_expected_form() -> None:
    with pytest.raises(UsageError, match=r"expected file:///abs/path, .* s3://bucket\[/prefix\]\?endpoint="):
        open_backend("ftp://x/y", env=CREDS)


def test_s3_needs_credentials() -> None:
    with pytest.raises(UsageError, match="FERRY_S3_ACCESS_KEY and FERRY_S3_SECRET_KEY"):
        open_backend("s3://bucket?endpoint=h:1", env={})
    with pytest.raises(UsageError):  # half a pair is no pair
        open_backend("s3://bucket?endpoint=h:1", env={"FERRY_S3_ACCESS_KEY": "a", "AWS_SECRET_ACCESS_KEY": "s"})
