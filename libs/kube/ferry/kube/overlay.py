"""A container's root filesystem changes: what its overlay upper directory holds, carried with a
checkpoint and laid over the same image's fresh root filesystem before a restore.

containerd mounts a container's root filesystem as overlayfs: the image's layers below, the
container's writes in ``upperdir``. Files deleted from a lower layer show in the upper directory
as whiteouts (character devices 0:0), and a directory replaced whole is marked opaque (the xattr
``trusted.overlay.opaque=y``); neither may be copied as such into another overlay's merged view,
so they travel as a list beside the files (``CHANGES``) and are applied as deletions.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import sys
import tarfile
from pathlib import Path

from pydantic import BaseModel

CHANGES = ".ferry-changes.json"  # the member of the archive that lists deletions and opaque folders
OPAQUE_XATTR = "trusted.overlay.opaque"


class Changes(BaseModel):
    deleted: list[str] = []  # paths (relative to the root) whose lower files are gone
    opaque: list[str] = []  # folders whose lower contents are hidden


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def upper_from_mountinfo(mountinfo: str, mountpoint: str) -> str | None:
    """The ``upperdir`` of the overlay mounted at ``mountpoint`` (the last such mount), or None."""
    found: str | None = None
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or _unescape(fields[4]) != mountpoint:
            continue
        parts = tail.split()
        if len(parts) < 3 or parts[0] != "overlay":
            found = None
            continue
        options = {k: v for k, _, v in (o.partition("=") for o in parts[2].split(","))}
        found = _unescape(options["upperdir"]) if "upperdir" in options else None
    return found


def upper_dir(rootfs: Path) -> Path | None:
    upper = upper_from_mountinfo(Path("/proc/self/mountinfo").read_text(), str(rootfs))
    return Path(upper) if upper else None


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def save_changes(upper: Path, archive: Path) -> Changes:
    """``upper``'s files into ``archive`` (owners, modes and device nodes kept), its whiteouts and
    opaque folders as the ``CHANGES`` member."""
    changes = Changes()
    with tarfile.open(archive, "w") as tar:
        for folder, dirs, files in os.walk(upper):
            base = Path(folder)
            rel_base = base.relative_to(upper)
            if base != upper and _is_opaque(base):
                changes.opaque.append(str(rel_base))
            for name in sorted(dirs) + sorted(files):
                path = base / name
                rel = str(rel_base / name) if str(rel_base) != "." else name
                st = path.lstat()
                if _is_whiteout(st):
                    changes.deleted.append(rel)
                    continue
                tar.add(path, arcname=rel, recursive=False)
        body = changes.model_dump_json().encode()
        info = tarfile.TarInfo(CHANGES)
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return changes


def _inside(root: Path, rel: str) -> Path:
    """``root / rel`` with its folders resolved and its last part not followed (a link is removed,
    not what it names); ValueError when that is outside ``root``."""
    target, top = (root / rel).parent.resolve() / Path(rel).name, root.resolve()
    if target != top and top not in target.parents:
        raise ValueError(f"{rel!r} leaves the root filesystem")
    return target


def apply_changes(archive: Path, rootfs: Path) -> Changes:
    """Lays ``archive`` (``save_changes``) over ``rootfs``: opaque folders emptied, deleted paths
    removed, then the files extracted. ValueError or tarfile.TarError when it is not such an archive."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile(CHANGES)
        if member is None:
            raise ValueError(f"{archive} holds no {CHANGES}")
        changes = Changes.model_validate_json(member.read())
        for rel in changes.opaque:
            folder = _inside(rootfs, rel)
            if folder.is_dir() and not folder.is_symlink():
                for child in folder.iterdir():
                    _remove(child)
        for rel in changes.deleted:
            _remove(_inside(rootfs, rel))
        members = [m for m in tar.getmembers() if m.name != CHANGES]
        tar.extractall(rootfs, members=members, filter="tar")
    return changes


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m ferry.kube.overlay save UPPER ARCHIVE``: CRIU's post-dump action, while the
    container is still frozen (``CRTOOLS_SCRIPT_ACTION``); any other action is a no-op."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "save":
        print("usage: python -m ferry.kube.overlay save UPPER ARCHIVE", file=sys.stderr)
        return 2
    if os.environ.get("CRTOOLS_SCRIPT_ACTION", "post-dump") != "post-dump":
        return 0
    save_changes(Path(args[1]), Path(args[2]))
    print(json.dumps({"saved": args[2]}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
