"""The names a function's statements read and assign (what a loop's carries are found from, by
liveness), and the calls of a builtin by name."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence

_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def names_loaded(nodes: Iterable[ast.AST]) -> set[str]:
    """Every name read in ``nodes``, also inside nested functions and comprehensions (which read
    the enclosing function's variables when they run)."""
    found = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                found.add(sub.id)
    return found


def _stored(target: ast.AST) -> set[str]:
    """The names an assignment target binds."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_stored(t) for t in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _stored(target.value)
    return set()  # attributes and subscripts bind no name


def names_assigned(stmts: Sequence[ast.stmt]) -> set[str]:
    """Every name the statements bind in their own scope (not inside nested functions or
    comprehensions, whose names are their own; walrus targets included)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
            return
        if isinstance(node, (ast.Lambda, *_COMPREHENSIONS)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.NamedExpr):
                    found.update(_stored(sub.target))
            return
        if isinstance(node, ast.Assign):
            for target in node.targets:
                found.update(_stored(target))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
            found.update(_stored(node.target))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    found.update(_stored(item.optional_vars))
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                found.add((alias.asname or alias.name).split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in stmts:
        visit(stmt)
    return found


def exposed_reads(stmts: Sequence[ast.stmt], defined: frozenset[str] = frozenset()) -> set[str]:
    """The names read by ``stmts`` before they are surely assigned in them (in order, a branch
    assigning a name only where both branches do, a loop's body maybe not at all)."""
    exposed: set[str] = set()
    _exposed_block(stmts, set(defined), exposed)
    return exposed


def surely_assigned(stmts: Sequence[ast.stmt]) -> set[str]:
    """The names that ``stmts`` bind on every path through them."""
    defined: set[str] = set()
    _exposed_block(stmts, defined, set())
    return defined


def _exposed_block(stmts: Sequence[ast.stmt], defined: set[str], exposed: set[str]) -> None:
    for stmt in stmts:
        _exposed_stmt(stmt, defined, exposed)


def _reads(node: ast.AST | None, defined: set[str], exposed: set[str]) -> None:
    if node is not None:
        exposed.update(names_loaded([node]) - defined)


def _exposed_stmt(stmt: ast.stmt, defined: set[str], exposed: set[str]) -> None:
    if isinstance(stmt, ast.Assign):
        _reads(stmt.value, defined, exposed)
        for target in stmt.targets:
            _reads(target, defined, exposed)  # (subscripts and attributes read their base)
            defined.update(_stored(target))
    elif isinstance(stmt, ast.AugAssign):
        _reads(stmt.value, defined, exposed)
        exposed.update(_stored(stmt.target) - defined)  # read, then written
        _reads(stmt.target, defined, exposed)
        defined.update(_stored(stmt.target))
    elif isinstance(stmt, ast.AnnAssign):
        _reads(stmt.value, defined, exposed)
        if stmt.value is not None:
            defined.update(_stored(stmt.target))
    elif isinstance(stmt, ast.If):
        _reads(stmt.test, defined, exposed)
        then, other = set(defined), set(defined)
        _exposed_block(stmt.body, then, exposed)
        _exposed_block(stmt.orelse, other, exposed)
        defined.update(then & other)
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        _reads(stmt.iter, defined, exposed)
        inner = set(defined) | _stored(stmt.target)
        _exposed_block(stmt.body, inner, exposed)
        _exposed_block(stmt.orelse, set(defined), exposed)
    elif isinstance(stmt, ast.While):
        _reads(stmt.test, defined, exposed)
        _exposed_block(stmt.body, set(defined), exposed)
        _exposed_block(stmt.orelse, set(defined), exposed)
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        for item in stmt.items:
            _reads(item.context_expr, defined, exposed)
            if item.optional_vars is not None:
                defined.update(_stored(item.optional_vars))
        _exposed_block(stmt.body, defined, exposed)
    elif isinstance(stmt, ast.Try):
        _exposed_block(stmt.body, set(defined), exposed)
        for handler in stmt.handlers:
            _exposed_block(handler.body, set(defined), exposed)
        _exposed_block(stmt.orelse, set(defined), exposed)
        _exposed_block(stmt.finalbody, set(defined), exposed)
    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        _reads(stmt, defined, exposed)
        defined.add(stmt.name)
    else:
        _reads(stmt, defined, exposed)
        defined.update(names_assigned([stmt]))


def _call(node: ast.AST, name: str) -> ast.Call | None:
    """``node`` where it is a call of the name ``name`` without ``*args``."""
    return node if _is_call(node, name) else None  # type: ignore[return-value]


def _is_call(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == name
        and not any(isinstance(a, ast.Starred) for a in node.args)
    )
