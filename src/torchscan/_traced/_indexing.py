"""Indexing with tensors inside a body that runs on fake tensors: traced, probed for its shapes.

A loop body gets its step number ``i`` as a 0-d int64 tensor, and indexes with it: ``x[:, i]``,
``x[:, i - 1]``, ``x[:, i:i + k]``, ``x.narrow(1, i, k)``, ``o[:, i] = v``,
``em[b, i, tags[:, i]]``.
Eagerly torch reads the value of ``i`` (``i.item()``) and selects or slices at it. On fake
tensors there is no value to read: torch.export's non-strict mode turns ``x[i]`` alone into a
select at a size known only when the model runs, but a 0-d index among tensor indices, a slice
between two such sizes and a write at one fail on a guard about a value nobody knows.

:class:`BodyIndexing` rewrites those expressions, while a body runs on fake tensors, into index
operators that take the positions as tensors and never read them, with the result eager torch
gives:

- a 0-d integer tensor ``i`` on an axis of size ``n`` (as an index, ``select``'s index or
  ``narrow``'s start) reads the positions ``i`` (``i + n`` where ``i < 0``) with
  ``index_select``, and drops the axis where torch does. Among tensor indices, torch applies a
  0-d index as it applies a Python int, before them (``x[:, a, :, i]`` keeps the dims where
  ``x[:, a, :, 2]`` does, which numpy does not): so does the rewrite, with the int ``0`` on the
  axis of length 1 that ``index_select`` leaves.
- a slice whose bounds are the same tensor plus, minus or times Python ints (``i:i + k``,
  ``i * k:(i + 1) * k``, ``i - 2:i``: the mode follows such arithmetic on 0-d integer tensors)
  reads ``stop - start`` positions (by the slice's step, a Python int), a length known when the
  body is traced.
- ``x[index] = value`` with such an index reads the positions into a copy, writes ``value``
  there as torch would, and writes the copy back with ``index_copy_``.

Where eager torch fails (an index out of range, ``narrow`` past the end) the rewritten form fails
too, in torch and in ONNX: the positions become ``n``, which ``index_select`` and ``Gather``
refuse. A slice whose bounds eager torch would clip at an end of the axis (``x[:, i:i + 2]`` at
the last step, ``x[:, i - 1:i + 1]`` at ``i = 0``) is shorter eagerly; the rewritten form has
the fixed length and fails there instead of returning another shape. Eager execution is never
rewritten: this mode is active only where the body runs on fake tensors.

Other slices with tensor bounds (``x[:, :i]``) keep torch.export's form, a slice of a length
read from data; where that length later decides a shape, the guard on it becomes
:class:`DataDependentSlice`, which names the slice in the user's code.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from torchscan import _compat, _context, _pytree
from torchscan._compat import non_strict_torch_function_handler
from torchscan._errors import ExportError

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from torchscan._compat import NonStrictTorchFunctionHandler as _NonStrictIndexing
else:
    # torch.export's class, which imports TorchDynamo: the other base of BodyIndexing, made at
    # first use (:func:`_body_indexing_class`), which the rules' super() calls reach
    _NonStrictIndexing = object

_MASK_DTYPES = (torch.bool, torch.uint8)

# -- what an index holds ----------------------------------------------------------------------


def is_scalar_index(item: Any) -> bool:
    """Whether torch indexes with ``item`` as with a Python int: a 0-d integer tensor (bool and
    uint8 ones are masks)."""
    return (
        isinstance(item, torch.Tensor)
        and item.ndim == 0
        and not item.is_floating_point()
        and not item.is_complex()
        and item.dtype not in _MASK_DTYPES
    )


def _has_tensor_bound(item: Any) -> bool:
    return isinstance(item, slice) and any(
        isinstance(b, torch.Tensor) for b in (item.start, item.stop, item.step)
    )


def _axes_taken(item: Any) -> int | None:
    """How many axes of the indexed tensor ``item`` consumes (None: not a form handled here)."""
    if item is None or item is Ellipsis or isinstance(item, bool):
        return 0
    if isinstance(item, torch.Tensor):
        return item.ndim if item.dtype in _MASK_DTYPES else 1
    if isinstance(item, (slice, torch.SymInt)) or hasattr(item, "__index__"):
        return 1
    return None


def _items(index: Any) -> list[Any] | None:
    if isinstance(index, tuple):
        return list(index)
    if isinstance(index, list):
        return None  # torch reads a list as a tuple or as a tensor by its content: left to it
    return [index]


# -- the affine values of 0-d tensors ----------------------------------------------------------


class Affine:
    """The 0-d integer tensors a body computes as ``a * base + b`` from another one, with Python
    ints ``a`` and ``b``: ``i + 1``, ``i * k``, ``(i + 1) * k``, ``k - i``. Kept by identity, for
    the life of one trace."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[torch.Tensor, torch.Tensor, int, int]] = {}

    def of(self, t: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """``(base, a, b)`` with ``t == a * base + b``; ``(t, 1, 0)`` for a tensor not derived."""
        entry = self._known.get(id(t))
        if entry is not None and entry[0] is t:
            return entry[1:]
        return t, 1, 0

    def record(self, name: str, args: tuple, kwargs: dict | None, result: Any) -> None:
        """Note ``result`` of the call ``name(*args)`` if it is affine in a 0-d integer tensor."""
        if kwargs or not args or not is_scalar_index(args[0]) or not is_scalar_index(result):
            return
        if name == "neg" and len(args) == 1:
            base, a, b = self.of(args[0])
            self._known[id(result)] = (result, base, -a, -b)
            return
        if len(args) != 2 or type(args[1]) is not int:
            return
        base, a, b = self.of(args[0])
        k = args[1]
        if name == "add":
            self._known[id(result)] = (result, base, a, b + k)
        elif name == "sub":
            self._known[id(result)] = (result, base, a, b - k)
        elif name == "__rsub__":
            self._known[id(result)] = (result, base, -a, k - b)
        elif name == "mul":
            self._known[id(result)] = (result, base, a * k, b * k)

    def length(self, item: slice) -> int | None:
        """The length of ``start:stop:step`` where both bounds are tensors that differ by a
        Python int and the step is a positive Python int or None: else None."""
        start, stop, step = item.start, item.stop, 1 if item.step is None else item.step
        if not (is_scalar_index(start) and is_scalar_index(stop)):
            return None
        if type(step) is not int or step <= 0:
            return None
        start_base, start_a, start_b = self.of(start)
        stop_base, stop_a, stop_b = self.of(stop)
        if start_base is not stop_base or start_a != stop_a:
            return None
        return len(range(0, stop_b - start_b, step))


# -- positions ---------------------------------------------------------------------------------


def _flat_int64(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` as an int64 tensor of shape ``(1,)`` on ``device``."""
    t = t.reshape(1)
    if t.dtype != torch.int64:
        t = t.to(torch.int64)
    return t if t.device == device else t.to(device)


def _refuse_where(valid: torch.Tensor, positions: torch.Tensor, size: Any) -> torch.Tensor:
    """``positions`` where ``valid``, else ``size``: out of range for ``index_select``,
    ``index_copy_`` and ONNX ``Gather`` alike, so that the model fails where eager torch does."""
    return torch.where(valid, positions, size)


def element_position(index: torch.Tensor, size: Any, device: torch.device) -> torch.Tensor:
    """The position (shape ``(1,)``) that ``x[index]`` reads on an axis of ``size``."""
    i = _flat_int64(index, device)
    wrapped = torch.where(i < 0, i + size, i)
    return _refuse_where(wrapped >= 0, wrapped, size)


def slice_positions(item: slice, length: int, size: Any, device: torch.device) -> torch.Tensor:
    """The ``length`` positions that ``x[start:stop:step]`` reads on an axis of ``size``, where
    ``stop - start`` is fixed: right where eager torch reads that many, ``size`` elsewhere."""
    start = _flat_int64(item.start, device)
    stop = _flat_int64(item.stop, device)
    step = 1 if item.step is None else item.step
    offsets = torch.tensor(list(range(0, length * step, step)), dtype=torch.int64, device=device)
    inside = (start >= 0) & (stop <= size)
    from_end = (start >= -size) & (stop < 0)
    first = torch.where(start < 0, start + size, start)
    return _refuse_where(inside | from_end, first + offsets, size)


def narrow_positions(
    start: torch.Tensor, length: int, size: Any, device: torch.device
) -> torch.Tensor:
    """The positions ``x.narrow(dim, start, length)`` reads on an axis of ``size``."""
    start = _flat_int64(start, device)
    first = torch.where(start < 0, start + size, start)
    offsets = torch.tensor(list(range(length)), dtype=torch.int64, device=device)
    valid = (start >= -size) & (first + length <= size)
    return _refuse_where(valid, first + offsets, size)


# -- an index as gathers and what remains -----------------------------------------------------


class _Split:
    """An index as ``index_select`` calls on axes of the indexed tensor (``gathers``: axis and
    positions, the axis kept) and the index that remains on their result (``rest``)."""

    def __init__(self, gathers: list[tuple[int, torch.Tensor]], rest: tuple) -> None:
        self.gathers, self.rest = gathers, rest

    def read(self, x: torch.Tensor) -> torch.Tensor:
        for axis, positions in self.gathers:
            x = x.index_select(axis, positions)
        return x

    def write_back(self, x: torch.Tensor, write: Callable[[torch.Tensor], None]) -> None:
        """``write`` into the gathered copy of ``x``, then copy it back into ``x``."""
        parents = []
        part = x
        for axis, positions in self.gathers:
            parents.append((part, axis, positions))
            part = part.index_select(axis, positions)
        write(part)
        for parent, axis, positions in reversed(parents):
            parent.index_copy_(axis, positions, part)
            part = parent


def split_index(x: torch.Tensor, index: Any, affine: Affine) -> _Split | None:
    """``x[index]`` as gathers and a remaining index, or None where the index holds neither a
    0-d integer tensor nor a slice of a fixed length between tensors."""
    items = _items(index)
    if items is None:
        return None
    taken: list[int] = []
    for item in items:
        n = _axes_taken(item)
        if n is None:
            return None
        taken.append(n)
    if items.count(Ellipsis) > 1:
        return None
    lengths = [affine.length(item) if _has_tensor_bound(item) else None for item in items]
    if not any(is_scalar_index(it) for it in items) and all(n is None for n in lengths):
        return None
    spare = x.ndim - sum(taken)
    if spare < 0:
        return None  # too many indices: torch says so
    gathers, rest, axis = [], [], 0
    for item, n, length in zip(items, taken, lengths, strict=True):
        if is_scalar_index(item):
            gathers.append((axis, element_position(item, x.shape[axis], x.device)))
            rest.append(0)
        elif length is not None:
            gathers.append((axis, slice_positions(item, length, x.shape[axis], x.device)))
            rest.append(slice(None))
        else:
            rest.append(own_index(item))
        axis += spare if item is Ellipsis else n
    return _Split(gathers, tuple(rest))


def own_index(item: Any) -> Any:
    """A tensor index of the body's own trace. A tensor of an enclosing trace (``w[i]`` in a
    scan nested in a loop reads the loop's ``i``) reaches a nested body as a constant, and the
    value read from a constant is known to no trace; a copy made in the body is its own."""
    if isinstance(item, slice):
        return slice(*(own_index(bound) for bound in (item.start, item.stop, item.step)))
    if isinstance(item, torch.Tensor) and item.ndim == 0 and not item.is_floating_point():
        return item.clone()
    return item


# -- errors ------------------------------------------------------------------------------------


class DataDependentSlice(ExportError):
    """A slice whose length is read from the values of its tensor bounds decides a shape, where
    the body runs on fake tensors (``site``: the slice in the user's code; ``need``: what
    needs its length)."""

    def __init__(self, site: str, need: str, api: str = "torch.onnx.export") -> None:
        self.site, self.need = site, need
        super().__init__(
            f"{api}: the slice at {site} has a length that depends on the values of its "
            "tensor bounds, which are unknown where the loop body runs on fake tensors (traced "
            f"for export, or called for the shapes of ys when no step runs), and {need}. Give "
            "the slice a fixed length: x.narrow(dim, i, k), or x[:, i:i + k] with both bounds "
            "the same tensor plus, minus or times Python ints; or take one element with x[:, i]."
        )

    def from_api(self, api: str) -> DataDependentSlice:
        """The same refusal in the words of ``api`` (``torchscan.scan``)."""
        return DataDependentSlice(self.site, self.need, api)


def _what_torch_needs(error: GuardOnDataDependentSymNode) -> str:
    if error.cond.is_Symbol:
        return f"torch needs the value of {error.cond}"
    return f"torch needs to know whether {error.cond} holds"


_OWN_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


def user_site() -> str:
    """``file:line (code)`` of the innermost frame outside torch and torchscan."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_DIRS):
        frame = frame.f_back
    if frame is None:
        return "an unknown line"
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    return f"{where} ({code})" if code else where


# -- the mode ----------------------------------------------------------------------------------


def _sizes_symbols(shape: Sequence[Any]) -> set:
    return {s for d in shape if isinstance(d, torch.SymInt) for s in _compat.unbacked_symbols(d)}


class _BodyIndexingRules(_NonStrictIndexing):
    """The rewrites of this module, on top of torch.export's non-strict indexing in
    :class:`BodyIndexing` (a subclass of both, made at first use: torch.export's class imports
    TorchDynamo)."""

    def __init__(self) -> None:
        super().__init__()
        self.affine = Affine()
        self._slices: dict[Any, str] = {}  # sizes read from tensor bounds of slices: the site

    def _override(self, func: Any, args: tuple, kwargs: dict) -> tuple:
        name = getattr(func, "__name__", "")
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and not kwargs:
            rewritten = self._rewrite(name, x, args[1:])
            if rewritten is not None:
                return rewritten, (), {}
        if name == "__getitem__" and len(args) == 2:
            args = (x, _own_items(args[1]))
        return super()._override(func, args, kwargs)

    def _rewrite(self, name: str, x: torch.Tensor, rest: tuple) -> Callable[[], Any] | None:
        if name == "__getitem__" and len(rest) == 1:
            split = split_index(x, rest[0], self.affine)
            if split is not None:
                return lambda: self._index(split.read(x), split.rest)
        elif name == "__setitem__" and len(rest) == 2:
            split = split_index(x, rest[0], self.affine)
            if split is not None:
                value = rest[1]
                return lambda: split.write_back(x, lambda part: part.__setitem__(split.rest, value))
        elif name == "select" and len(rest) == 2 and is_scalar_index(rest[1]):
            axis = rest[0] % max(x.ndim, 1)
            positions = element_position(rest[1], x.shape[axis], x.device)
            return lambda: x.index_select(axis, positions).select(axis, 0)
        elif (
            name == "narrow"
            and len(rest) == 3
            and is_scalar_index(rest[1])
            and type(rest[2]) is int
            and rest[2] >= 0
        ):
            axis = rest[0] % max(x.ndim, 1)
            positions = narrow_positions(rest[1], rest[2], x.shape[axis], x.device)
            return lambda: x.index_select(axis, positions)
        return None

    def _index(self, x: torch.Tensor, rest: tuple) -> torch.Tensor:
        """``x[rest]``, as torch.export's non-strict mode reads it."""
        func, args, kwargs = super()._override(torch.Tensor.__getitem__, (x, rest), {})
        # torch's _override is unannotated: its inferred result allows None
        return cast(torch.Tensor, func(*args, **kwargs))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _context.dynamo_tracing():
            return func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name == "squeeze" and args and isinstance(args[0], torch.Tensor):
            self._refuse_squeeze(args, kwargs)
        try:
            result = super().__torch_function__(func, types, args, kwargs)
        except _compat.guard_on_data_dependent_error() as error:
            site = self._site_of(error)
            if site is None and name in ("__getitem__", "__setitem__") and len(args) >= 2:
                items = _items(args[1]) or []
                site = user_site() if any(_has_tensor_bound(it) for it in items) else None
            if site is None:
                raise
            raise DataDependentSlice(site, _what_torch_needs(error)) from error
        self.affine.record(name, args, kwargs, result)
        if (
            name == "__getitem__"
            and isinstance(result, torch.Tensor)
            and len(args) == 2
            and any(_has_tensor_bound(it) for it in _items(args[1]) or [])
        ):
            site = user_site()
            for symbol in _sizes_symbols(result.shape):
                self._slices.setdefault(symbol, site)
        return result

    def __exit__(self, exc_type, exc_value, traceback):
        super().__exit__(exc_type, exc_value, traceback)
        # A guard outside a torch function, where the body's result is checked (its carry's
        # shape against the initial carry's), on the length of a slice this mode let through.
        if exc_value is not None and isinstance(exc_value, _compat.guard_on_data_dependent_error()):
            site = self._site_of(exc_value)
            if site is not None:
                raise DataDependentSlice(site, _what_torch_needs(exc_value)) from exc_value

    def _site_of(self, error: GuardOnDataDependentSymNode) -> str | None:
        return next((self._slices[s] for s in error.cond.free_symbols if s in self._slices), None)

    def _refuse_squeeze(self, args: tuple, kwargs: dict | None) -> None:
        x = args[0]
        dims = args[1] if len(args) > 1 else (kwargs or {}).get("dim", range(x.ndim))
        dims = [dims] if isinstance(dims, int) else list(dims)
        for d in dims:
            size = x.shape[d]
            found = [self._slices[s] for s in _sizes_symbols([size]) if s in self._slices]
            if found:
                where = user_site()
                where = "there" if where == found[0] else f"at {where}"
                raise DataDependentSlice(
                    found[0], f"squeeze({d}) {where} keeps or drops that axis by it"
                )


@functools.cache
def _body_indexing_class() -> type:
    return type(
        "BodyIndexing",
        (_BodyIndexingRules, non_strict_torch_function_handler()),
        {
            "__doc__": "torch.export's non-strict indexing (``x[i]`` with a 0-d integer tensor "
            "``i`` as a select at a size read from it), with the rewrites of this module on top."
        },
    )


def body_indexing() -> Any:
    """A new torch function mode: torch.export's non-strict indexing (``x[i]`` with a 0-d
    integer tensor ``i`` as a select at a size read from it), with the rewrites of this module
    on top (see its docstring)."""
    return _body_indexing_class()()


def on_fake_tensors(fn: Callable) -> Callable:
    """``fn`` indexing as a traced body does, for a call on fake tensors outside a trace (the
    shapes of ``ys`` when no step runs)."""

    def call(*args: Any) -> Any:
        with body_indexing():
            return fn(*args)

    return call


def _own_items(index: Any) -> Any:
    return _pytree.tree_map(own_index, index, is_leaf=_is_index_leaf)


def _is_index_leaf(item: Any) -> bool:
    return isinstance(item, (torch.Tensor, slice))
