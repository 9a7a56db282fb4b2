"""Build-time hooks of the documentation site (``hooks:`` in mkdocs.yml).

The opset table of the export guide is generated from torchscan's version table
(``torchscan.onnx._opsets``) whenever the site is built, between the markers that hold it in
docs/export.md; tests/test_docs.py keeps the copy in that file, which GitHub shows, current.
"""

from __future__ import annotations

import re
from typing import Any

from torchscan.onnx._opsets import markdown_table

START = "<!-- opset-table"
END = "<!-- end of opset-table -->"
OPSET_TABLE = re.compile(rf"({re.escape(START)}.*?-->\n).*?({re.escape(END)})", re.DOTALL)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Put the generated opset table between its markers."""
    if START not in markdown:
        return markdown
    markdown, found = OPSET_TABLE.subn(lambda m: m[1] + markdown_table() + m[2], markdown)
    if found != markdown.count(START):
        raise ValueError(f"an opset-table marker without {END!r} after it")
    return markdown
