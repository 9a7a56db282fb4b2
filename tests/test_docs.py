"""Every Python example in README.md and docs/ runs, the README's set-up stays true, and the
documentation site (mkdocs.yml) holds every page and every public name.

The site itself is built by ``tox -e docs`` and CI (``mkdocs build --strict``), which need the
``docs`` extra; these tests need none of it.
"""

from __future__ import annotations

import importlib.util
import inspect
import linecache
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_python_examples_run(page: Path) -> None:
    namespace: dict = {"__name__": f"docs:{page.name}"}
    for number, block in enumerate(PYTHON_BLOCK.findall(page.read_text())):
        filename = f"<{page.name}, python block {number}>"
        # the block's source where inspect finds it, as IPython keeps a notebook's cells (what
        # torchscan.autoloop reads)
        linecache.cache[filename] = (len(block), None, block.splitlines(True), filename)
        exec(compile(block, filename, "exec"), namespace)


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


def test_site_hook_generates_the_opset_table() -> None:
    from torchscan.onnx._opsets import markdown_table

    hooks = _load(ROOT / "docs" / "_hooks.py")
    start, end = "<!-- opset-table: generated -->\n", "<!-- end of opset-table -->"
    stale = f"before\n{start}| an old table |\n{end}\nafter\n"
    assert hooks.on_page_markdown(stale) == f"before\n{start}{markdown_table()}{end}\nafter\n"
    assert hooks.on_page_markdown("no table\n") == "no table\n"
    with pytest.raises(ValueError, match="end of opset-table"):
        hooks.on_page_markdown(f"{start}| a table without its end |\n")


def test_every_page_is_in_the_site_nav() -> None:
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), "a page is twice in the nav of mkdocs.yml"
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in PAGES if p.parent != ROOT)
    assert sorted(nav) == pages, "mkdocs.yml's nav and the pages under docs/ differ"


def test_reference_page_renders_every_public_name() -> None:
    import torchscan
    import torchscan.onnx
    import torchscan.theano

    modules = [torchscan, torchscan.theano, torchscan.onnx]
    page = (ROOT / "docs" / "reference.md").read_text()
    directives = re.findall(r"^::: (\S+)$", page, re.MULTILINE)
    # One section per module, in this order, opened by the module's own line: the names of the
    # module's __all__, each once, in the order that reads best.
    module_names = [module.__name__ for module in modules]
    assert [d for d in directives if d in module_names] == module_names
    assert directives[0] == module_names[0]
    sections: dict[str, list[str]] = {}
    for directive in directives:
        if directive in module_names:
            section = sections[directive] = []
        else:
            section.append(directive)
    for module in modules:
        public = [f"{module.__name__}.{name}" for name in module.__all__]
        assert sorted(sections[module.__name__]) == sorted(public), (
            f"docs/reference.md must have one '::: name' line for each name of "
            f"{module.__name__}.__all__, after '::: {module.__name__}'"
        )
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                assert obj.__doc__, f"{module.__name__}.{name} has no docstring"


def _nav_pages() -> list[str]:
    """The pages in the nav of mkdocs.yml (read without a YAML parser, which the tests lack)."""
    config = (ROOT / "mkdocs.yml").read_text()
    nav = re.split(r"\n(?=\S)", config.split("\nnav:\n", 1)[1], maxsplit=1)[0]
    return re.findall(r"^\s*- (?:[^\n]*: )?(\S+\.md)$", nav, re.MULTILINE)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the checks of the built site (docs/_check_site.py, run by .ci/run after mkdocs build) -------

_RETURNS = """<h3 id="torchscan.f" class="doc doc-heading">f</h3>
<div class="doc doc-object doc-function"><div class="doc-signature highlight">f()</div>
<p><span class="doc-section-title">Returns:</span></p>
    <table><thead><tr><th>Type</th></tr></thead><tbody>
{rows}</tbody></table></div>"""
_ROW = '<tr class="doc-section-item"><td><code>Carry</code></td><td>text</td></tr>\n'


def _site(tmp_path: Path, reference: str, page: str = "<p>text</p>") -> Path:
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "index.html").write_text(reference)
    (tmp_path / "index.html").write_text(page)
    return tmp_path


def test_the_site_check_passes_a_reference_that_reads_right(tmp_path: Path) -> None:
    check = _load(ROOT / "docs" / "_check_site.py")
    site = _site(tmp_path, _RETURNS.format(rows=_ROW))
    assert check.problems(site, ["torchscan.f"]) == []


@pytest.mark.parametrize(
    ("reference", "page", "public", "problem"),
    [
        (_RETURNS.format(rows=_ROW * 3), "", "torchscan.f", "torchscan.f: Returns shows [3] rows"),
        (_RETURNS.format(rows=_ROW), "", "torchscan.g", "torchscan.g is not documented"),
        (
            _RETURNS.format(rows=_ROW).replace(
                "f()</div>", "f()</div>" + '<div class="doc-signature highlight">f(x)</div>'
            ),
            "",
            "torchscan.f",
            "torchscan.f shows 2 signatures",
        ),
        (
            _RETURNS.format(rows=_ROW),
            "<p>Example:</p><pre><code>```pycon\n&gt;&gt;&gt; 1\n```</code></pre>",
            "torchscan.f",
            "index.html: a code fence shown as text: ```pycon",
        ),
    ],
    ids=["returns-rows", "missing-object", "overloads", "literal-fence"],
)
def test_the_site_check_finds_each_defect(
    tmp_path: Path, reference: str, page: str, public: str, problem: str
) -> None:
    check = _load(ROOT / "docs" / "_check_site.py")
    site = _site(tmp_path, reference, page or "<p>text</p>")
    assert any(problem in found for found in check.problems(site, [public]))


# -- figures that say when they were measured -------------------------------------------------

DATED = re.compile(r"[Mm]easured on \d{4}-\d{2}-\d{2}")
PAGES_OF_FIGURES = sorted((ROOT / "docs" / "benchmarks").rglob("*.md"))


@pytest.mark.parametrize("page", PAGES_OF_FIGURES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_of_figures_says_when_they_were_measured(page: Path) -> None:
    intro = page.read_text().split("\n## ", 1)[0]
    assert DATED.search(intro), f"{page}: no 'Measured on YYYY-MM-DD' before its first section"


@pytest.mark.parametrize("page", ["docs/benchmarks.md", "README.md"])
def test_every_table_of_figures_says_when_it_was_measured(page: str) -> None:
    """A table of figures (one with a column of numbers aligned right) has a date in its
    section, or in the section that holds it."""
    lines = (ROOT / page).read_text().splitlines()
    for number, line in enumerate(lines):
        if not (line.startswith("| ---") and "---:" in line):
            continue
        text, level = [], 7
        for previous in reversed(lines[:number]):
            heading = re.match(r"(#+) ", previous)
            if heading and len(heading[1]) < level:
                level = len(heading[1])
                if level <= 2:
                    break
            text.append(previous)
        assert DATED.search("\n".join(text)), f"{page}:{number + 1}: a table without a date"


def test_the_site_keeps_code_lines_and_knows_its_address() -> None:
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert "pre-wrap" not in css  # code scrolls sideways; wrapped, signatures and reports break
    assert re.search(r"white-space:\s*pre;", css)
    assert re.search(r"^site_url: https://\S+/$", (ROOT / "mkdocs.yml").read_text(), re.M)
