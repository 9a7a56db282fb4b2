"""``torchscan.autoloop``: the ``for`` and ``while`` loops of a function or module, run as scans."""

from __future__ import annotations

import dataclasses
import dis
import inspect
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, overload

import torch

from torchscan._autoloop import _compile, _rewrite, _runtime
from torchscan._errors import TorchscanTypeError, TorchscanWarning

__all__ = ["LoopReport", "autoloop", "autoloop_report", "autoloop_source"]

F = TypeVar("F", bound=Callable[..., Any])

_API = _runtime.API


@dataclasses.dataclass(frozen=True)
class LoopReport:
    """One ``for`` or ``while`` statement that :func:`autoloop` found.

    Attributes:
        function: the qualified name of the function that holds the loop.
        filename: the file it is written in.
        lineno: the line of its ``for`` or ``while``.
        converted: whether it runs as a scan: before the first run, whether it may; after a
            run, whether the last eager run did (runs that torch traces are not recorded).
        reason: why it stays (or last ran as) a Python loop, with the line of the construct and
            how to rewrite it; empty where it converts.
    """

    function: str
    filename: str
    lineno: int
    converted: bool
    reason: str


@overload
def autoloop(obj: F, *, strict: bool = False) -> F: ...
@overload
def autoloop(obj: None = None, *, strict: bool = False) -> Callable[[F], F]: ...


def autoloop(obj: Any = None, *, strict: bool = False) -> Any:
    """Run the ``for`` loops of a function or module that step along a tensor's axis as
    :func:`torchscan.scan`, so that the model keeps its code and exports with a dynamic length.

    What a converted loop computes is given by the loop itself::

        outs = []
        for t in range(x.shape[0]):         # or: for x_t in x, in x.unbind(1), enumerate, zip
            h = torch.tanh(x[t] @ w + h @ u)
            outs.append(h)
        ys = torch.stack(outs)

    becomes, in effect::

        def step(h, t):
            h = torch.tanh(x[t] @ w + h @ u)
            return h, h
        h, ys = torchscan.scan(step, h, torch.arange(x.shape[0]))

    The names the body assigns and reads before assigning them, or that are read after the
    loop, are its carry; the lists it appends one value to at every step (``outs.append(y)``
    or ``outs += [y]``, on a list made empty before the loop) are its outputs, stacked by the
    scan, and ``torch.stack``, ``torch.cat``, ``reversed`` and ``list`` of them after the loop
    use the stacked outputs as they are.

    Unlike rewriting the loop by hand, nothing about the loop changes where it does not step
    along a tensor's axis: which loops run as scans is decided at every run from the values
    the loop is given, as TensorFlow's AutoGraph decides. A ``range`` whose bounds come from a
    tensor's size (``x.shape[0]``, ``x.size(1)``, ``len(x)``, or a name assigned from one),
    a tensor's rows (also through ``unbind``, ``split(1, d)``, ``enumerate`` and ``zip``) and a
    ``while`` on a tensor are time loops; a range of Python numbers with no ``if condition:
    break``, an ``nn.ModuleList`` or a list stay Python loops. A carry that is ``None``, a
    Python number or unbound before the loop is made by the first step, run as Python, and the
    scan runs the others. An ``if condition: break`` of the body ends the scan as
    :func:`torchscan.until` does, an ``if condition: continue`` the step; a tensor made before
    the loop and written at the step number (``out[:, t] = h``) gets the scan's outputs, or is
    carried whole where the body reads it; ``h += x`` on a carry changes the tensor the loop
    started from, after the scan; tests of the step number (``if t == 0:``) run the first and
    last steps as Python. A loop also runs as
    Python, with the reason in :func:`autoloop_report`, where a carry is still not a tensor (or
    a pytree of tensors) after its first step, or where :func:`torchscan.scan` refuses its
    step; a loop whose body has a ``return``, another ``break`` or ``continue``, sets
    attributes, writes into tensors at other indices or draws Python random numbers is never
    converted, since its meaning as a scan could differ. In a run that torch traces
    (``torch.export``, ``torch.onnx.export``), a converted loop is one loop operator of dynamic
    length; its lists can then only be stacked or concatenated, and a loop that stays Python
    over a dynamic length is refused with a :class:`torchscan.ExportError` rather than
    unrolled. Eagerly, where nothing traces or transforms the call, a converted ``while`` and a
    converted ``for`` of fewer than 32 steps run as written, where a scan would only add its
    fixed cost (a ``for`` run so leaves the report as it was).

    Args:
        obj: a function (returns the converted function), a method, or an ``nn.Module``
            (converts, in place, the methods with ``for`` or ``while`` loops of the module and
            of its submodules, defined in their classes but not in torch's, and returns the
            module).
            Without ``obj``, a decorator.
        strict: raise a ``TypeError`` for a loop that steps along a tensor's axis and cannot be
            converted (at conversion where its header shows it, else when it runs), rather than
            keeping it as Python.

    Returns:
        The converted function or method, or the module.

    A function whose source cannot be read (defined by ``exec`` or at the interactive prompt)
    is left as it is, with a :class:`torchscan.TorchscanWarning`.

    Raises:
        TypeError: ``obj`` is none of the above, or, with ``strict``, a time loop stays Python
            or a function's source cannot be read.
    """
    if obj is None:
        return lambda f: autoloop(f, strict=strict)
    if isinstance(obj, torch.nn.Module):
        _convert_module(obj, strict)
        return obj
    if isinstance(obj, types.MethodType):
        return types.MethodType(_convert_function(obj.__func__, strict), obj.__self__)
    if isinstance(obj, types.FunctionType):
        return _convert_function(obj, strict)
    raise TorchscanTypeError(
        f"{_API}: expected a function, a method or an nn.Module, got {type(obj).__name__}"
    )


