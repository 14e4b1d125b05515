"""Which CRIU a kernel needs, and reading CRIU's version."""

import pytest

from ferry.criu.binary import parse_version, required_version


@pytest.mark.parametrize(
    ("kernel", "need"),
    [
        ("6.18.44-cloud-amd64", (4, 2)),  # 4.1 cannot dump an inet socket here (criu #2705)
        ("6.16.0", (4, 2)),
        ("7.0.1", (4, 2)),
        ("6.15.9-1", (4, 1)),
        ("6.12.48+deb13-amd64", (4, 1)),
        ("5.10.0", (4, 1)),
        ("not-a-kernel", (4, 1)),
    ],
)
def test_required_version_follows_the_kernel(kernel: str, need: tuple[int, int]) -> None:
    assert required_version(kernel) == need


def test_parse_version() -> None:
    assert parse_version("Version: 4.2.1\nGitID: v4.2.1\n") == (4, 2, 1)
    assert parse_version("Version: 4.2\n") == (4, 2, 0)
    assert parse_version("criu: command not found") is None
