"""What converted loops call when they run: the choice between a scan and the Python loop, made
at every run from the values the loop is given, and the lists a scan's outputs become.

A converted ``for`` statement calls :func:`for_` with its static description (:class:`Loop`),
the value it iterates over, its body as a function ``body(item, carry) -> (carry, ys)`` and the
values of its carries before it. :func:`for_` runs the body in a Python ``for`` (exactly the
original loop) unless the value is a time axis (a range over a tensor's size, a tensor's rows,
``unbind``, ``enumerate`` and ``zip`` of those) and the carries are tensors; then it runs one
:func:`torchscan.scan`, whose per-step outputs become the lists the loop appended to.
"""

from __future__ import annotations

import builtins
import dataclasses
import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any, SupportsIndex

import torch

from torchscan._compat import pytree
from torchscan._errors import TorchscanError, TorchscanTypeError

API = "torchscan.autoloop"


class _Undefined:
    """The value of a carry that is not bound before the loop."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<undefined>"


UNDEFINED: Any = _Undefined()


@dataclasses.dataclass(frozen=True, eq=False)
class Loop:
    """One ``for`` statement of a converted function: where it is, what it carries and
    appends, and why it stays Python where the analysis says so. Immutable, as what a step
    captures must be for hoisting (a converted method's closure holds it); what each run did is
    kept in :data:`_outcomes`."""

    function: str
    filename: str
    lineno: int
    carries: tuple[str, ...]
    lists: tuple[str, ...]
    strict: bool = False
    reason: str = ""  # why it stays Python, from its source alone

    def where(self) -> str:
        return f"{self.function} ({self.filename}, line {self.lineno})"

    def outcome(self) -> tuple[bool, str]:
        """Whether it ran as a scan the last time it ran (before that: whether it may), and
        why not."""
        return _outcomes.get(self, (not self.reason, self.reason))


_outcomes: weakref.WeakKeyDictionary[Loop, tuple[bool, str]] = weakref.WeakKeyDictionary()


def _record(loop: Loop, converted: bool, reason: str) -> None:
    _outcomes[loop] = (converted, reason)


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
    return any(isinstance(v, torch.Tensor) for v in values)


def len_(value: Any) -> Any:
    """``len(value)``, a tensor's symbolic size while torch traces the model."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.shape[0]
    return builtins.len(value)


@dataclasses.dataclass(frozen=True)
class Unbound:
    """``tensor.unbind(axis)``: iterated as that tuple in a Python loop, scanned along
    ``axis``."""

    tensor: torch.Tensor
    axis: int

    def python(self) -> Iterator[torch.Tensor]:
        return iter(self.tensor.unbind(self.axis))

    __iter__ = python


def unbind(tensor: Any, axis: int = 0) -> Any:
    """``tensor.unbind(axis)`` in a loop's header: kept as an axis to scan where ``tensor`` is a
    tensor."""
    if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
        return Unbound(tensor, int(axis))
    return tensor.unbind(axis)


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
    stacked, dim = _stacked(tensors), _dim(args, kwargs)
    if stacked is None or dim is None:
        return torch.stack(tensors, *args, **kwargs)
    if not tensors.lazy and not list.__len__(tensors):
        return torch.stack([], dim)  # torch's own error for an empty list
    return stacked.movedim(0, dim)


def cat(tensors: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.cat``, which takes a loop's list as the stacked outputs they are."""
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


# -- the loop ----------------------------------------------------------------------------------


class _Fallback(Exception):
    """Why a loop runs as Python this time; ``error``, the error the scan raised where it was
    not torchscan's (the user's own, or one the conversion caused)."""

    def __init__(self, reason: str, error: BaseException | None = None) -> None:
        super().__init__(reason)
        self.error = error


def for_(
    loop: Loop,
    iterable: Any,
    body: Callable[[Any, tuple[Any, ...]], tuple[tuple[Any, ...], tuple[Any, ...]]],
    carry: tuple[Any, ...],
    lists: tuple[list[Any], ...],
    slices: tuple[tuple[Any, int], ...] = (),
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Run one converted ``for`` statement: as a scan where ``iterable`` is a time axis and the
    carries are tensors, else as the Python loop. ``slices``: the ``(sequence, axis)`` the body
    indexed at the step number of a range (``x[:, t]``), given to the body after the step
    number. Returns the carries after the loop and the lists."""
    try:
        plan = _time_axis(iterable)
        if any(list.__len__(items) for items in lists):
            raise _Fallback("a list the loop appends to is not empty before it")
        return _scan(loop, plan, iterable, body, carry, lists, slices)
    except _Fallback as reason:
        if loop.strict and plan_is_time(iterable):
            if reason.error is not None:
                raise reason.error from None
            raise TorchscanTypeError(
                f"{API}: the loop of {loop.where()} runs as Python: {reason}"
            ) from None
        _record(loop, False, str(reason))
        return _python(_python_iteration(iterable, slices), body, carry, lists)


def _python_iteration(iterable: Any, slices: tuple[tuple[Any, int], ...]) -> Iterator[Any]:
    """What the body is given at each step of the Python loop."""
    items = _python_items(iterable)
    if slices:
        return ((t, *[_take(s, a, t) for s, a in slices]) for t in items)
    return items


def plan_is_time(iterable: Any) -> bool:
    try:
        _time_axis(iterable)
    except _Fallback:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A time axis: the index values (``None`` where the body does not see them as such), the
    tensors scanned and their axes, how many steps, and whether the item is a tuple."""

    index: Range | None
    sequences: tuple[torch.Tensor, ...]
    axes: tuple[int, ...]
    shape: str  # "index", "item", "tuple", "enumerate"


def _time_axis(iterable: Any) -> _Plan:
    if isinstance(iterable, Range):
        if not iterable.sized:
            raise _Fallback(
                "it counts to a Python number, not to a tensor's size: layers, heads or a "
                "fixed number of steps stay Python"
            )
        return _Plan(iterable, (), (), "index")
    if isinstance(iterable, _Zipped):
        inner = iterable.parts[0]
        if iterable.enumerated and isinstance(inner, _Zipped):
            if inner.enumerated:
                raise _Fallback("it enumerates an enumerate")
            plan = _time_axis(inner)
            return dataclasses.replace(plan, shape="enumerate-zip")
        axes = tuple(_axis_of(p) for p in iterable.parts)
        tensors = tuple(p.tensor if isinstance(p, Unbound) else p for p in iterable.parts)
        shape = "enumerate" if iterable.enumerated else "tuple"
        return _Plan(None, tensors, axes, shape)  # type: ignore[arg-type]
    axis = _axis_of(iterable)
    if axis is None:
        what = type(iterable).__name__
        if isinstance(iterable, torch.Tensor):
            what = "a 0-d tensor"
        raise _Fallback(f"it iterates over a {what}, not along a tensor's axis")
    tensor = iterable.tensor if isinstance(iterable, Unbound) else iterable
    return _Plan(None, (tensor,), (axis,), "item")


def _python_items(iterable: Any) -> Iterator[Any]:
    if isinstance(iterable, (Range, Unbound)):
        return iterable.python()
    if isinstance(iterable, _Zipped):
        if iterable.enumerated:
            return builtins.enumerate(_python_items(iterable.parts[0]))
        parts = [p.python() if isinstance(p, Unbound) else p for p in iterable.parts]
        return builtins.zip(*parts, strict=False)
    return iter(iterable)


def _python(
    items: Iterator[Any],
    body: Callable[[Any, tuple[Any, ...]], tuple[tuple[Any, ...], tuple[Any, ...]]],
    carry: tuple[Any, ...],
    lists: tuple[list[Any], ...],
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The original loop."""
    for item in items:
        carry, ys = body(item, carry)
        for items_, y in builtins.zip(lists, ys, strict=True):
            items_.append(y)
    return carry, lists


def _is_tensor_tree(value: Any) -> bool:
    leaves = pytree.tree_leaves(value)
    return all(isinstance(leaf, torch.Tensor) or leaf is None for leaf in leaves)


def _first_device(*trees: Any) -> torch.device:
    for tree in trees:
        for leaf in pytree.tree_leaves(tree):
            if isinstance(leaf, torch.Tensor):
                return leaf.device
    return torch.device("cpu")


def _range_sequences(
    r: Range, slices: tuple[tuple[Any, int], ...], device: torch.device
) -> tuple[list[Any], list[int], bool, bool]:
    """The sequences of a scan over ``r``: the step numbers and, where the range steps by 1 or
    -1, each sliced sequence narrowed to the range; in ascending order, with whether the scan
    runs them in reverse, and whether the slices are among them."""
    step = r.step
    if isinstance(step, int) and step in (1, -1):
        low = r.start if step == 1 else r.stop + 1
        count = r.stop - r.start if step == 1 else r.start - r.stop
        reverse = r.reverse != (step == -1)
        if all(isinstance(v, int) for v in (low, count)):
            count = max(count, 0)
            if low < 0 < low + count:  # Python's indexing wraps around, narrowing does not
                return _index_sequences(r, device), [0], False, False
        index = torch.arange(low, low + count, device=device)
        narrowed = [s.narrow(a, low, count) for s, a in slices]
        return [index, *narrowed], [0, *[a for _, a in slices]], reverse, True
    return _index_sequences(r, device), [0], False, False


def _index_sequences(r: Range, device: torch.device) -> list[Any]:
    index = torch.arange(r.start, r.stop, r.step, device=device)
    return [index.flip(0) if r.reverse else index]


def _index_select(sequence: torch.Tensor, axis: int, index: torch.Tensor) -> torch.Tensor:
    return sequence.index_select(axis, index.reshape(1)).squeeze(axis)


def _take(sequence: Any, axis: int, index: int) -> Any:
    """``sequence[:, ..., index]`` with ``axis`` full slices first, as the body wrote it."""
    return sequence[(slice(None),) * axis + (index,)] if axis else sequence[index]


def _scan(
    loop: Loop,
    plan: _Plan,
    iterable: Any,
    body: Callable[[Any, tuple[Any, ...]], tuple[tuple[Any, ...], tuple[Any, ...]]],
    carry: tuple[Any, ...],
    lists: tuple[list[Any], ...],
    slices: tuple[tuple[Any, int], ...],
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    from torchscan._scan import scan

    for sequence, _ in slices:
        if not isinstance(sequence, torch.Tensor):
            raise _Fallback(f"it indexes a {type(sequence).__name__} at the step number")
    device = _first_device(carry, plan.sequences, slices)
    xs: list[Any] = []
    in_axes: list[int] = []
    reverse = False
    sliced = False  # the slices of the step number given as sequences
    if plan.index is not None:
        xs, in_axes, reverse, sliced = _range_sequences(plan.index, slices, device)
    else:
        if plan.shape in ("enumerate", "enumerate-zip"):
            n = plan.sequences[0].shape[plan.axes[0]]
            xs.append(torch.arange(n, device=device))
            in_axes.append(0)
        xs.extend(plan.sequences)
        in_axes.extend(plan.axes)
    shape = plan.shape

    def step(c: tuple[Any, ...], x: tuple[Any, ...]) -> tuple[Any, Any]:
        if shape == "index":
            if not slices:
                item = x[0]
            elif sliced:
                item = tuple(x)
            else:
                item = (x[0], *[_index_select(s, a, x[0]) for s, a in slices])
        elif shape == "item":
            item = x[-1]
        elif shape == "tuple":
            item = tuple(x)
        elif shape == "enumerate":
            item = (x[0], x[1])
        else:  # enumerate of zip
            item = (x[0], tuple(x[1:]))
        new, ys = body(item, c)
        return new, ys

    step.__qualname__ = step.__name__ = f"<loop at line {loop.lineno}>"
    lengths = {
        int(t.shape[a]) for t, a in builtins.zip(xs, in_axes, strict=True) if not _symbolic(t, a)
    }
    if len(lengths) > 1:
        raise _Fallback("the sequences it zips have different lengths")
    first: tuple[Any, ...] | None = None
    reason = _not_a_carry(loop.carries, carry)
    if reason is not None:  # the first step as Python runs it, the others scanned from its carry
        n = xs[0].shape[in_axes[0]]
        if isinstance(n, int) and n == 0:
            raise _Fallback(reason)
        torch._check(n > 0, lambda: f"{API}: {reason}, and the loop at {loop.where()} ran no step")
        first_index = n - 1 if reverse else 0
        x0 = tuple(t.select(a, first_index) for t, a in builtins.zip(xs, in_axes, strict=True))
        carry, first_ys = step(carry, x0)
        first = first_ys
        xs = [
            t.narrow(a, 0 if reverse else 1, n - 1)
            for t, a in builtins.zip(xs, in_axes, strict=True)
        ]
        reason = _not_a_carry(loop.carries, carry, "after the first step")
        if reason is not None:  # the other steps in Python too
            if loop.strict:
                raise TorchscanTypeError(
                    f"{API}: the loop of {loop.where()} runs as Python: {reason}"
                )
            _record(loop, False, reason)
            for items, y in builtins.zip(lists, first_ys, strict=True):
                items.append(y)
            rest = itertools.islice(_python_iteration(iterable, slices), 1, None)
            return _python(rest, body, carry, lists)
    try:
        options: dict[str, Any] = {"in_reverse": True} if reverse else {}  # in step order
        new, ys = scan(step, carry, tuple(xs), in_axes=tuple(in_axes), **options)
    except TorchscanError as error:
        raise _Fallback(_first_line(error)) from None
    except Exception as error:  # the Python loop raises it again where it is the user's
        raise _Fallback(
            f"its step failed as a scan ({type(error).__name__}: {_first_line(error)})", error
        ) from None
    lazy = _LAZY.format(api=API, where=loop.where()) if _symbolic(xs[0], in_axes[0]) else ""
    if first is not None:
        ys = pytree.tree_map(lambda y0, y: torch.cat([y0.unsqueeze(0), y]), first, ys)
    _record(loop, True, "")
    return new, tuple(StackedList._of(y, lazy) for y in ys)


def _not_a_carry(
    names: tuple[str, ...], carry: tuple[Any, ...], when: str = "before the loop"
) -> str | None:
    """Why a value of the carry cannot be a scan's (unbound, not a tensor or a pytree of
    tensors), or None."""
    for name, value in builtins.zip(names, carry, strict=True):
        if value is UNDEFINED:
            return f"`{name}` is not bound {when}"
        if value is None:  # as `h = None`, a state the first step makes
            return f"`{name}` is None {when}"
        if not _is_tensor_tree(value):
            kind = type(value).__name__
            article = "an" if kind[:1] in "aeiou" else "a"
            return (
                f"`{name}` is {article} {kind} {when}, not a tensor or a pytree of tensors: "
                "make it a tensor before the loop (torch.tensor(0))"
            )
    return None


def _symbolic(t: torch.Tensor, axis: int) -> bool:
    return not isinstance(t.shape[axis], int)


def _first_line(error: BaseException) -> str:
    """The first line of an error's message (and the next, where the first ends with a
    colon), without the API's name."""
    text = str(error)
    if text.startswith("torchscan.scan: "):
        text = text[len("torchscan.scan: ") :]
    lines = [line.strip() for line in text.split("\n") if line.strip()] or [""]
    return " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]


def kept(loop: Loop, iterable: Any) -> Any:
    """The iterable of a loop that stays Python, as it is; recorded, and refused with
    ``strict`` where it runs along a tensor's axis."""
    _record(loop, False, loop.reason)
    if loop.strict and _axis_of(iterable) is not None:
        raise TorchscanTypeError(
            f"{API}: the loop of {loop.where()} runs along a tensor's axis but stays Python: "
            f"{loop.reason}"
        )
    return iterable