def _convert_function(
    fn: types.FunctionType, strict: bool, stacklevel: int = 3
) -> Callable[..., Any]:
    if getattr(fn, "__autoloop_original__", None) is not None:
        return fn  # converted already
    try:
        new, loops, source = _compile.convert(fn, strict)
    except _rewrite.NotConvertible as error:
        message = f"{_API}: {fn.__qualname__} cannot be converted: {error}"
        if strict:
            raise TorchscanTypeError(message) from None
        warnings.warn(
            message + "; its loops stay as they are", TorchscanWarning, stacklevel=stacklevel
        )
        return fn
    if new is not fn:
        new.__autoloop_original__ = fn  # type: ignore[attr-defined]
        new.__autoloop_source__ = source  # type: ignore[attr-defined]
        new.__autoloop_loops__ = loops  # type: ignore[attr-defined]
    return new


def _convert_module(module: torch.nn.Module, strict: bool) -> None:
    for sub in module.modules():
        for cls in type(sub).__mro__:
            if cls.__module__.startswith("torch.") or cls is object:
                continue
            for name, value in vars(cls).items():
                if name in sub.__dict__:
                    continue
                if name.startswith("__") and name.endswith("__") and name != "__call__":
                    continue
                converted = _convert_member(sub, cls, name, value, strict)
                if converted is not None:
                    object.__setattr__(sub, name, converted)


def _convert_member(module: torch.nn.Module, cls: type, name: str, value: Any, strict: bool) -> Any:
    """What replaces the attribute ``name`` of ``module`` (``value`` in ``cls``): its method,
    static method or class method converted, or None where it has no loop. A function wrapped by
    a decorator (``@torch.no_grad()``) is converted where the wrapper holds it in its closure,
    and wrapped again; else its loops are reported as kept."""
    kind = "method"
    if isinstance(value, (staticmethod, classmethod)):
        kind = "static" if isinstance(value, staticmethod) else "class"
        value = value.__func__
    if not isinstance(value, types.FunctionType):
        return None
    inner = inspect.unwrap(value)
    if not isinstance(inner, types.FunctionType) or not _has_loop(inner):
        return None
    converted = _convert_function(inner, strict, stacklevel=5)
    if converted is inner:
        return None
    if inner is not value:
        rewrapped = _rewrapped(value, inner, converted)
        if rewrapped is None:
            _keep_wrapped(module, inner, strict)
            return None
        converted = rewrapped
    if kind == "static":
        return converted
    return types.MethodType(converted, cls if kind == "class" else module)


