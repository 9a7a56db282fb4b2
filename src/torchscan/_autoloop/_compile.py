"""A function converted: its source read (:func:`function_tree`), its own loops rewritten by
:mod:`._rewrite` (:func:`convert`), and the result compiled again with the user's file, lines,
globals and closure, the runtime bound as ``__autoloop__``."""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable
from typing import Any

from torchscan._autoloop import _analysis, _calls, _names, _runtime
from torchscan._autoloop._rewrite import (
    LOOPS,
    RUNTIME,
    NotConvertible,
    _Calls,
    _Loops,
    _no_type_params,
)
from torchscan._errors import TorchscanTypeError


def _find_code(code: types.CodeType, name: str, line: int) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name and const.co_firstlineno == line:
                return const
            found = _find_code(const, name, line)
            if found is not None:
                return found
    return None


def function_tree(fn: types.FunctionType) -> ast.FunctionDef:
    """The parsed source of ``fn``, its lines numbered as in its file."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError) as error:
        raise NotConvertible(f"its source is not available ({error})") from None
    try:
        module = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        raise NotConvertible("its source could not be parsed on its own") from None
    if not module.body or not isinstance(module.body[0], ast.FunctionDef):
        raise NotConvertible("it is not defined by a `def` statement (a lambda?)")
    ast.increment_lineno(module, fn.__code__.co_firstlineno - 1)
    tree = module.body[0]
    if tree.name != fn.__name__:
        raise NotConvertible("its source defines another name")
    return tree


def convert(
    fn: types.FunctionType, strict: bool
) -> tuple[Callable[..., Any], list[_runtime.Loop], str]:
    """The converted function, a record per ``for`` statement, the converted source."""
    if fn.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE):
        raise NotConvertible("it is a generator or a coroutine")
    tree = function_tree(fn)
    filename = fn.__code__.co_filename
    sized = _analysis.sized_names(tree)
    shadowed = _shadowed(fn, tree)
    infos = {id(node): _analysis.analyse(tree, node, sized, shadowed) for node in own_loops(tree)}
    loops: list[_runtime.Loop] = []
    if not infos:
        return fn, loops, ast.unparse(tree)
    if strict:
        for info in infos.values():
            if info.reason and info.form.kind == "range" and info.form.sized:
                raise TorchscanTypeError(
                    f"{_runtime.API}: the loop of {fn.__qualname__} ({filename}, line "
                    f"{info.node.lineno}) stays Python: {info.reason}"
                )
    tree.decorator_list = []
    transformer = _Loops(infos, loops, fn.__qualname__, filename, strict, shadowed)
    tree.body = [s for stmt in tree.body for s in _as_list(transformer.visit(stmt))]
    if transformer.converted:
        tree = _Calls(shadowed).visit(tree)
    _strip_signature(tree)
    source = ast.unparse(tree)
    code = _compile(fn, tree)
    closure = _closure(fn, code, loops)
    new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    new.__annotations__ = dict(fn.__annotations__)
    return new, loops, source


_REWRITTEN = ("range", "reversed", "enumerate", "zip", "len", "list", "torch")


def _shadowed(fn: types.FunctionType, tree: ast.FunctionDef) -> set[str]:
    """The names among those the rewrite replaces (builtins, ``torch``) that ``fn`` binds to
    something else: a local, a free variable, a global of its module."""
    import builtins

    import torch

    parameters = {a.arg for a in ast.walk(tree.args) if isinstance(a, ast.arg)}
    local = _names.names_assigned(tree.body) | parameters
    found = {n for n in _REWRITTEN if n in local or n in fn.__code__.co_freevars}
    for name in _REWRITTEN:
        if name in fn.__globals__:
            expected = torch if name == "torch" else getattr(builtins, name)
            if fn.__globals__[name] is not expected:
                found.add(name)
    return found


def _as_list(result: Any) -> list[ast.stmt]:
    return result if isinstance(result, list) else [result]


def own_loops(tree: ast.FunctionDef) -> list[ast.For | ast.While]:
    found: list[ast.For | ast.While] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.For, ast.While)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def _strip_signature(tree: ast.FunctionDef) -> None:
    """Defaults and annotations, which the new function takes from the original instead of
    evaluating them again."""
    args = tree.args
    args.defaults, args.kw_defaults = [], [None] * len(args.kwonlyargs)
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    tree.returns = None


def _compile(fn: types.FunctionType, tree: ast.FunctionDef) -> types.CodeType:
    line = tree.lineno
    holder: ast.stmt = tree
    owner = _owner_class(fn)
    if owner is not None:  # private names mangled as in the class
        holder = ast.ClassDef(name=owner, bases=[], keywords=[], body=[tree], decorator_list=[])
        _no_type_params(holder)
    factory = ast.FunctionDef(
        name="__autoloop_factory__",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(n) for n in (RUNTIME, LOOPS, *fn.__code__.co_freevars)],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[holder, ast.Return(ast.Constant(None))],
        decorator_list=[],
        returns=None,
    )
    _no_type_params(factory)
    module = ast.Module(body=[factory], type_ignores=[])
    for node in (factory, holder):
        ast.copy_location(node, tree)
    ast.fix_missing_locations(module)
    compiled = compile(module, fn.__code__.co_filename, "exec", dont_inherit=True)
    code = _find_code(compiled, fn.__name__, line)
    if code is None:  # pragma: no cover - the factory always holds it
        raise NotConvertible("its converted code could not be found")
    return code


def _owner_class(fn: types.FunctionType) -> str | None:
    parts = fn.__qualname__.split(".")
    if len(parts) >= 2 and parts[-2] != "<locals>":
        return parts[-2]
    return None


def _closure(
    fn: types.FunctionType, code: types.CodeType, loops: list[_runtime.Loop]
) -> tuple[types.CellType, ...]:
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    cells[RUNTIME] = types.CellType(_calls)
    cells[LOOPS] = types.CellType(tuple(loops))
    missing = [n for n in code.co_freevars if n not in cells]
    if missing:  # pragma: no cover - the factory's parameters are the only free names
        raise NotConvertible(f"free names {missing} have no cell")
    return tuple(cells[n] for n in code.co_freevars)
