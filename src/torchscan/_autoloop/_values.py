"""The values converted loops iterate over and write, as the runtime sees them: time axes (a
``range`` of a tensor's size, a tensor's rows, ``unbind``, ``split``, ``enumerate``, ``zip``), the
lists a scan's outputs become (:class:`StackedList`), the buffers written at the step number, and
the flags of a loop that stops (``break``, ``until``)."""

from __future__ import annotations

import builtins
import dataclasses
import operator
from collections.abc import Callable, Iterator
from typing import Any, SupportsIndex

import torch

from torchscan import _compat
from torchscan._autoloop._base import API, Loop, _is_tensor_tree, _symbolic
from torchscan._compat import pytree
from torchscan._errors import ExportError, TorchscanTypeError


@dataclasses.dataclass(frozen=True)
class Range:
    """``range(start, stop, step)`` whose bounds may be symbolic sizes (under torch.export), so
    that no Python ``range`` forces them to numbers."""

    start: Any
    stop: Any
    step: Any
    reverse: bool = False
    sized: bool = True  # taken from a tensor's size

    def python(self) -> Iterator[int]:
        r = builtins.range(self.start, self.stop, self.step)
        return iter(reversed(r) if self.reverse else r)

    __iter__ = python


def range_(*args: SupportsIndex, reverse: bool = False, sized: bool = True) -> Range:
    """What ``range(*args)`` (``reversed(range(*args))`` with ``reverse``) iterates over;
    ``sized`` where its bounds are taken from a tensor's size."""
    start, stop, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    if all(isinstance(a, int) for a in (start, stop, step)):
        builtins.range(start, stop, step)  # Python's own errors (a step of 0)
    return Range(start, stop, step, reverse, sized)


def any_tensor(*values: Any) -> bool:
    """Whether one of ``values`` is a tensor (or the rows of one): a ``len`` of it in a range's
    bounds counts steps along its axis."""
    return any(isinstance(v, (torch.Tensor, Rows)) for v in values)


def len_(value: Any) -> Any:
    """``len(value)``, a tensor's symbolic size while torch traces the model."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.shape[0]
    if isinstance(value, Rows):
        return value.tensor.shape[value.axis]
    return builtins.len(value)


class Rows(tuple):
    """``tensor.unbind(axis)`` made in a converted function: the tuple of rows, which also
    knows its tensor and axis, so that a loop indexing it at the step number (``rows[t]``)
    scans the tensor. While torch traces the model with a dynamic number of rows, it has no
    items: ``len`` and indexing at the step number of a converted loop are what it allows."""

    tensor: torch.Tensor
    axis: int
    keepdim: bool
    lazy: str

    def __new__(cls, tensor: torch.Tensor, axis: int, keepdim: bool = False) -> Rows:
        lazy = _symbolic(tensor, axis)
        made = super().__new__(
            cls, () if lazy else tensor.split(1, axis) if keepdim else tensor.unbind(axis)
        )
        made.tensor, made.axis, made.keepdim = tensor, axis, keepdim
        call = f"split(1, {axis})" if keepdim else f"unbind({axis})"
        made.lazy = (
            f"{API}: the rows of a tensor of dynamic length (tensor.{call}) are not "
            "numbered while torch traces the model: index them only at the step number of a "
            "loop over range(len(rows))"
            if lazy
            else ""
        )
        return made

    def _refuse(self) -> None:
        if self.lazy:
            raise TorchscanTypeError(self.lazy)

    def __getitem__(self, index: Any) -> Any:
        if index == builtins.slice(None, None, -1):
            return Rows(self.tensor.flip(self.axis), self.axis, self.keepdim)
        self._refuse()
        return tuple.__getitem__(self, index)

    def __len__(self) -> int:
        self._refuse()
        return tuple.__len__(self)

    def __iter__(self) -> Iterator[Any]:
        self._refuse()
        return tuple.__iter__(self)

    def __reversed__(self) -> Iterator[Any]:
        self._refuse()
        return builtins.reversed(tuple(tuple.__iter__(self)))

    def __bool__(self) -> bool:
        self._refuse()
        return tuple.__len__(self) > 0

    def __reduce__(self) -> Any:
        return (Rows, (self.tensor, self.axis, self.keepdim))

    def sequence(self) -> torch.Tensor:
        """The tensor whose items along ``axis`` are the rows (of ``split``: keeping the axis,
        of size 1)."""
        return self.tensor.unsqueeze(self.axis + 1) if self.keepdim else self.tensor


def rows(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    """``tensor.unbind(dim)`` outside a loop's header: the :class:`Rows` of a tensor."""
    if (
        isinstance(tensor, torch.Tensor)
        and tensor.dim() > 0
        and len(args) + len(kwargs) <= 1
        and set(kwargs) <= {"dim"}
    ):
        return Rows(tensor, _axis(tensor, args[0] if args else kwargs.get("dim", 0)))
    return torch.unbind(tensor, *args, **kwargs)


