"""Maps the repository's folders (libs/*, services/*, proto) onto one `ferry.*` namespace.

Each root holds a `ferry/<name>/` package; setuptools' own finder cannot merge several roots into
one namespace, so the mapping is computed here and handed to setup() explicitly.
"""

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
ROOTS = [HERE / "proto", *sorted((HERE / "libs").iterdir()), *sorted((HERE / "services").iterdir())]

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in ROOTS:
    base = root / "ferry"
    if not base.is_dir():
        continue
    for init in sorted(base.rglob("__init__.py")):
        pkg_path = init.parent
        name = ".".join(pkg_path.relative_to(root).parts)
        packages.append(name)
        package_dir[name] = str(pkg_path.relative_to(HERE))

setup(packages=packages, package_dir=package_dir)
