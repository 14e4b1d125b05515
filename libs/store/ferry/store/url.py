"""Opening a backend from a store URL.

- ``/abs/or/relative/path`` or ``file:///abs/path``: a local directory;
- ``s3://bucket[/prefix]?endpoint=host:port&secure=0|1&region=name``: an S3 bucket. Credentials
  come from FERRY_S3_ACCESS_KEY and FERRY_S3_SECRET_KEY, else AWS_ACCESS_KEY_ID and
  AWS_SECRET_ACCESS_KEY, never from the URL. Without ``endpoint``, AWS S3 (s3.amazonaws.com).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ferry.common.errors import UsageError
from ferry.store.backend import Backend
from ferry.store.keys import load_keyring
from ferry.store.local import LocalBackend
from ferry.store.s3 import S3Backend
from ferry.store.store import CheckpointStore

EXPECTED = "file:///abs/path, a directory path, or s3://bucket[/prefix]?endpoint=host:port[&secure=0|1][&region=name]"
_S3_PARAMS = ("endpoint", "secure", "region")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bad(url: str, why: str) -> UsageError:
    return UsageError(f"bad store URL {url!r}: {why}; expected {EXPECTED}")


def open_store(url: str, key_file: Path, **kwargs: Any) -> CheckpointStore:
    """The store at ``url``, sealed with the keyring in ``key_file`` (ConfigError when it is missing)."""
    return CheckpointStore(open_backend(url), keyring=load_keyring(key_file), **kwargs)


def open_backend(url: str, *, env: Mapping[str, str] | None = None) -> Backend:
    """The backend a store URL names (``env`` defaults to ``os.environ``)."""
    if not url.strip():
        raise _bad(url, "it is empty")
    if "://" not in url:
        if url.split(":", 1)[0].lower() in ("s3", "file"):
            raise _bad(url, "missing //")
        return LocalBackend(Path(url).expanduser())
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/") or parts.query or parts.fragment:
            raise _bad(url, "a file URL holds an absolute path and nothing else")
        return LocalBackend(Path(path))
    if scheme == "s3":
        return _open_s3(url, env if env is not None else os.environ)
    raise _bad(url, f"unknown scheme {parts.scheme!r}")


def _open_s3(url: str, env: Mapping[str, str]) -> Backend:
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise _bad(url, "credentials do not belong in the URL; set FERRY_S3_ACCESS_KEY and FERRY_S3_SECRET_KEY")
    if not parts.netloc or ":" in parts.netloc or parts.fragment:
        raise _bad(url, "name a bucket, without port or fragment")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise _bad(url, "malformed query") from exc
    for name, values in query.items():
        if name not in _S3_PARAMS:
            raise _bad(url, f"unknown parameter {name!r} (known: {', '.join(_S3_PARAMS)})")
        if len(values) != 1 or not values[0]:
            raise _bad(url, f"give {name} exactly one value")
    secure_text = query.get("secure", ["1"])[0].lower()
    if secure_text not in _TRUE | _FALSE:
        raise _bad(url, "secure must be 0 or 1")
    pair = ("FERRY_S3_ACCESS_KEY", "FERRY_S3_SECRET_KEY")
    if not any(env.get(name) for name in pair):
        pair = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    access, secret = env.get(pair[0]), env.get(pair[1])
    if not access or not secret:
        raise UsageError(
            f"store {url!r} needs credentials: set FERRY_S3_ACCESS_KEY and FERRY_S3_SECRET_KEY "
            "(or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    return S3Backend(
        query.get("endpoint", ["s3.amazonaws.com"])[0],
        parts.netloc,
        unquote(parts.path).strip("/"),
        access_key=access,
        secret_key=secret,
        secure=secure_text in _TRUE,
        region=query.get("region", [None])[0],
    )
