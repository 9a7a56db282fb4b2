"""The supported torch releases are the same everywhere they are named: pyproject.toml's range,
the pins in constraints.txt and constraints/, the tox environments, CI and the README."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
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
