"""Rules for the arguments of scan and loop, and the messages that explain a broken rule.

Every message starts with the public function's name, names the offending leaf by its pytree path
(``carry['h']``, ``xs[1]``), says what was expected and what came, and ends with a remedy where
one is known. None of these checks touches tensor data: they read shapes, dtypes and devices only.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import types
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from torchscan import _context, _pytree
from torchscan._compat import run_untraced_by_dynamo
from torchscan._errors import ExportError, TorchscanTypeError, TorchscanValueError
from torchscan._source import StepSource
from torchscan._until import Until


def describe(value: Any) -> str:
    """A short human description of a leaf: ``float32[8, 64] on cpu``, ``None``, ``a float``."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)} on {value.device}"
    kind = type(value)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def bullets(lines: Sequence[str]) -> str:
    return "".join(f"\n  * {line}" for line in lines)


def check_callable(api: str, name: str, fn: Any) -> None:
    if not callable(fn):
        raise TorchscanTypeError(f"{api}: {name} must be callable, but got {describe(fn)}.")


_TAKES_TWO: set[types.CodeType] = set()


def check_parameters(api: str, name: str, fn: Any, call: str, meaning: str, remedy: str) -> None:
    """Refuse a step function that cannot be called with two positional arguments, as ``api``
    calls it: ``call`` (``fn(carry, x)``), ``meaning`` what the arguments are, ``remedy`` how
    to write it. A callable whose signature cannot be read (a builtin) is called as it is."""
    if _context.dynamo_tracing():  # TorchDynamo's own error, as for any call
        return
    # a function's parameters are those of its code (read once per code: the check runs at
    # every call, that of a plan reused too)
    plain = fn
    if type(fn) is functools.partial and not fn.args and not fn.keywords:
        plain = fn.func  # (a partial without arguments has its function's parameters)
    key = plain.__code__ if type(plain) is types.FunctionType and not plain.__defaults__ else None
    if key is not None and key in _TAKES_TWO:
        return
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        signature = inspect.signature(target, follow_wrapped=False)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, None)
        if key is not None:
            if len(_TAKES_TWO) >= 4096:
                _TAKES_TWO.clear()
            _TAKES_TWO.add(key)
    except TypeError:
        source = StepSource.of(fn, api, name)
        where = f", defined at {source.defined}," if source.defined else ""
        raise TorchscanTypeError(
            f"{source.who}{where} must take two arguments, as {api} calls it {call} {meaning}, "
            f"but its parameters are {signature}. {remedy}"
        ) from None


def refuse_torchscript(api: str) -> None:
    """The TorchScript exporter would record the Python loop unrolled for the traced length."""
    # torch documents both as torch.jit's, but its __all__ leaves them out
    if torch.jit.is_tracing() or torch.jit.is_scripting():  # pyright: ignore[reportPrivateImportUsage]
        raise ExportError(
            f"{api} cannot be exported by the TorchScript-based exporter "
            "(torch.onnx.export(..., dynamo=False) or torch.jit.trace): it would unroll the loop "
            "into a graph fixed to the traced length. Use torch.onnx.export(..., dynamo=True), "
            "which exports it as one ONNX loop."
        )


def refuse_strict_export(api: str) -> None:
    """TorchDynamo, which ``torch.export.export(..., strict=True)`` runs, has no support for
    torchscan's operators: refused before it traces the step function, which can take minutes
    (torch.onnx.export tries strict mode again after a failed non-strict export)."""
    if _context.dynamo_tracing() and _context.exporting():
        _refuse_strict_export(api)


@run_untraced_by_dynamo
def _refuse_strict_export(api: str) -> None:
    """Raises the refusal; TorchDynamo runs it rather than tracing it, so that the caller of
    torch.export.export gets this error itself, not Dynamo's report of an exception."""
    raise ExportError(
        f"{api} cannot be exported by torch.export.export(..., strict=True): TorchDynamo, "
        "which strict mode runs, does not support torchscan's loop operators. Export with "
        "strict=False, torch.export.export's default and what torch.onnx.export(..., "
        "dynamo=True) tries first."
    )