def _rewrapped(
    wrapper: types.FunctionType, inner: types.FunctionType, converted: Callable[..., Any]
) -> types.FunctionType | None:
    """``wrapper`` made anew around ``converted`` where it holds ``inner`` in a cell of its
    closure (as ``functools.wraps`` decorators do), else None."""
    if wrapper.__wrapped__ is not inner:  # type: ignore[attr-defined]
        return None
    cells = wrapper.__closure__ or ()
    holding = [k for k, cell in enumerate(cells) if _contents(cell) is inner]
    if not holding:
        return None
    closure = tuple(
        types.CellType(converted) if k in holding else cell for k, cell in enumerate(cells)
    )
    new = types.FunctionType(
        wrapper.__code__, wrapper.__globals__, wrapper.__name__, wrapper.__defaults__, closure
    )
    new.__kwdefaults__ = wrapper.__kwdefaults__
    new.__dict__.update(wrapper.__dict__)
    new.__wrapped__ = converted  # type: ignore[attr-defined]
    new.__qualname__, new.__module__, new.__doc__ = (
        wrapper.__qualname__,
        wrapper.__module__,
        wrapper.__doc__,
    )
    for attribute in ("__autoloop_original__", "__autoloop_source__", "__autoloop_loops__"):
        setattr(new, attribute, getattr(converted, attribute))
    return new


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


_KEPT: weakref.WeakKeyDictionary[torch.nn.Module, list[tuple[Any, list[_runtime.Loop]]]] = (
    weakref.WeakKeyDictionary()
)
"""The functions of a module that a decorator hides, with their loops, reported as kept."""


def _keep_wrapped(module: torch.nn.Module, inner: types.FunctionType, strict: bool) -> None:
    reason = (
        "the function is wrapped by a decorator that does not hold it in its closure: apply "
        "torchscan.autoloop to the function before decorating it"
    )
    message = f"{_API}: {inner.__qualname__} cannot be converted: {reason}"
    if strict:
        raise TorchscanTypeError(message)
    warnings.warn(message + "; its loops stay as they are", TorchscanWarning, stacklevel=6)
    try:
        lines = [loop.lineno for loop in _compile.own_loops(_compile.function_tree(inner))]
    except _rewrite.NotConvertible:
        lines = [inner.__code__.co_firstlineno]
    filename = inner.__code__.co_filename
    loops = [_runtime.Loop(inner.__qualname__, filename, n, (), (), reason=reason) for n in lines]
    _KEPT.setdefault(module, []).append((inner, loops))


def _has_loop(fn: types.FunctionType) -> bool:
    """Whether ``fn`` has a ``for`` or ``while`` statement of its own (read from its bytecode,
    which needs no source: a ``FOR_ITER``, or a jump back)."""
    for instruction in dis.get_instructions(fn.__code__):
        if instruction.opname == "FOR_ITER":
            return True
        target = instruction.argval if "JUMP" in instruction.opname else None
        if isinstance(target, int) and target <= instruction.offset:
            return True
    return False


def _loops_of(obj: Any) -> list[tuple[Callable[..., Any], list[_runtime.Loop]]]:
    found = []
    if isinstance(obj, torch.nn.Module):
        for sub in obj.modules():
            for value in vars(sub).values():
                fn = value.__func__ if isinstance(value, types.MethodType) else value
                loops = getattr(fn, "__autoloop_loops__", None)
                if loops is not None:
                    found.append((fn, loops))
            found.extend(_KEPT.get(sub, []))
        return found
    fn = obj.__func__ if isinstance(obj, types.MethodType) else obj
    loops = getattr(fn, "__autoloop_loops__", None)
    if loops is None:
        raise TorchscanTypeError(
            f"{_API}_report: {getattr(obj, '__qualname__', type(obj).__name__)} was not "
            f"converted by {_API} (or has no for loop)"
        )
    return [(fn, loops)]


def autoloop_report(obj: Any) -> list[LoopReport]:
    """One row per ``for`` or ``while`` statement that :func:`autoloop` found in ``obj`` (a
    converted function or method, or a module given to it): where it is, whether it converts
    (before its first run) or last ran as a scan, and why not.

    Raises:
        TypeError: ``obj`` is a function that :func:`autoloop` did not convert.
    """
    return [
        LoopReport(loop.function, loop.filename, loop.lineno, *loop.outcome())
        for _, loops in _loops_of(obj)
        for loop in loops
    ]


def autoloop_source(obj: Any) -> str:
    """The source :func:`autoloop` made of a converted function or method (of each converted
    method of a module, one after the other).

    Raises:
        TypeError: ``obj`` was not converted.
    """
    sources = [getattr(fn, "__autoloop_source__", None) for fn, _ in _loops_of(obj)]
    return "\n\n".join(source for source in sources if source is not None)
