"""The SPANK plugin's setup step (scripts/install-slurm-plugin.sh) against the machine's real SLURM
(Debian's slurm-wlm, slurmd and libslurm-dev, which ./setup.sh installs): it builds the plugin with
the installed headers, installs it and names it in a plugstack.conf, undoes that on --uninstall,
and refuses headers of another SLURM version than slurmd's in one line. Here into temporary
folders; the e2e tests (tests/e2e/test_slurm.py) load the plugin in real slurmds."""

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.slurm import require_slurm

SCRIPT = ROOT / "scripts" / "install-slurm-plugin.sh"


def install(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    require_slurm()
    plugins = tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    variables = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "FERRY_SLURM_PLUGIN_DIR": str(plugins), "FERRY_SLURM_PLUGSTACK": str(tmp_path / "plugstack.conf"),
                 "FERRY_SLURM_LAUNCHER": "/opt/ferry/bin/ferry-slurm-task", **env}
    return subprocess.run([str(SCRIPT), *args], env=variables, capture_output=True, text=True, timeout=120)


def test_the_plugin_builds_against_the_installed_slurm_and_is_named_in_plugstack(tmp_path: Path) -> None:
    (tmp_path / "plugstack.conf").write_text("# the site's own line\nrequired /usr/lib/other.so\n")
    done = install(tmp_path)
    assert done.returncode == 0, done.stderr
    plugin = tmp_path / "plugins" / "ferry_spank.so"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(plugin)], capture_output=True, text=True,
                             check=True).stdout
    for needed in ("slurm_spank_init", "slurm_spank_task_init", "plugin_name", "plugin_type", "spank_plugin_version"):
        assert re.search(rf"\b{needed}\b", symbols), f"{needed} is not exported:\n{symbols}"
    ours = tmp_path / "plugstack.conf.d" / "ferry.conf"
    assert ours.read_text() == f"optional {plugin} ferry=/opt/ferry/bin/ferry-slurm-task\n"
    assert (tmp_path / "plugstack.conf").read_text() == (
        f"# the site's own line\nrequired /usr/lib/other.so\ninclude {ours}\n")
    again = install(tmp_path)  # idempotent: nothing to say, nothing changed
    assert again.returncode == 0 and "installing" not in again.stdout and "adding" not in again.stdout, again
    assert (tmp_path / "plugstack.conf").read_text().count("include") == 1

    undone = install(tmp_path, "--uninstall")
    assert undone.returncode == 0, undone.stderr
    assert not plugin.exists() and not ours.exists()
    assert (tmp_path / "plugstack.conf").read_text() == "# the site's own line\nrequired /usr/lib/other.so\n"


@pytest.mark.parametrize(("hexversion", "said"), [("0x170b00", "23.11.0"), ("0x150802", "21.08.2")])
def test_headers_of_another_slurm_version_are_refused_in_one_line(tmp_path: Path, hexversion: str, said: str) -> None:
    header = tmp_path / "slurm_version.h"
    header.write_text(f"#define SLURM_VERSION_NUMBER {hexversion}\n")
    done = install(tmp_path, FERRY_SLURM_HEADER=str(header))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"setup: SLURM version mismatch: the headers (libslurm-dev) are {said} but slurmd is ")
    assert "install libslurm-dev of slurmd's version" in lines[0]
    assert not (tmp_path / "plugins" / "ferry_spank.so").exists()