def check_tensor_leaves(api: str, root: str, tree: Any, leaves: Sequence[Any]) -> None:
    """Refuse leaves that are neither tensors nor ``None``."""
    if all(leaf is None or isinstance(leaf, torch.Tensor) for leaf in leaves):
        return
    names = _pytree.leaf_names(tree, root)
    bad = [
        f"{name} is until(...), which must be the last item of what the function returns"
        if isinstance(leaf, Until)
        else f"{name} is {describe(leaf)}"
        for name, leaf in zip(names, leaves, strict=True)
        if not (leaf is None or isinstance(leaf, torch.Tensor))
    ]
    remedy = "Convert numbers and arrays with torch.as_tensor(...)."
    if any(isinstance(leaf, Until) for leaf in leaves):
        remedy = "Return (carry, y, torchscan.until(stop))."
    raise TorchscanTypeError(
        f"{api}: every leaf of {root} must be a tensor or None, but:{bullets(bad)}\n{remedy}"
    )


def check_bool(api: str, name: str, value: Any) -> bool:
    """``value`` as a bool: ``True``/``False`` (or numpy's), never a truthy string or number."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TorchscanTypeError(f"{api}: {name} must be True or False, but got {describe(value)}.")


def check_int(api: str, name: str, value: Any, *, symbolic: bool = False) -> Any:
    """``value`` as an int: a Python or numpy integer, or a 0-d integer tensor. With
    ``symbolic``, a size of a traced program (``xs.shape[0]`` under ``torch.export``) stays as
    it is."""
    if symbolic and isinstance(value, torch.SymInt):
        return value
    if type(value) is int:
        return value  # as it is: torch.compile keeps an int symbolic, operator.index not
    if isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point():
        return int(value)
    if not isinstance(value, (bool, torch.Tensor)):
        with contextlib.suppress(TypeError):
            return operator.index(value)
    raise TorchscanTypeError(f"{api}: {name} must be an int, but got {describe(value)}.")


def check_unroll(api: str, unroll: Any) -> int | bool | None:
    """``unroll`` as given, where it is ``None``, a bool or an int of at least 1 (a Python or
    numpy integer)."""
    if unroll is None or isinstance(unroll, bool):
        return unroll
    if not isinstance(unroll, torch.Tensor):
        with contextlib.suppress(TypeError):
            steps = operator.index(unroll)
            if steps < 1:
                raise TorchscanValueError(
                    f"{api}: unroll must be at least 1 (the steps each iteration of the compiled "
                    f"loop runs), but it is {steps}."
                )
            return steps
    raise TorchscanTypeError(
        f"{api}: unroll must be an int of at least 1, True, False or None, but got "
        f"{describe(unroll)}."
    )


def scan_axes(api: str, axis: Any, xs: Any, leaves: Sequence[Any]) -> list[int | None]:
    """The scanned axis of every ``xs`` leaf, made non-negative; ``None`` for ``None`` leaves."""
    axis = check_int(api, "axis", axis)
    axes: list[int | None] = []
    bad: list[int] = []
    for index, leaf in enumerate(leaves):
        if leaf is None:
            axes.append(None)
        elif -leaf.ndim <= axis < leaf.ndim:
            axes.append(axis % leaf.ndim)
        else:
            axes.append(None)
            bad.append(index)
    if bad:
        names = _pytree.leaf_names(xs, "xs")
        lines = [axis_out_of_range(axis, names[i], leaves[i]) for i in bad]
        raise TorchscanValueError(
            f"{api}: axis={axis} does not fit every leaf of xs:{bullets(lines)}"
        )
    return axes


def axis_out_of_range(axis: int, name: str, leaf: torch.Tensor) -> str:
    if leaf.ndim == 0:
        return f"{name} is a 0-d tensor and has no axis to scan over"
    return (
        f"{name} has shape {tuple(leaf.shape)}, so axis must be in [{-leaf.ndim}, {leaf.ndim - 1}]"
    )


def scan_length(
    api: str, xs: Any, leaves: Sequence[Any], axes: Sequence[int | None], length: Any
) -> int:
    """The number of steps: the common size of the xs leaves along their axes, or ``length``."""
    sizes = [leaf.shape[a] for leaf, a in zip(leaves, axes, strict=True) if leaf is not None]
    if length is not None:
        length = check_int(api, "length", length, symbolic=True)
        if length < 0:
            raise TorchscanValueError(f"{api}: length must be non-negative, but got {length}.")
    if not sizes:
        if length is None:
            raise TorchscanValueError(
                f"{api}: length is needed when xs has no tensors (xs is {_short(xs)}); "
                "pass length=<number of steps>."
            )
        return length
    if any(size != sizes[0] for size in sizes) or (length is not None and length != sizes[0]):
        names = _pytree.leaf_names(xs, "xs")
        lines = [
            f"{name} has length {leaf.shape[a]} along axis {a}"
            for name, leaf, a in zip(names, leaves, axes, strict=True)
            if leaf is not None
        ]
        if length is not None:
            lines.append(f"length={length} was given")
        raise TorchscanValueError(
            f"{api}: every leaf of xs must have the same length along the scanned axis, "
            f"and length must agree with it, but:{bullets(lines)}"
        )
    return sizes[0]


def _short(value: Any) -> str:
    return "None" if value is None else f"{type(value).__name__} {value!r}"[:60]


def check_same_device(api: str, trees: Sequence[tuple[str, Any, Sequence[Any]]]) -> None:
    """Every tensor of ``init`` and ``xs`` must live on one device."""
    devices = {
        leaf.device for _, _, leaves in trees for leaf in leaves if isinstance(leaf, torch.Tensor)
    }
    if len(devices) <= 1:
        return
    lines = [
        f"{name} is on {leaf.device}"
        for root, tree, leaves in trees
        for name, leaf in zip(_pytree.leaf_names(tree, root), leaves, strict=True)
        if isinstance(leaf, torch.Tensor)
    ]
    roots = " and ".join(root for root, _, _ in trees)
    raise TorchscanValueError(
        f"{api}: all tensors of {roots} must be on one device, but:{bullets(lines)}\n"
        "Move them with .to(device) first."
    )


class CarryType:
    """The structure, shapes, dtypes and devices of ``init``, which every carry must keep."""

    def __init__(self, api: str, fn_name: str, init: Any) -> None:
        self.api, self.fn_name, self.init = api, fn_name, init
        self.leaves, self.spec = _pytree.tree_flatten(init)
        self.single = isinstance(init, torch.Tensor)  # the common case, checked fastest
        self.n_tensors = sum(isinstance(leaf, torch.Tensor) for leaf in self.leaves)
        self.shapes = [
            (leaf.shape, leaf.dtype) if isinstance(leaf, torch.Tensor) else None
            for leaf in self.leaves
        ]

    def of(self, init: Any, leaves: list[Any]) -> CarryType:
        """This type, of another ``init`` whose flattened ``leaves`` have the same structure,
        shapes, dtypes and devices (checked by the caller)."""
        carry = object.__new__(CarryType)
        carry.__dict__.update(self.__dict__)
        carry.init, carry.leaves = init, leaves
        return carry

    def tensor_leaves(self, carry: Any) -> list[torch.Tensor] | None:
        """The tensors of ``carry`` if it has the structure, shapes and dtypes of ``init``, else
        ``None`` (devices, which only a step that moves tensors can change, are left to
        :meth:`check`)."""
        leaves, spec = _pytree.tree_flatten(carry)
        # (read at every step: the structures compared at once where they are equal)
        same = spec == self.spec or _pytree.same_structure(spec, self.spec)
        if same and all(map(_same_shape, self.shapes, leaves)):
            return [leaf for leaf in leaves if leaf is not None]
        return None

    def check(self, carry: Any, where: str) -> None:
        """Refuse ``carry`` unless it has the type of ``init``; ``where`` says when ``fn``
        returned it (`` in its first step``)."""
        leaves, spec = _pytree.tree_flatten(carry)
        if _pytree.same_structure(spec, self.spec) and all(map(_same_type, self.leaves, leaves)):
            return
        api, fn_name = self.api, self.fn_name
        if not _pytree.same_structure(spec, self.spec):
            raise TorchscanTypeError(
                f"{api}: the carry must keep its structure, but {fn_name} changed it{where}:\n"
                f"  * init has structure {_pytree.structure_text(self.spec)}\n"
                f"  * {fn_name} returned structure {_pytree.structure_text(spec)}\n"
                f"Return a carry built like init."
            )
        names = _pytree.leaf_names(self.init, "carry")
        changes = [
            change
            for name, old, new in zip(names, self.leaves, leaves, strict=True)
            if not _same_type(old, new) and (change := _leaf_change(name, old, new, fn_name))
        ]
        grown = next(
            (
                (name, axis)
                for name, old, new in zip(names, self.leaves, leaves, strict=True)
                if (axis := _grown_axis(old, new)) is not None
            ),
            None,
        )
        remedy = (
            _growing_remedy(*grown, fn_name)
            if grown is not None
            else "Return a carry with the shape, dtype and device of init (cast or reshape it, "
            "or change init)."
        )
        raise TorchscanTypeError(
            f"{api}: the carry must keep its type, but {fn_name} changed it{where}:"
            f"{bullets(changes)}\n{remedy}"
        )


def _grown_axis(old: Any, new: Any) -> int | None:
    """The axis along which ``new`` is ``old`` grown (a sequence extended by ``torch.cat``):
    the same dtype and rank, every size the same but that one, larger."""
    if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
        return None
    if old.dtype != new.dtype or old.ndim != new.ndim:
        return None
    changed = [a for a, (o, n) in enumerate(zip(old.shape, new.shape, strict=True)) if o != n]
    if len(changed) == 1 and new.shape[changed[0]] > old.shape[changed[0]]:
        return changed[0]
    return None


def _growing_remedy(name: str, axis: int, fn_name: str) -> str:
    first = "def body(i, carry):" if fn_name == "body" else "def step(carry, x):"
    at = ":, " * axis + "i"
    return (
        f"{name} grew along axis {axis}: a carry keeps its shape at every step, so a sequence "
        f"grown by concatenation (torch.cat((out, token), {axis})) cannot be carried. Return "
        f"each step's token as the output y of {fn_name} instead, which is stacked for you:\n"
        f"    {first}\n"
        "        token = ...  # this step's token\n"
        "        return carry, token  # ys[t] is the token of step t\n"
        "or write it into a buffer made before the loop, at the iteration number:\n"
        "    def body(i, buf):\n"
        f"        buf = buf.clone(); buf[{at}] = ...  # this iteration's token\n"
        "        return buf, None\n"
        "    buf, _ = torchscan.loop(body, buffer_of_every_token, trip_count=n)"
    )


def _same_shape(old: tuple[torch.Size, torch.dtype] | None, new: Any) -> bool:
    if old is None or not isinstance(new, torch.Tensor):
        return old is None and new is None
    return new.shape == old[0] and new.dtype == old[1]


def _same_type(old: Any, new: Any) -> bool:
    if old is None or new is None or not isinstance(new, torch.Tensor):
        return old is new
    return old.shape == new.shape and old.dtype == new.dtype and old.device == new.device


def _leaf_change(name: str, old: Any, new: Any, fn_name: str) -> str | None:
    if (old is None) != (new is None) or not isinstance(new, (torch.Tensor, type(None))):
        return f"{name} is {describe(old)} in init but {fn_name} returned {describe(new)}"
    if old is None:
        return None
    for attr, show in (("shape", tuple), ("dtype", str), ("device", str)):
        before, after = getattr(old, attr), getattr(new, attr)
        if before != after:
            return f"{name} has {attr} {show(before)} but {fn_name} returned {attr} {show(after)}"
    return None
