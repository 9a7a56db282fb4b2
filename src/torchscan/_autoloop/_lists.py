"""The lists a loop appends to at every step (which become a scan's outputs), the values it
appends, and the lists made fresh before the loop, untouched between there and the loop."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence

from torchscan._autoloop._names import _is_call, names_assigned, names_loaded


def appended_lists(body: Sequence[ast.stmt]) -> dict[str, ast.stmt]:
    """The lists the body appends one value to at every step: ``name.append(value)``, ``name
    += [value]`` or ``name.insert(0, value)`` as a statement of the body itself (not under an
    ``if``), once per list."""
    found: dict[str, ast.stmt] = {}
    twice = set()
    for stmt in body:
        name = _appended(stmt)
        if name is not None:
            if name in found:
                twice.add(name)
            found[name] = stmt
    return {n: s for n, s in found.items() if n not in twice}


def _appended(stmt: ast.stmt) -> str | None:
    if (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "append"
        and isinstance(stmt.value.func.value, ast.Name)
        and len(stmt.value.args) == 1
        and not stmt.value.keywords
        and not isinstance(stmt.value.args[0], ast.Starred)
    ):
        return stmt.value.func.value.id
    if (
        isinstance(stmt, ast.AugAssign)
        and isinstance(stmt.op, ast.Add)
        and isinstance(stmt.target, ast.Name)
        and isinstance(stmt.value, ast.List)
        and len(stmt.value.elts) == 1
        and not isinstance(stmt.value.elts[0], ast.Starred)
    ):
        return stmt.target.id
    if prepends(stmt):
        assert isinstance(stmt, ast.Expr)
        assert isinstance(stmt.value, ast.Call)
        assert isinstance(stmt.value.func, ast.Attribute)
        assert isinstance(stmt.value.func.value, ast.Name)
        return stmt.value.func.value.id
    return None


def prepends(stmt: ast.stmt) -> bool:
    """Whether ``stmt`` is ``name.insert(0, value)``: a list filled from the front."""
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "insert"
        and isinstance(stmt.value.func.value, ast.Name)
        and len(stmt.value.args) == 2
        and not stmt.value.keywords
        and isinstance(stmt.value.args[0], ast.Constant)
        and stmt.value.args[0].value == 0
        and type(stmt.value.args[0].value) is int
        and not isinstance(stmt.value.args[1], ast.Starred)
    )


def appended_value(stmt: ast.stmt) -> ast.expr:
    """The value an append statement of :func:`appended_lists` appends (or inserts at the
    front)."""
    if isinstance(stmt, ast.Expr):
        assert isinstance(stmt.value, ast.Call)
        return stmt.value.args[-1]
    assert isinstance(stmt, ast.AugAssign)
    assert isinstance(stmt.value, ast.List)
    return stmt.value.elts[0]


def fresh_lists(
    function: ast.FunctionDef, loop: ast.For | ast.While, names: Iterable[str]
) -> set[str]:
    """Those of ``names`` that the function binds to a new list (``name = []``, ``list()`` or
    ``[y0]``: the values the loop appends come after those) before the loop, in the loop's own
    block or one enclosing it, and reads nowhere between that and the loop: lists no one else
    holds."""
    found = set()
    for name in names:
        binding = _last_binding_before(function.body, loop, name)
        if binding is not None and _empty_list(binding):
            found.add(name)
    return found


def _empty_list(node: ast.expr) -> bool:
    """Whether ``node`` makes a new list: ``[]``, ``list()``, a literal ``[a, b]``, or
    TorchScript's ``torch.jit.annotate(List[Tensor], [])``."""
    if isinstance(node, ast.List):
        return not any(isinstance(e, ast.Starred) for e in node.elts)
    if (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) == "torch.jit.annotate"
        and len(node.args) == 2
    ):
        return _empty_list(node.args[1])
    return _is_call(node, "list") and not node.args and not node.keywords  # type: ignore[union-attr]


