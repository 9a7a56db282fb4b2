"""Every Python example in README.md and docs/ runs, and the README's set-up stays true."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_python_examples_run(page: Path) -> None:
    namespace: dict = {"__name__": f"docs:{page.name}"}
    for number, block in enumerate(PYTHON_BLOCK.findall(page.read_text())):
        code = compile(block, f"{page.name} (python block {number})", "exec")
        exec(code, namespace)


def test_readme_has_exactly_two_setup_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^```bash\n(.*?)\n```", setup, re.DOTALL | re.MULTILINE)
    assert len(commands) == 2
    assert all("\n" not in command for command in commands)
    install_and_example, tests = commands
    assert "examples/" in install_and_example
    assert "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in ci  # .ci/run reads the test command from the README


def test_export_page_has_the_current_opset_table() -> None:
    from torchscan.onnx._opsets import markdown_table

    page = (ROOT / "docs" / "export.md").read_text()
    generated = page.split("<!-- opset-table", 1)[1].split("-->", 1)[1]
    generated = generated.split("<!-- end of opset-table -->", 1)[0]
    assert generated.strip() == markdown_table().strip()


def test_reference_page_matches_the_docstrings() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("reference", ROOT / "tools" / "reference.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    assert (ROOT / "docs" / "reference.md").read_text() == reference.render(), (
        "docs/reference.md is out of date: run python tools/reference.py"
    )
