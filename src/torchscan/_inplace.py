"""In-place changes a step function makes to its arguments: which are refused, and the words.

A step may change tensors it made itself in any way, shape-only changes of views of its arguments
included (``q = x.view(b, h, 1, d); q.squeeze_(2)``: ``x`` keeps its shape and values). It may
not write into its arguments (``h.mul_(2)``, ``x[0] = 1``), nor change the shape of an argument
itself (``h.squeeze_()``): the caller's tensors, earlier ``ys`` or the next step would see it,
and an exported loop could not do the same.

Writes are seen through tensors' version counters, which every in-place operation bumps, the
shape-only ones included. The first step of the first call of a step function runs under a
:class:`Recorder` that tells the two kinds apart and remembers which line did what; the counts it
finds allowed (bumps of shape-only changes of views) are kept per step function
(:func:`allowed`) and held against the counters of every later step, which costs no more than
reading them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from torchscan import _context
from torchscan._errors import TorchscanValueError
from torchscan._source import StepSource, is_users

METADATA_ONLY = frozenset(
    {"squeeze_", "unsqueeze_", "t_", "transpose_", "swapaxes_", "swapdims_", "as_strided_"}
)
"""In-place operations that change a tensor's shape or strides and never its values."""

REMEDY = (
    "An exported loop could not do the same. Compute new tensors instead: h = h * 2 rather than "
    "h.mul_(2) or h *= 2, and o = o.clone() before writing into o[i]."
)


def version(tensor: torch.Tensor) -> int:
    """The version counter of ``tensor``; -1 for an inference tensor, which has none."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


@dataclasses.dataclass(frozen=True)
class Change:
    """One in-place operation that changed the version of an argument: ``op`` (``add_``) on
    ``leaf`` (``carry['h']``) at ``where`` (``file.py:12``, or ``""``)."""

    leaf: str
    op: str
    where: str
    metadata: bool  # shape-only (squeeze_, transpose_, ...)
    itself: bool  # on the argument object, not on a view of it

    @property
    def refused(self) -> bool:
        return not self.metadata or self.itself


class Recorder(TorchFunctionMode):
    """Records every torch call that changes the version of one of ``named`` tensors (the step's
    arguments): one Python call and a read of each argument's version per torch call, paid on
    the first step of a step function's first call only."""

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        super().__init__()
        self.named = list(named)
        self.changes: list[Change] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _context.dynamo_tracing():
            # TorchDynamo traces torch.cond's branches through this mode: nothing to record
            # there, and versions it cannot read
            return func(*args, **kwargs)
        before = [version(t) for _, t in self.named]
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        for (leaf, t), v in zip(self.named, before, strict=True):
            if version(t) != v:
                target = args[0] if args else None
                self.changes.append(
                    Change(leaf, name, _users_line(), name in METADATA_ONLY, target is t)
                )
        return out

    def deltas(self) -> tuple[int, ...]:
        """The version bumps of each argument that the step is allowed: those of shape-only
        changes of views of it."""
        counts = {leaf: 0 for leaf, _ in self.named}
        for change in self.changes:
            if not change.refused:
                counts[change.leaf] += 1
        return tuple(counts[leaf] for leaf, _ in self.named)


def _users_line() -> str:
    """``file:line`` of the innermost frame of the user's code on the stack, or ``""``."""
    frame = inspect.currentframe()
    while frame is not None:
        if is_users(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def refuse(
    api: str,
    fn_name: str,
    step: Callable | StepSource | None,
    changed: Sequence[str] | Sequence[Change],
    when: str,
    copies: str = "",
) -> TorchscanValueError:
    """The refusal of a step that changed its arguments in place: ``changed`` are the leaves it
    changed (or the :class:`Change` records that say how and where); ``when`` says in which step
    (``in step 3``, ``in its first step``) and ``copies`` that the step ran on copies."""
    source = step if isinstance(step, StepSource) or step is None else _source(step, api, fn_name)
    who = fn_name if source is None else f"{fn_name} ({source.qualname})"
    items = []
    seen: set[str] = set()
    for change in changed:
        if isinstance(change, Change):
            if change.leaf in seen:  # the first change of each leaf says enough
                continue
            seen.add(change.leaf)
            how = f"the shape of {change.leaf}" if change.metadata else change.leaf
            at = f" at {change.where}" if change.where else ""
            items.append(f"{how} with {change.op}{at}")
        else:
            items.append(change)
    defined = ""
    if (
        source is not None
        and source.defined
        and not any(isinstance(c, Change) and c.where for c in changed)
    ):
        defined = f" ({source.qualname} is defined at {source.defined})"
    untouched = f" ({copies}: the tensors passed to {api} are left as they were)" if copies else ""
    return TorchscanValueError(
        f"{api}: {who} must not change its arguments in place, but"
        f"{f' {when}' if when else ''} it changed {', '.join(dict.fromkeys(items))}{defined}"
        f"{untouched}. {REMEDY}"
    )


def _source(step: Callable, api: str, fn_name: str) -> StepSource | None:
    try:
        return StepSource.of(step, api, fn_name)
    except Exception:  # an unusual callable: the message names the role only
        return None


# -- what each step function is allowed ---------------------------------------------------------

_ALLOWED: dict[Any, tuple[int, ...]] = {}
_MAX_KEPT = 1024


def key_of(fn: Callable) -> Any:
    """What identifies a step function across calls: its code (a lambda or a closure made anew
    at every call keeps its code), a module's class, or the callable itself; through the
    wrappers torchscan puts around it (``__wrapped__``)."""
    f = inspect.unwrap(fn)
    while isinstance(f, functools.partial):
        f = f.func
    f = getattr(f, "__func__", f)
    code = getattr(f, "__code__", None)
    if code is not None:
        return code
    if isinstance(f, torch.nn.Module):
        return type(f)
    return f


def allowed(key: Any, count: int) -> tuple[int, ...] | None:
    """The version bumps the step function ``key`` is allowed on each of its ``count``
    arguments, as its first recorded step found them; None where none was recorded."""
    found = _ALLOWED.get(key)
    return found if found is not None and len(found) == count else None


def remember(key: Any, deltas: tuple[int, ...]) -> None:
    if len(_ALLOWED) >= _MAX_KEPT:
        _ALLOWED.pop(next(iter(_ALLOWED)))
    _ALLOWED[key] = deltas


def forget(key: Any) -> None:
    _ALLOWED.pop(key, None)