def _one_empty(value: Any) -> bool:
    """Whether ``value`` is ``tensor.split(1, axis)`` along an axis of size 0, which Python
    iterates as one piece, empty (``split`` always gives one), and a scan as no step."""
    if not (isinstance(value, (Rows, Unbound)) and value.keepdim):
        return False
    return not _symbolic(value.tensor, value.axis) and value.tensor.shape[value.axis] == 0


def split_rows(value: Any, *args: Any, **kwargs: Any) -> Any:
    """``value.split(...)`` outside a loop's header: the :class:`Rows` of a tensor split in
    pieces of 1 (``x.split(1, dim=0)``), else the call as written (a tensor in other pieces, a
    string's ``split``)."""
    size = args[0] if args else kwargs.get("split_size", kwargs.get("split_size_or_sections"))
    if (
        isinstance(value, torch.Tensor)
        and value.dim() > 0
        and type(size) is int
        and size == 1
        and len(args) + len(kwargs) <= 2
    ):
        rest = dict(kwargs)
        rest.pop("split_size", None)
        rest.pop("split_size_or_sections", None)
        if set(rest) <= {"dim"} and not (len(args) == 2 and rest):
            axis = args[1] if len(args) == 2 else rest.get("dim", 0)
            return Rows(value, _axis(value, axis), keepdim=True)
    return value.split(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Unbound:
    """``tensor.unbind(axis)`` (``tensor.split(1, axis)`` with ``keepdim``): iterated as that
    tuple in a Python loop, scanned along ``axis``."""

    tensor: torch.Tensor
    axis: int
    keepdim: bool = False

    def python(self) -> Iterator[torch.Tensor]:
        if self.keepdim:
            return iter(self.tensor.split(1, self.axis))
        return iter(self.tensor.unbind(self.axis))

    __iter__ = python


def unbind(tensor: Any, axis: int = 0, **kwargs: Any) -> Any:
    """``tensor.unbind(axis)`` in a loop's header: kept as an axis to scan where ``tensor`` is a
    tensor."""
    if isinstance(tensor, torch.Tensor) and tensor.dim() > 0 and set(kwargs) <= {"dim"}:
        return Unbound(tensor, _axis(tensor, kwargs.get("dim", axis)))
    return torch.unbind(tensor, axis, **kwargs)


def _axis(tensor: torch.Tensor, axis: Any) -> int:
    axis = int(axis)
    return axis + tensor.dim() if axis < 0 else axis


def split_(tensor: Any, size: Any, *args: Any, **kwargs: Any) -> Any:
    """``tensor.split(size, dim)`` in a loop's header: an axis to scan (each item keeping the
    axis, of size 1) where ``size`` is 1."""
    if (
        isinstance(tensor, torch.Tensor)
        and tensor.dim() > 0
        and isinstance(size, int)
        and size == 1
        and len(args) + len(kwargs) <= 1
        and set(kwargs) <= {"dim"}
    ):
        axis = args[0] if args else kwargs.get("dim", 0)
        return Unbound(tensor, _axis(tensor, axis), keepdim=True)
    return torch.split(tensor, size, *args, **kwargs)


def chunk_(tensor: Any, chunks: Any, *args: Any, **kwargs: Any) -> Any:
    """``tensor.chunk(chunks, dim)`` in a loop's header: an axis to scan where there are as many
    chunks as the axis is long (each of size 1)."""
    if (
        isinstance(tensor, torch.Tensor)
        and tensor.dim() > 0
        and len(args) + len(kwargs) <= 1
        and set(kwargs) <= {"dim"}
    ):
        axis = _axis(tensor, args[0] if args else kwargs.get("dim", 0))
        if isinstance(chunks, int) and chunks == tensor.shape[axis]:
            return Unbound(tensor, axis, keepdim=True)
    return torch.chunk(tensor, chunks, *args, **kwargs)


@dataclasses.dataclass(frozen=True)
class _Zipped:
    parts: tuple[Any, ...]
    enumerated: bool  # enumerate(zip(...)) or enumerate(x)

    def __iter__(self) -> Iterator[Any]:
        return _python_items(self)


def enumerate_(iterable: Any, start: int = 0) -> Any:
    if start == 0 and (_axis_of(iterable) is not None or isinstance(iterable, _Zipped)):
        return _Zipped((iterable,), True)
    return builtins.enumerate(iterable, start)


def zip_(*iterables: Any, **kwargs: Any) -> Any:
    if iterables and not kwargs and all(_axis_of(i) is not None for i in iterables):
        return _Zipped(tuple(iterables), False)
    return builtins.zip(*iterables, **kwargs)  # noqa: B905 (the user's zip)


def reversed_(value: Any) -> Any:
    if isinstance(value, Range):
        return dataclasses.replace(value, reverse=not value.reverse)
    if isinstance(value, StackedList) and value.stacked is not None:
        return StackedList._of(value.stacked.flip(0), value.lazy)
    return builtins.reversed(value)


def list_(*args: Any) -> Any:
    if len(args) == 1 and isinstance(args[0], StackedList) and args[0].stacked is not None:
        return StackedList._of(args[0].stacked, args[0].lazy)
    return builtins.list(*args)


def _axis_of(value: Any) -> int | None:
    """The axis a value is iterated along where it is a time axis, else None."""
    if isinstance(value, Unbound):
        return value.axis
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return 0
    return None


# -- lists made of a scan's outputs ------------------------------------------------------------


_LAZY = (
    "{api}: the list made by the loop at {where} has as many items as the loop ran steps, which "
    "is not a number while torch traces the model: use it only in torch.stack(...) or "
    "torch.cat(...), or keep the loop as it is (torchscan.autoloop(..., keep=...))."
)


class StackedList(list):
    """The list a converted loop appended its values to: the per-step values (views of the
    stacked outputs) and those outputs stacked, which :func:`stack` and :func:`cat` use as
    they are. Changing the list drops the stacked outputs. While torch traces the model (the
    number of steps is symbolic) the items are not made: the list can only be stacked or
    concatenated."""

    stacked: torch.Tensor | None
    lazy: str

    @classmethod
    def _of(cls, stacked: torch.Tensor, lazy: str) -> StackedList:
        result = cls(() if lazy else stacked.unbind(0))
        result.stacked, result.lazy = stacked, lazy
        return result

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise TorchscanTypeError(self.lazy)

    def _changes(name: str) -> Callable[..., Any]:  # type: ignore[misc]
        method = getattr(list, name)

        def change(self: StackedList, *args: Any, **kwargs: Any) -> Any:
            if self.lazy:
                self._refuse()
            self.stacked = None
            return method(self, *args, **kwargs)

        change.__name__ = name
        return change

    for _name in (
        "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
        "__setitem__", "__delitem__", "__iadd__", "__imul__",
    ):  # fmt: skip
        locals()[_name] = _changes(_name)
    del _name, _changes

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice) and self.stacked is not None:
            if index == slice(None, None, -1):
                return StackedList._of(self.stacked.flip(0), self.lazy)
            if index.step in (None, 1) and not self.lazy:
                return StackedList._of(self.stacked[index], self.lazy)
        if self.lazy:
            self._refuse()
        return list.__getitem__(self, index)

    def __len__(self) -> int:
        if self.lazy:
            self._refuse()
        return list.__len__(self)

    def __iter__(self) -> Iterator[Any]:
        if self.lazy:
            self._refuse()
        return list.__iter__(self)

    def __reversed__(self) -> Iterator[Any]:
        if self.lazy:
            self._refuse()
        return list.__reversed__(self)

    def __bool__(self) -> bool:
        if self.lazy:
            self._refuse()
        return list.__len__(self) > 0

    def __add__(self, other: Any) -> Any:
        if self.lazy:
            self._refuse()
        return list.__add__(self, other)

    def __eq__(self, other: object) -> bool:
        if self.lazy:
            self._refuse()
        return list.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]


