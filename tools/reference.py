"""Write docs/reference.md from the docstrings of torchscan's public API.

Run ``python tools/reference.py`` after changing a public docstring; a test fails while the page
and the docstrings disagree.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torchscan
import torchscan.onnx
import torchscan.theano

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"
MODULES = [torchscan, torchscan.theano, torchscan.onnx]


def render() -> str:
    parts = [
        "# API reference",
        "",
        "Generated from the docstrings by `python tools/reference.py`; do not edit by hand.",
    ]
    for module in MODULES:
        parts += ["", f"## `{module.__name__}`", "", inspect.getdoc(module) or ""]
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            signature = _signature(obj)
            parts += ["", f"### `{module.__name__}.{name}{signature}`", "", _doc(obj)]
    return "\n".join(parts).rstrip() + "\n"


def _signature(obj: object) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def _doc(obj: object) -> str:
    """A docstring as Markdown: literal blocks (after ``::``) and tables become fenced text."""
    out: list[str] = []
    in_block = table_borders = 0
    for line in (inspect.getdoc(obj) or "").splitlines():
        if table_borders or line.startswith("===="):
            if not table_borders:
                out.append("```")
            out.append(line)
            table_borders += line.startswith("====")
            if table_borders == 3:
                out.append("```")
                table_borders = 0
            continue
        if line.endswith("::"):
            out += [line[:-1], "```"]
            in_block = True
            continue
        if in_block and line and not line.startswith("    "):
            out += ["```", ""]
            in_block = False
        if in_block and not line and out[-1] == "```":
            continue  # the blank line that opens a literal block
        out.append(line[4:] if in_block else line)
    if in_block:
        out.append("```")
    return "\n".join(out)


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
