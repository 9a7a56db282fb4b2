"""A griffe extension (mkdocs.yml, mkdocstrings' ``extensions``) that renders the reST of
torchscan's docstrings in Markdown, so that the docstrings stay as they are in the code.

torchscan's docstrings have Google-style sections and a few reST forms that Markdown lacks:

- cross-references, ``:func:`until```, ``:class:`~torchscan.TorchscanError```: they become
  links to the object on the API reference page, resolved in the scope of the docstring's
  object; a name that does not resolve there is a warning, so ``mkdocs build --strict`` fails;
- literal blocks, a paragraph ending in ``::`` and an indented block: a fenced block (Python
  where the block parses as Python);
- simple tables, rows between lines of ``====  ====``: a Markdown table;
- doctest blocks, lines from ``>>>`` to a blank line: a fenced ``pycon`` block.

Text between double backquotes is already code in Markdown.
"""

from __future__ import annotations

import ast
import re
import textwrap
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|exc|attr|data|mod|obj):`(~?)([\w.]+)`")
TABLE_BORDER = re.compile(r"^\s*=+(?: +=+)+\s*$")
logger = griffe.get_logger("torchscan.docs")


class RestDocstrings(griffe.Extension):
    """Rewrite the docstrings of the public API once its package is loaded (names resolve then):
    the public modules, the names in their ``__all__`` and the public members of those."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        done: set[str] = set()
        for module in _public_modules(pkg):
            _rewrite(module, loader, done)
            for name in module.exports or ():
                _rewrite(module[str(name)], loader, done)


def _public_modules(module: griffe.Module) -> list[griffe.Module]:
    found = [module]
    for name, member in module.members.items():
        if not member.is_alias and member.is_module and not name.startswith("_"):
            found += _public_modules(member)
    return found


def _rewrite(
    obj: griffe.Object | griffe.Alias, loader: griffe.GriffeLoader, done: set[str]
) -> None:
    if obj.is_alias:
        obj = obj.final_target
    if obj.path in done:
        return
    done.add(obj.path)
    if obj.docstring is not None:
        text = _doctests(_tables(_literal_blocks(obj.docstring.value)))
        scope = obj.parent if obj.is_attribute and obj.parent is not None else obj
        obj.docstring.value = ROLE.sub(lambda m: _link(m, scope, loader), text)
    if obj.is_class:
        for name, member in obj.members.items():
            if not name.startswith("_") and not member.is_alias:
                _rewrite(member, loader, done)


def _link(match: re.Match[str], scope: griffe.Object, loader: griffe.GriffeLoader) -> str:
    short, target = match.group(1), match.group(2)
    text = target.rsplit(".", 1)[-1] if short else target
    first, _, rest = target.partition(".")
    try:
        path = scope.resolve(first)
    except griffe.NameResolutionError:
        if first not in loader.modules_collection:
            location = f"{scope.relative_filepath}:{scope.lineno}"
            logger.warning("%s: %s does not resolve in %s", location, match.group(0), scope.path)
            return f"`{text}`"
        path = first
    return f"[`{text}`][{path}{'.' + rest if rest else ''}]"


def _literal_blocks(text: str) -> str:
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.rstrip().endswith("::"):
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip())
        paragraph = line.rstrip()[:-2].rstrip()
        if paragraph.strip():
            out.append(paragraph + (":" if not line.rstrip().endswith(" ::") else ""))
        block: list[str] = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
        ):
            block.append(lines[i])
            i += 1
        code = textwrap.dedent("\n".join(block)).strip("\n")
        fence = " " * indent + "```" + ("python" if _is_python(code) else "")
        body = textwrap.indent(code, " " * indent).splitlines()
        out += ["", fence, *body, " " * indent + "```", ""]
    return "\n".join(out)


def _doctests(text: str) -> str:
    out: list[str] = []
    in_fence = in_doctest = False
    fence = ""
    for line in text.splitlines():
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if in_doctest and not stripped:
            out += [fence, ""]
            in_doctest = False
        elif not in_doctest and stripped.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and not in_doctest and stripped.startswith(">>>"):
            fence = indent + "```"
            # a blank line before the fence, except right under a section's title ("Example:"),
            # which must be followed by its content to be read as a section
            if out and out[-1].strip() and not out[-1].rstrip().endswith(":"):
                out.append("")
            out.append(fence + "pycon")
            in_doctest = True
        out.append(line)
    if in_doctest:
        out.append(fence)
    return "\n".join(out)


def _is_python(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def _tables(text: str) -> str:
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not TABLE_BORDER.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        border = lines[i]
        starts = [m.start() for m in re.finditer(r"=+", border)]
        indent = " " * starts[0]
        rows: list[list[str]] = []
        borders = 1
        i += 1
        while i < len(lines) and borders < 3:
            if TABLE_BORDER.match(lines[i]):
                borders += 1
            elif lines[i].strip():
                bounds = [*starts[1:], None]
                rows.append([lines[i][a:b].strip() for a, b in zip(starts, bounds, strict=True)])
            i += 1
        header, *body = rows
        table = [header, ["---"] * len(header), *body]
        out += ["", *(indent + "| " + " | ".join(row) + " |" for row in table), ""]
    return "\n".join(out)