def _stacked(value: Any) -> torch.Tensor | None:
    if isinstance(value, StackedList) and value.stacked is not None:
        return value.stacked
    return None


def _dim(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The ``dim`` of a ``torch.stack``/``torch.cat`` call (``axis`` too), or None where the
    call has other arguments (``out=``): then torch runs it as it is."""
    if len(args) > 1 or set(kwargs) - {"dim", "axis"} or len(kwargs) + len(args) > 1:
        return None
    dim = args[0] if args else kwargs.get("dim", kwargs.get("axis", 0))
    return dim if isinstance(dim, int) else None


def stack(tensors: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.stack``, which takes a loop's list as the stacked outputs they are."""
    if type(tensors) is list:  # (a list as Python made it, at once)
        return torch.stack(tensors, *args, **kwargs)
    stacked, dim = _stacked(tensors), _dim(args, kwargs)
    if stacked is None or dim is None:
        return torch.stack(tensors, *args, **kwargs)
    if not tensors.lazy and not list.__len__(tensors):
        return torch.stack([], dim)  # torch's own error for an empty list
    return stacked.movedim(0, dim)


def cat(tensors: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.cat``, which takes a loop's list as the stacked outputs they are."""
    if type(tensors) is list:  # (a list as Python made it, at once)
        return torch.cat(tensors, *args, **kwargs)
    stacked, dim = _stacked(tensors), _dim(args, kwargs)
    if stacked is None or dim is None:
        return torch.cat(tensors, *args, **kwargs)
    if not tensors.lazy and not list.__len__(tensors):
        return torch.cat([], dim)
    item_dims = stacked.dim() - 1
    if item_dims == 0:
        return torch.cat(list(tensors), dim)  # torch's own error for 0-d tensors
    d = dim + item_dims if dim < 0 else dim
    return stacked.movedim(0, d).flatten(d, d + 1)


# -- tensors written at the step number --------------------------------------------------------


slice_ = builtins.slice


def _key(axis: int, index: Any, rest: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    return (slice(None),) * axis + (index, *rest)


def _basic(rest: tuple[Any, ...]) -> None:
    """Refuse indices after the step number other than numbers, slices, None and ``...``: a
    tensor or list there would make a copy, not a view to write into."""
    for part in rest:
        if not (part is None or part is Ellipsis or isinstance(part, (int, builtins.slice))):
            raise TorchscanTypeError(
                f"{API}: it writes at the step number and then at a {type(part).__name__} index"
            )


def _slots(buffer: torch.Tensor, axis: int, rest: tuple[Any, ...]) -> torch.Tensor:
    """The view of ``buffer`` that ``buffer[:, ..., t, *rest]`` takes a slot of at each ``t``,
    its step axis at ``axis``."""
    _basic(rest)
    return buffer[(slice(None),) * (axis + 1) + rest] if rest else buffer


def slot(buffer: Any, axis: int, value: Any, rest: tuple[Any, ...] = ()) -> torch.Tensor:
    """What ``buffer[:, ..., t, *rest] = value`` writes, in a scan: ``value`` in the buffer's
    dtype and device, broadcast to the shape of a slot."""
    if not isinstance(buffer, torch.Tensor):
        raise TorchscanTypeError(f"{API}: it writes into a {type(buffer).__name__}, not a tensor")
    slots = _slots(buffer, axis, rest)
    shape = slots.shape[:axis] + slots.shape[axis + 1 :]
    return torch.as_tensor(value, dtype=buffer.dtype, device=buffer.device).expand(shape)


def write(
    buffer: Any, axis: int, index: Any, value: Any, scanning: bool, rest: tuple[Any, ...] = ()
) -> Any:
    """``buffer[:, ..., index, *rest] = value``: as Python runs it, in place (returning None);
    in a scan, the value for the slot (:func:`slot`), the scan's output, written after it."""
    if scanning:
        return slot(buffer, axis, value, rest)
    buffer[_key(axis, index, rest)] = value
    return None


def write_out(
    buffer: Any,
    axis: int,
    index: Any,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    scanning: bool,
    rest: tuple[Any, ...] = (),
) -> Any:
    """``fn(*args, **kwargs, out=buffer[:, ..., index, *rest])``: as Python runs it, that call
    (returning None); in a scan, the result for the slot, the scan's output, where it fits the
    slot as ``out=`` takes it (its shape, a dtype that casts to the buffer's), else the loop
    runs as Python, where ``out=`` does what it does (casts, or refuses, as each operator
    decides)."""
    if not scanning:
        fn(*args, **kwargs, out=buffer[_key(axis, index, rest)])
        return None
    differentiated = torch.is_grad_enabled() and any(
        isinstance(leaf, torch.Tensor) and leaf.requires_grad
        for leaf in pytree.tree_leaves((args, kwargs))
    )  # (out= refuses autograd)
    value = fn(*args, **kwargs)
    if not differentiated and isinstance(buffer, torch.Tensor) and isinstance(value, torch.Tensor):
        slots = _slots(buffer, axis, rest)
        shape = slots.shape[:axis] + slots.shape[axis + 1 :]
        if tuple(value.shape) == tuple(shape) and value.dtype == buffer.dtype:
            return slot(buffer, axis, value, rest)
    name = getattr(fn, "__name__", fn)
    if differentiated:
        raise TorchscanTypeError(
            f"{API}: {name}(..., out=...) while autograd records, with an argument that "
            "requires grad: torch refuses out= there (run it under torch.no_grad())"
        )
    raise TorchscanTypeError(
        f"{API}: the result of {name}(..., out=...) is not of the slot's shape and dtype: "
        "the loop runs as written (where out= casts, resizes or refuses as torch decides)"
    )


def _wrapped(index: torch.Tensor, size: Any) -> torch.Tensor:
    """``index`` with a negative value counted from the end, as Python's indexing does."""
    return torch.where(index < 0, index + size, index)


def put(
    buffer: Any,
    axis: int,
    index: Any,
    value: Any,
    scanning: bool,
    op: str | None = None,
    rest: tuple[Any, ...] = (),
) -> Any:
    """``buffer[:, ..., index, *rest] = value`` (``op=`` where ``op`` is given: ``+=`` for
    ``"add"``): as Python runs it, in place, returning ``buffer``; in a scan, where ``index`` is
    a 0-d tensor, a new tensor with the slot written."""
    key = _key(axis, index, rest)
    if not scanning:
        if op is None:
            buffer[key] = value
        else:
            current = buffer[key]
            buffer[key] = getattr(operator, f"i{op.rstrip('_')}")(current, value)
        return buffer
    if not isinstance(buffer, torch.Tensor):
        raise TorchscanTypeError(f"{API}: it writes into a {type(buffer).__name__}, not a tensor")
    position = _wrapped(torch.as_tensor(index, device=buffer.device), buffer.shape[axis])
    position = position.reshape(1)
    slots = _slots(buffer, axis, rest)
    if op is not None:
        current = slots.index_select(axis, position).squeeze(axis)
        value = getattr(operator, op)(current, value)
    new_slot = slot(buffer, axis, value, rest).unsqueeze(axis)
    if not rest:
        return buffer.index_copy(axis, position, new_slot)
    new = buffer.clone()
    _slots(new, axis, rest).index_copy_(axis, position, new_slot)
    return new


def augmented(value: Any, operand: Any, op: str, scanning: bool) -> Any:
    """``value op= operand`` (``op``: ``"add"`` for ``+=``): as Python runs it, the in-place
    operator; in a scan, a new tensor of ``value``'s dtype (as the in-place operator keeps it),
    the one the loop started from written after the loop."""
    if not scanning or not isinstance(value, torch.Tensor):
        return getattr(operator, f"i{op.rstrip('_')}")(value, operand)
    result = getattr(operator, op)(value, operand)
    if isinstance(result, torch.Tensor) and result.dtype != value.dtype:
        if not torch.can_cast(result.dtype, value.dtype):
            raise TorchscanTypeError(
                f"{API}: the result of `{op}` is {result.dtype}, which cannot be written into "
                f"{value.dtype} in place"
            )
        result = result.to(value.dtype)
    return result


def _write_back(
    buffers: tuple[tuple[Any, ...], ...],
    r: Range | None,
    outputs: tuple[torch.Tensor, ...],
    carry: tuple[Any, ...],
) -> tuple[Any, ...]:
    """After a scan: the outputs of the buffers it wrote into, written at the step numbers of
    the steps that ran (in place, as the loop would have); the carried ones' new values copied
    into them, which stay the objects the names were bound to."""
    values = builtins.list(carry)
    written = iter(outputs)
    for _, buffer, axis, position, *rest in buffers:
        if position >= 0:
            new = values[position]
            if new is not buffer:
                buffer.copy_(new)
            values[position] = buffer
            continue
        stacked = next(written)
        assert r is not None
        bounds = (r.start, r.stop, r.step)
        if all(isinstance(b, int) for b in bounds) and not builtins.range(*bounds):
            continue  # no step ran
        steps = torch.arange(r.start, r.stop, r.step, device=buffer.device)
        if r.reverse:
            steps = steps.flip(0)
        steps = _wrapped(steps[: stacked.shape[0]], buffer.shape[axis])
        _slots(buffer, axis, tuple(rest[0]) if rest else ()).index_copy_(
            axis, steps, stacked.movedim(0, axis)
        )
    return tuple(values)


# -- `if condition: break` ---------------------------------------------------------------------


class _Stop:
    """What a step returns last where it ran into ``break`` as Python runs it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<break>"


STOP: Any = _Stop()


def _as_flag(value: Any) -> torch.Tensor:
    """The 0-d bool tensor a condition is true for, as ``if value:`` reads it."""
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool and value.dim() == 0:
            return value
        if value.numel() != 1:
            raise TorchscanTypeError(
                f"{API}: the condition is a tensor of {value.numel()} values, not one"
            )
        return value.reshape(()).bool()
    return torch.tensor(builtins.bool(value))


def not_(value: Any, scanning: bool) -> Any:
    """``not value`` of the test of a ``break`` or ``continue``: in a scan, where ``value`` is a
    tensor, the 0-d bool tensor of it (Python's ``not`` would read its value)."""
    if scanning and isinstance(value, torch.Tensor):
        return ~_as_flag(value)
    return not value


def item_(value: Any, scanning: bool) -> Any:
    """``value.item()`` in the test of a ``break`` or ``continue``. In a scan, where ``value`` is
    a real tensor of one element, the 0-d float64 tensor of it: comparisons and arithmetic on it
    give what Python's give on the float or int ``.item()`` returns, exactly for floats and for
    ints of at most 53 bits (an int beyond that reads its value, as the original does), without
    reading the value out of the step."""
    if (
        scanning
        and isinstance(value, torch.Tensor)
        and value.numel() == 1
        and not value.is_complex()
        and value.dtype != torch.bool
        and (value.is_floating_point() or _exact_in_double(value))
    ):
        return value.detach().reshape(()).to(torch.float64)
    return value.item()


def _exact_in_double(value: torch.Tensor) -> bool:
    """Whether an integer tensor's value is sure to be exact in a float64: its dtype holds at
    most 53 bits."""
    return value.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32)


def stops(flag: Any, scanning: bool) -> bool:
    """Whether a step stops here: as Python runs it, ``bool(flag)``; in a scan, never (the
    step runs to its end and :func:`select` keeps the values of the carries from before the
    test where ``flag`` is true)."""
    return False if scanning else builtins.bool(flag)


def select(flag: Any, before: tuple[Any, ...], after: tuple[Any, ...]) -> Any:
    """In a scan, the carries ``before`` the statements that follow the test where ``flag`` is
    true (the step broke off there), else ``after``."""
    if not (_is_tensor_tree(before) and _is_tensor_tree(after)):
        raise TorchscanTypeError(f"{API}: a carry after the test of `break` is not a tensor")
    condition = _as_flag(flag)
    return pytree.tree_map(lambda b, a: torch.where(condition, b, a), before, after)


def flag_(flag: Any) -> torch.Tensor:
    """The 0-d bool tensor of a ``break``'s condition, carried to the loop's end."""
    return _as_flag(flag)


def unstopped(*kept: Any) -> Any:
    """The flag a scan that may ``break`` starts from: false, a 0-d bool tensor on the device of
    the first tensor of ``kept`` (the carries it keeps at the test)."""
    for value in kept:
        for leaf in pytree.tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                return torch.zeros((), dtype=torch.bool, device=leaf.device)
    return torch.zeros((), dtype=torch.bool)


def chosen(flag: Any, before: tuple[Any, ...], after: tuple[Any, ...]) -> Any:
    """After a scan that may have stopped at a ``break``, the carries kept at the test
    (``before``) where the last step stopped (``flag``), else ``after``: read as a bool where
    nothing traces the call (the loop read it at every step), else :func:`select`."""
    if _compat.untraced() and isinstance(flag, torch.Tensor):
        return before if builtins.bool(flag) else after
    return select(flag, before, after)


def until_(flag: Any, scanning: bool, loop: Loop | None = None, line: int = 0) -> Any:
    """The step's stop flag in a scan; as Python runs it, None (the step did not stop).
    ``loop`` and ``line``: the loop and the line of its ``if condition: break``."""
    if not scanning:
        return None
    from torchscan._until import until

    if isinstance(flag, torch.SymBool) and loop is not None:  # read from a tensor's value
        raise ExportError(
            f"{API}: the condition of `break` in {loop.function} at {loop.filename}:{line} "
            "is a Python bool made from a tensor's value (`float(x)`, `int(x)`, `.item()` of an "
            "int64 tensor), which is known only when the exported model runs: compare the tensor "
            "itself (`if x < tol: break` rather than `if float(x) < tol: break`)"
        )
    return until(_as_flag(flag))


def _python_items(iterable: Any) -> Iterator[Any]:
    if isinstance(iterable, (Range, Unbound)):
        return iterable.python()
    if isinstance(iterable, _Zipped):
        if iterable.enumerated:
            return builtins.enumerate(_python_items(iterable.parts[0]))
        parts = [p.python() if isinstance(p, Unbound) else p for p in iterable.parts]
        return builtins.zip(*parts, strict=False)
    return iter(iterable)
