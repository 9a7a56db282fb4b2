"""The supported torch releases are the same everywhere they are named: pyproject.toml's range,
the pins in constraints.txt and constraints/, the tox environments, CI and the README. The wheel
carries the license and the project's addresses, and declares every module torchscan imports."""

from __future__ import annotations

import ast
import email.message
import email.parser
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pinned_torch(path: Path) -> Version:
    (pin,) = re.findall(r"^torch==(\S+)$", path.read_text(), re.MULTILINE)
    return Version(pin)


PINS = {
    "2.13": _pinned_torch(ROOT / "constraints.txt"),
    **{
        path.stem.removeprefix("torch-"): _pinned_torch(path)
        for path in sorted((ROOT / "constraints").glob("torch-*.txt"))
    },
}


def test_each_pin_is_its_release() -> None:
    assert {release: f"{v.major}.{v.minor}" for release, v in PINS.items()} == {
        release: release for release in PINS
    }


def test_pyproject_admits_every_supported_release_with_no_upper_bound() -> None:
    # what pip reads: the metadata of the installed distribution, built from pyproject.toml
    requirements = [Requirement(r) for r in metadata.requires("torchscan-onnx") or []]
    (torch,) = [r for r in requirements if r.name == "torch"]
    assert all(torch.specifier.contains(version) for version in PINS.values())
    assert not any(spec.operator in ("<", "<=", "==", "~=") for spec in torch.specifier)
    oldest = min(PINS.values())
    assert str(torch.specifier) == f">={oldest.major}.{oldest.minor}"


def test_readme_tox_and_ci_name_the_same_releases() -> None:
    releases = sorted(PINS, key=Version)
    readme = (ROOT / "README.md").read_text()
    section = " ".join(readme.split("## Supported versions", 1)[1].split("\n## ", 1)[0].split())
    named = ", ".join(releases[:-1]) + " and " + releases[-1]
    assert f"**torch {named}**" in section
    tox = (ROOT / "tox.ini").read_text()
    for release in releases[1:]:
        env = "torch" + release.replace(".", "")
        assert f"{env}: PIP_CONSTRAINT = {{toxinidir}}/constraints/torch-{release}.txt" in tox
        assert f"tox -e {env}" in section
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"RELEASES=({' '.join(releases[1:])})" in ci


# --- the wheel ----------------------------------------------------------------------------------

WHEEL_SOURCES = ["pyproject.toml", "README.md", "LICENSE", "torchscan"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The wheel setuptools builds from a copy of the sources (the build leaves its files there,
    not in the checkout), built once for the tests below."""
    source = tmp_path_factory.mktemp("source")
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    build = (
        "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", build, str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = out.glob("*.whl")
    assert built.name == result.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(built) as archive:
        yield archive


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [p for p in wheel.namelist() if re.fullmatch(rf"[^/]+\.dist-info/{name}", p)]
    return wheel.read(path).decode()


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    return email.parser.Parser().parsestr(_dist_info(wheel, "METADATA"))


def test_the_wheel_carries_the_license(wheel: zipfile.ZipFile) -> None:
    assert _dist_info(wheel, "licenses/LICENSE") == (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in _dist_info(
        wheel, "licenses/LICENSE"
    )
    metadata_ = _metadata(wheel)
    assert metadata_["License-Expression"] == "Apache-2.0"
    assert metadata_.get_all("License-File") == ["LICENSE"]


def test_the_wheel_names_the_project_urls(wheel: zipfile.ZipFile) -> None:
    urls = dict(url.split(", ", 1) for url in _metadata(wheel).get_all("Project-URL"))
    assert sorted(urls) == ["Documentation", "Homepage", "Issues", "Source"]
    source = urls["Source"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", source)
    assert urls["Homepage"] == source
    assert urls["Issues"] == f"{source}/issues"
    # the page docs/index.md in the repository
    assert urls["Documentation"] == f"{source}/blob/main/docs/index.md"
    assert (ROOT / "docs" / "index.md").is_file()


def test_the_wheel_holds_the_package_and_its_marker(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert {"torchscan/__init__.py", "torchscan/py.typed", "torchscan/onnx/_hooks.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "docs/", "benchmarks/"))]


def _imported_modules() -> dict[str, set[str]]:
    """The top-level modules torchscan's code imports, at any depth (inside functions too),
    and the files that import each."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "torchscan").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.partition(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_module_torchscan_imports_is_a_declared_dependency(wheel: zipfile.ZipFile) -> None:
    """A module of a third party that torchscan imports and pyproject.toml does not declare
    works where some other package happens to install it, and fails elsewhere."""
    declared = {
        canonicalize_name(Requirement(r).name)
        for r in _metadata(wheel).get_all("Requires-Dist")
        if Requirement(r).marker is None  # not an extra's
    }
    distributions = metadata.packages_distributions()
    imported = _imported_modules()
    assert {"torch", "numpy", "onnx", "ml_dtypes", "google", "sympy"} <= set(imported)
    undeclared = {}
    for module, files in sorted(imported.items()):
        if module in sys.stdlib_module_names or module == "torchscan":
            continue
        provided_by = {canonicalize_name(d) for d in distributions.get(module, [])}
        if not provided_by & declared:
            undeclared[module] = (sorted(provided_by), sorted(files))
    assert not undeclared, f"imported but not in pyproject.toml's dependencies: {undeclared}"


def test_every_dependency_is_pinned_within_its_range(wheel: zipfile.ZipFile) -> None:
    pins = {
        canonicalize_name(name): Version(version)
        for name, version in re.findall(
            r"^([\w.-]+)==(\S+)$", (ROOT / "constraints" / "common.txt").read_text(), re.M
        )
    }
    """The dependencies and the test and lint tools (not the benchmarks' plots)."""
    for line in _metadata(wheel).get_all("Requires-Dist"):
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        marker = requirement.marker
        if name == "torch":  # pinned per release: the tests above
            continue
        if marker is not None and not any(marker.evaluate({"extra": e}) for e in ("test", "lint")):
            continue
        assert name in pins, f"{requirement.name} is not pinned in constraints/common.txt"
        assert requirement.specifier.contains(pins[name]), (requirement, pins[name])
