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

WHEEL_SOURCES = ["pyproject.toml", "README.md", "LICENSE", "src"]


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
    assert {
        "torchscan/__init__.py",
        "torchscan/py.typed",
        "torchscan/onnx/_export/_hooks.py",
    } <= names
    assert not [n for n in names if n.startswith(("tests/", "docs/", "benchmarks/"))]


def _imported_modules() -> dict[str, set[str]]:
    """The top-level modules torchscan's code imports, at any depth (inside functions too),
    and the files that import each."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "src" / "torchscan").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                where = str(path.relative_to(ROOT / "src"))
                found.setdefault(name.partition(".")[0], set()).add(where)
    return found


def test_every_module_torchscan_imports_is_a_declared_dependency(wheel: zipfile.ZipFile) -> None:
    """A module of a third party that torchscan imports and pyproject.toml does not declare
    works where some other package happens to install it, and fails elsewhere. Modules that
    only the ONNX side imports (``torchscan/onnx/``, and the check command) may come from the
    ``onnx`` extra; every other module from the dependencies themselves."""
    declared: dict[str, set[str]] = {"": set(), "onnx": set()}
    for line in _metadata(wheel).get_all("Requires-Dist"):
        requirement = Requirement(line)
        marker = requirement.marker
        for extra in declared:
            if (marker is None) if not extra else (marker and marker.evaluate({"extra": extra})):
                declared[extra].add(canonicalize_name(requirement.name))
    assert {"onnx", "onnxruntime", "rich", "onnx-ir"} <= declared["onnx"]
    assert not {"onnx", "onnxruntime", "rich", "onnx-ir", "onnxscript"} & declared[""]
    distributions = metadata.packages_distributions()
    imported = _imported_modules()
    assert {"torch", "numpy", "onnx", "ml_dtypes", "google", "sympy"} <= set(imported)
    undeclared = {}
    for module, files in sorted(imported.items()):
        if module in sys.stdlib_module_names or module == "torchscan":
            continue
        onnx_side = all(f.startswith("torchscan/onnx/") or f == "torchscan/_cli.py" for f in files)
        allowed = declared[""] | (declared["onnx"] if onnx_side else set())
        provided_by = {canonicalize_name(d) for d in distributions.get(module, [])}
        if not provided_by & allowed:
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
        if name == "torchscan-onnx":  # an extra that names another (test: the onnx extra)
            continue
        extras = ("onnx", "test", "lint")
        if marker is not None and not any(marker.evaluate({"extra": e}) for e in extras):
            continue
        assert name in pins, f"{requirement.name} is not pinned in constraints/common.txt"
        assert requirement.specifier.contains(pins[name]), (requirement, pins[name])


def test_the_version_is_said_once_and_the_changelog_has_it(wheel: zipfile.ZipFile) -> None:
    """``torchscan.__version__`` is the one place the version is written: the wheel's metadata
    reads it, and the changelog has a section for it."""
    import torchscan

    assert _metadata(wheel)["Version"] == torchscan.__version__
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    assert not re.search(r"^version\s*=\s*\"", pyproject, re.M)  # no literal version
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(torchscan.__version__)}\b", changelog, re.M)
