"""Checks of the built documentation site, as a reader sees it (``.ci/run`` runs it after
``mkdocs build``): ``python docs/_check_site.py SITE_DIR``.

The API reference (``reference/index.html``) must show every public object of ``torchscan``,
``torchscan.onnx`` and ``torchscan.theano``; each function one signature (not its overloads);
each "Returns" section one row (a docstring's continuation lines are not rows of their own); no
code fence as literal text. Every page: no code fence as literal text. Prints each problem and
exits 1 if there is one.
"""

from __future__ import annotations

import html
import re
import sys
from html.parser import HTMLParser
from pathlib import Path


class _Text(HTMLParser):
    """The text a reader sees, code blocks included."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("p", "pre", "code", "div", "li", "td", "th", "h1", "h2", "h3", "h4"):
            self.parts.append("\n")  # a block starts a line of its own

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def literal_fences(page: str) -> list[str]:
    """Lines that start with a Markdown code fence, in running text or inside a code block: a
    code block that was not rendered as one, or rendered with its fences."""
    parser = _Text()
    parser.feed(page)
    text = "".join(parser.parts)
    return [line.strip() for line in text.splitlines() if line.lstrip().startswith("```")]


def _object_sections(page: str) -> dict[str, str]:
    """The HTML of each documented object of the reference, by its identifier (the ``id`` of its
    heading), up to the next object's heading."""
    starts = [
        (m.start(), m.group(1))
        for m in re.finditer(r'<h[2-6] id="(torchscan[\w.]*)" class="doc doc-heading', page)
    ]
    return {
        name: page[start : (starts[i + 1][0] if i + 1 < len(starts) else len(page))]
        for i, (start, name) in enumerate(starts)
    }


def returns_rows(section: str) -> list[int]:
    """The number of rows of each "Returns" table of one object (its own, not those of the
    objects nested in it)."""
    counts = []
    for table in re.finditer(
        r'<span class="doc-section-title">Returns:</span>(?:</p>)?\s*<table>(.*?)</table>',
        section,
        re.S,
    ):
        counts.append(len(re.findall(r'<tr class="doc-section-item">', table.group(1))))
    return counts


def signatures(section: str) -> int:
    """The number of signatures shown for one object (its overloads would be more than one)."""
    heading_end = section.find("</h")
    body = section[heading_end:]
    nested = re.search(r'<h[2-6] id="torchscan', body)
    own = body[: nested.start()] if nested else body
    return len(re.findall(r'class="doc-signature highlight"', own))


def problems(site: Path, public: list[str]) -> list[str]:
    found = []
    reference = (site / "reference" / "index.html").read_text()
    sections = _object_sections(reference)
    for name in public:
        if name not in sections:
            found.append(f"reference: {name} is not documented")
    for name, section in sections.items():
        rows = returns_rows(section)
        if any(count != 1 for count in rows):
            found.append(f"reference: {name}: Returns shows {rows} rows, not one")
        if "doc-function" in section[:400] and signatures(section) > 1:
            found.append(f"reference: {name} shows {signatures(section)} signatures")
    for page in sorted(site.rglob("*.html")):
        for line in literal_fences(page.read_text()):
            found.append(f"{page.relative_to(site)}: a code fence shown as text: {line[:80]}")
    return found


def public_names() -> list[str]:
    import torchscan
    import torchscan.onnx
    import torchscan.theano

    return [
        f"{module.__name__}.{name}"
        for module in (torchscan, torchscan.onnx, torchscan.theano)
        for name in module.__all__
    ]


def main() -> None:
    site = Path(sys.argv[1])
    found = problems(site, public_names())
    for problem in found:
        print(html.unescape(problem))
    print(f"{len(found)} problem(s) in the site at {site}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