def _bound_value(stmt: ast.stmt, name: str) -> ast.expr | None:
    """The value ``stmt`` binds ``name`` to, where it is ``name = value`` or ``a, name = va,
    value``."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return None
    target, value = stmt.targets[0], stmt.value
    if isinstance(target, ast.Name):
        return value if target.id == name else None
    if (
        isinstance(target, ast.Tuple)
        and isinstance(value, (ast.Tuple, ast.List))
        and len(target.elts) == len(value.elts)
    ):
        for t, v in zip(target.elts, value.elts, strict=True):
            if isinstance(t, ast.Name) and t.id == name:
                return v
    return None


def _writes_into(stmt: ast.stmt, name: str) -> bool:
    """Whether ``stmt`` is ``name[...] = value`` (or ``+=``...) with ``name`` read nowhere else
    in it: a write that makes no other reference to ``name``'s tensor."""
    if isinstance(stmt, ast.Assign):
        targets, value = stmt.targets, stmt.value
    elif isinstance(stmt, ast.AugAssign):
        targets, value = [stmt.target], stmt.value
    else:
        return False
    return all(
        isinstance(t, ast.Subscript)
        and isinstance(t.value, ast.Name)
        and t.value.id == name
        and name not in names_loaded([t.slice])
        for t in targets
    ) and name not in names_loaded([value])


def _last_binding_before(
    block: Sequence[ast.stmt], loop: ast.For | ast.While, name: str, writes: bool = False
) -> ast.expr | None:
    """The value the statement that binds ``name`` last before ``loop``, in the block holding
    ``loop`` (or a block enclosing it), binds it to, where nothing between reads or binds
    ``name`` (with ``writes``, but for writes into it at an index)."""
    binding: ast.expr | None = None
    for stmt in block:
        if stmt is loop:
            return binding
        inner = _enclosing_block(stmt, loop)
        if inner is not None:
            found = _last_binding_before(inner, loop, name, writes)
            if found is not None:
                return found
            # bound before the statement enclosing the loop, and not touched in it before (in
            # a loop enclosing it, not after it either: that runs before its next run)
            if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)) and not _untouched_around(
                stmt, inner, loop, name, writes
            ):
                return None
            return binding if _untouched_before(inner, loop, name, writes) else None
        value = _bound_value(stmt, name)
        if value is not None:
            binding = value
        elif writes and _writes_into(stmt, name):
            pass
        elif name in names_loaded([stmt]) | names_assigned([stmt]):
            binding = None
    return None


def _enclosing_block(stmt: ast.stmt, loop: ast.For | ast.While) -> list[ast.stmt] | None:
    """The block of ``stmt`` (one of its bodies) that holds ``loop``, if any."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(stmt, field, None)
        if isinstance(block, list) and any(loop is n for s in block for n in ast.walk(s)):
            return block
    for handler in getattr(stmt, "handlers", ()):
        if any(loop is n for s in handler.body for n in ast.walk(s)):
            return handler.body
    return None


def _untouched_around(
    enclosing: ast.For | ast.AsyncFor | ast.While,
    block: Sequence[ast.stmt],
    loop: ast.For | ast.While,
    name: str,
    writes: bool,
) -> bool:
    """Whether the statements of ``block``, the body of a loop ``enclosing`` the loop ``loop``,
    after ``loop`` (and the enclosing loop's test) leave ``name`` alone: they run between one
    run of ``loop`` and the next."""
    test = enclosing.test if isinstance(enclosing, ast.While) else None
    if test is not None and name in names_loaded([test]):
        return False
    after = False
    for stmt in block:
        if any(loop is n for n in ast.walk(stmt)):
            after = True
            continue
        if not after or (writes and _writes_into(stmt, name)):
            continue
        if name in names_loaded([stmt]) | names_assigned([stmt]):
            return False
    return True


def _untouched_before(
    block: Sequence[ast.stmt], loop: ast.For | ast.While, name: str, writes: bool = False
) -> bool:
    for stmt in block:
        if any(loop is n for n in ast.walk(stmt)):
            return True
        if writes and _writes_into(stmt, name):
            continue
        if name in names_loaded([stmt]) | names_assigned([stmt]):
            return False
    return True


def _names_only(target: ast.expr) -> bool:
    """Whether a loop's target is a name or a (nested) tuple of names."""
    if isinstance(target, ast.Name):
        return True
    return isinstance(target, ast.Tuple) and all(_names_only(e) for e in target.elts)
