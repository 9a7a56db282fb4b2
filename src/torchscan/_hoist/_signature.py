"""The signature of a step, and the hoisted steps kept by it: what a step captures (tensors by
their metadata, Python values by value, modules with their ``training`` flag) and the kinds of
its arguments (:func:`signature_arguments`), read at every call by the walk (:class:`_Walk`);
the lookup of a signature's hoisted step, made at its call :data:`~._policy.TRACE_AT_CALL`
(:func:`lookup`), and what the last scan did (:data:`last`)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import operator
import sys
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from torchscan import _compat
from torchscan._hoist import _policy
from torchscan._plan import ScanPlan

_CACHE_SIZE = 128
"""How many signatures, and module walks, are kept."""
_WALK_LIMIT = 2000
"""How many objects a walk of what a step captures reads before it gives up."""

_REFUSED_RESULT = "what it returns is refused"


class _NotHoistable(Exception):
    """The step cannot be hoisted; it runs as the Python loop."""


# ---------------------------------------------------------------------------------------------
# The signature: what the step captures


_SCALARS = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))
_EXACT_SCALARS = frozenset({type(None), bool, int, float, str})
_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter, torch.nn.Buffer})
_MODULE_TYPES: set[type] = set()  # module classes seen: recognised by type alone
_TORCH_VALUES = (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)
_VALUES = _compat.TREE_SPEC_TYPES
"""Immutable values compared by value."""

_STABLE = (
    types.BuiltinFunctionType,
    types.BuiltinMethodType,
    types.ModuleType,
    type,
    types.MethodWrapperType,
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    _compat.OpOverload,
)


class _Identity:
    """An object compared by identity, and held by the key it is part of: an ``id`` alone would
    be taken by another object once the first one is gone."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


class _Walk:
    """The captured state of a step: a hashable key, the tensors it reaches (in a fixed order),
    and the ids of the containers it reaches (which the step must not change)."""

    def __init__(self, reading: bool = False) -> None:
        self.tensors: list[torch.Tensor] = []
        self.containers: set[int] = set()
        self.seen: dict[int, int] = {}
        self.count = 0
        self.reading = reading
        """Whether the walk keeps its :attr:`reads`: a module's does (:func:`_module_walk`),
        to be read again at the next call; a step's, made anew at every call, need not."""
        self.reads: list[tuple[Any, ...]] = []
        """What the key was read from, to tell cheaply whether it is still the same
        (:func:`_unchanged`): every mutable object the walk read, with the identities of what
        it held, and every tensor with its metadata."""

        self.empty: list[Any] = []
        """The empty containers the walk read (a module's hooks, mostly): one read of them all."""

        self.value: Any = None
        """Of a module's walk (:func:`_module_walk`), its key."""
        self.memoizable = True
        """Whether the walk holds nothing of a module whose walk it is part of (a cycle): a
        module's walk may then be kept, and read again for any walk that reaches the module."""

    def _read_dict(self, d: dict[Any, Any]) -> None:
        if not self.reading:
            return
        if d:
            self.reads.append((_DICT, d, tuple(d), tuple(d.values())))
        else:
            self.empty.append(d)

    def finish(self) -> None:
        """Add the reads of the tensors (their metadata) and of the empty containers, each
        kind in one, to :attr:`reads`."""
        if not self.reading:
            return
        if self.tensors:
            tensors = tuple(self.tensors)
            self.reads.append((_TENSOR, tensors, list(map(_meta, tensors))))
        if self.empty:
            self.reads.append((_EMPTY, tuple(self.empty)))
            self.empty = []

    def key(self, obj: Any, depth: int = 0) -> Any:
        kind = type(obj)
        if kind in _EXACT_SCALARS:  # the common cases first, by type alone
            return obj if kind is not float or obj == obj else ("nan",)
        if kind in _TENSORS:
            return self._tensor(obj)
        if isinstance(obj, _SCALARS):
            return obj if kind is not float or obj == obj else ("nan",)
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if isinstance(obj, (*_TORCH_VALUES, *_VALUES, enum.Enum)):
            return obj
        if isinstance(obj, _STABLE):
            return ("is", _Identity(obj))
        self.count += 1
        if self.count > _WALK_LIMIT or depth > 12:
            raise _NotHoistable("captures too much to read at every call")
        known = self.seen.get(id(obj))
        if known is not None:
            return ("ref", known)
        self.seen[id(obj)] = len(self.seen)
        if kind in _MODULE_TYPES or isinstance(obj, torch.nn.Module):
            return self._module(obj, depth)
        if kind is types.FunctionType:
            return self._function(obj, depth)
        if kind in (tuple, list) or isinstance(obj, tuple):
            if not self.reading or kind is tuple:
                pass
            elif kind is list and not obj:
                self.empty.append(obj)
            else:
                self.reads.append((_ITEMS, obj, kind, tuple(obj)))
            if kind is list:
                self.containers.add(id(obj))
            return (kind, tuple(self.key(item, depth + 1) for item in obj))
        if isinstance(obj, dict):
            self.containers.add(id(obj))
            self._read_dict(obj)
            return (
                kind,
                tuple((self.key(k, depth + 1), self.key(v, depth + 1)) for k, v in obj.items()),
            )
        if isinstance(obj, (set, frozenset)):
            self.containers.add(id(obj))
            if self.reading:
                self.reads.append((_ITEMS, obj, kind, tuple(obj)))
            return (kind, frozenset(self.key(item, depth + 1) for item in obj))
        if isinstance(obj, torch.nn.Module):
            return self._module(obj, depth)
        if isinstance(obj, types.FunctionType):
            return self._function(obj, depth)
        if isinstance(obj, types.MethodType):
            return ("method", self.key(obj.__func__, depth + 1), self.key(obj.__self__, depth + 1))
        if isinstance(obj, functools.partial):
            if self.reading:
                self.reads.append((_ATTRIBUTES, obj, ("func", "args", "keywords"), _PARTIAL(obj)))
            return (
                "partial",
                self.key(obj.func, depth + 1),
                self.key(obj.args, depth + 1),
                self.key(obj.keywords, depth + 1),
            )
        if isinstance(obj, types.CellType):
            self._read_cell(obj)
            try:
                return ("cell", self.key(obj.cell_contents, depth + 1))
            except ValueError:  # an empty cell
                return ("cell",)
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict) and not hasattr(type(obj), "__slots__"):
            self.containers.add(id(state))
            if self.reading:
                self.reads.append((_TYPE, obj, kind))
            self._read_dict(state)
            return (
                "object",
                _Identity(kind),
                tuple((k, self.key(v, depth + 1)) for k, v in state.items()),
            )
        raise _NotHoistable(f"captures a {kind.__name__}, whose state is not known")

    def _module(self, module: torch.nn.Module, depth: int) -> Any:
        """A module by what its ``forward`` can read (:func:`_module_walk`), its walk joined to
        this one: its tensors after those read so far, its reads and containers with these."""
        _MODULE_TYPES.add(type(module))
        sub = _module_walk(module, depth)
        if sub is None:  # a module that holds one whose walk this is part of
            self.memoizable = False
            return ("enclosing module", _Identity(module))
        self.memoizable &= sub.memoizable
        self.count += sub.count
        if self.count > _WALK_LIMIT:
            raise _NotHoistable("captures too much to read at every call")
        self.tensors.extend(sub.tensors)
        self.containers |= sub.containers
        if self.reading:
            self.reads.append((_TYPE, module, type(module)))
            self.reads.extend(sub.reads)
        return sub.value

    def module_items(self, module: torch.nn.Module, depth: int) -> Any:
        """A module by what its ``forward`` can read: its parameters, buffers, submodules, the
        hooks it runs and its other attributes (``training`` among them); not the hooks of
        ``state_dict`` and ``load_state_dict``."""
        self.containers.add(id(module.__dict__))
        self._read_dict(module.__dict__)
        items = []
        for name, value in module.__dict__.items():
            if name in _MODULE_UNREAD:
                continue
            if name in _MODULE_HOOKS and not value:
                if self.reading:
                    self.empty.append(value)  # until a hook is added
                continue
            if name in ("_parameters", "_buffers", "_modules"):
                self.containers.add(id(value))
                self._read_dict(value)
                items.append((name, tuple((k, self.key(v, depth + 1)) for k, v in value.items())))
            else:
                items.append((name, self.key(value, depth + 1)))
        return ("module", _Identity(type(module)), tuple(items))

    def _tensor(self, t: torch.Tensor) -> Any:
        if type(t) not in _TENSORS:
            raise _NotHoistable(f"captures a tensor of type {type(t).__name__}")
        known = self.seen.get(id(t))
        if known is not None:
            return ("ref", known)
        self.seen[id(t)] = len(self.seen)
        self.tensors.append(t)
        return ("tensor", len(self.tensors) - 1, *_meta(t))

    def _function(self, fn: types.FunctionType, depth: int) -> Any:
        code = fn.__code__
        names = _global_names(code)
        space = fn.__globals__
        if self.reading:
            self.reads.append((_ATTRIBUTES, fn, _FUNCTION_STATE, _FUNCTION(fn)))
            self.reads.append((_NAMES, space, names, tuple(space.get(n, _MISSING) for n in names)))
            for cell in fn.__closure__ or ():
                self._read_cell(cell)
        global_keys = tuple(
            (name, self._global(space[name], names, depth)) for name in names if name in space
        )
        cells = []
        for cell in fn.__closure__ or ():
            try:
                cells.append(self._global(cell.cell_contents, names, depth))
            except ValueError:  # an empty cell
                cells.append(("empty",))
        return (
            "function",
            _Identity(code),
            tuple(cells),
            tuple(self._global(value, names, depth) for value in fn.__defaults__ or ()),
            tuple(
                (name, self._global(value, names, depth))
                for name, value in (fn.__kwdefaults__ or {}).items()
            ),
            global_keys,
        )

    def _global(self, value: Any, names: Sequence[str], depth: int) -> Any:
        """A value the step's code reads (a global, a captured variable, a default); of a Python
        module, the numbers, strings and tensors among its attributes that the code names too
        (``config.SCALE``)."""
        if not isinstance(value, types.ModuleType):
            return self.key(value, depth + 1)
        space = vars(value)
        if self.reading:
            self.reads.append((_NAMES, space, names, tuple(space.get(n, _MISSING) for n in names)))
        return (
            "module",
            value.__name__,
            tuple(
                (name, self.key(space[name], depth + 1))
                for name in names
                if name in space and isinstance(space[name], (*_SCALARS, torch.Tensor))
            ),
        )

    def _read_cell(self, cell: types.CellType) -> None:
        if not self.reading:
            return
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            contents = _MISSING
        if self.reading:
            self.reads.append((_CELL, cell, contents))


_DICT, _ITEMS, _TYPE, _ATTRIBUTES, _NAMES, _CELL, _TENSOR, _EMPTY = range(8)
_MISSING = object()
_FUNCTION_STATE = ("__code__", "__defaults__", "__kwdefaults__", "__globals__", "__closure__")
_FUNCTION = operator.attrgetter(*_FUNCTION_STATE)
_PARTIAL = operator.attrgetter("func", "args", "keywords")


def _unchanged(reads: Sequence[tuple[Any, ...]]) -> bool:
    """Whether everything a walk read (:attr:`_Walk.reads`) holds the same objects as then, and
    every tensor has the same metadata: the walk would then give the same key. Identities, not
    values, are compared (an ``int`` set again to an equal value fails, and the step's signature
    is then read again, as it would be anyway)."""
    is_ = operator.is_
    for read in reads:
        kind = read[0]
        if kind == _DICT:  # the same keys (equal, as the dict finds them), the same values
            _, d, keys, values = read
            if tuple(d) != keys or not all(map(is_, d.values(), values)):
                return False
        elif kind == _TENSOR:
            if list(map(_meta, read[1])) != read[2]:
                return False
        elif kind == _EMPTY:
            if any(read[1]):
                return False
        elif kind == _ITEMS:
            _, obj, kind_then, items = read
            if type(obj) is not kind_then or len(obj) != len(items):
                return False
            if not all(map(is_, obj, items)):
                return False
        elif kind == _TYPE:
            if type(read[1]) is not read[2]:
                return False
        elif kind == _ATTRIBUTES:
            _, obj, _names, values = read
            now = _FUNCTION(obj) if _names is _FUNCTION_STATE else _PARTIAL(obj)
            if not all(map(is_, now, values)):
                return False
        elif kind == _NAMES:
            _, space, names, values = read
            if not all(map(is_, (space.get(n, _MISSING) for n in names), values)):
                return False
        else:  # _CELL
            try:
                contents = read[1].cell_contents
            except ValueError:
                contents = _MISSING
            if contents is not read[2]:
                return False
    return True


_module_walks: dict[int, tuple[weakref.ref[torch.nn.Module], type, _Walk]] = {}
"""The last walk of each living module, kept while what it read is unchanged (the parameters,
submodules and attributes of a model, read at every call of a step that captures it); an entry
goes with its module."""
_walking: set[int] = set()
"""The ids of the modules whose walks are in progress."""


def _module_walk(module: torch.nn.Module, depth: int) -> _Walk | None:
    """The walk of ``module`` alone (its tensors, reads and ref numbers its own), kept while
    what it read is unchanged; ``None`` where that walk is in progress (a module reached from
    itself)."""
    known = _module_walks.get(id(module))
    if (
        known is not None
        and known[0]() is module
        and type(module) is known[1]
        and _unchanged(known[2].reads)
    ):
        return known[2]
    if id(module) in _walking:
        return None
    _walking.add(id(module))
    try:
        walk = _Walk(reading=True)
        walk.seen[id(module)] = 0
        walk.count = 1
        walk.value = walk.module_items(module, depth)
        walk.finish()
    finally:
        _walking.discard(id(module))
    if walk.memoizable:
        if len(_module_walks) >= _CACHE_SIZE:
            _module_walks.pop(next(iter(_module_walks)))
        module_id = id(module)
        ref = weakref.ref(module, lambda _, walks=_module_walks: walks.pop(module_id, None))
        _module_walks[module_id] = (ref, type(module), walk)
    return walk


_MODULE_UNREAD = {
    "_non_persistent_buffers_set", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
}  # fmt: skip
_MODULE_HOOKS = {
    "_backward_pre_hooks", "_backward_hooks", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
}  # fmt: skip


@functools.cache
def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """The names ``code`` (and the functions defined in it) may read from its globals."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_global_names(const))
    return tuple(dict.fromkeys(names))


_meta: Callable[[torch.Tensor], tuple[Any, ...]] = operator.attrgetter(
    "shape", "dtype", "device", "requires_grad"
)
"""The metadata of a tensor that a signature holds."""


# ---------------------------------------------------------------------------------------------
# Watching the Python the step runs while it is traced


def signature(fn: Callable[..., Any], arguments: Any) -> tuple[Any, _Walk]:
    """The key of a step's signature (what it captures, its arguments' :func:`signature_arguments`,
    and the grad mode), and the walk that read it. The modules it reaches are read again only
    where they changed (:func:`_module_walk`): a step made anew at every call (a closure, a
    bound method) is walked quickly."""
    walk = _Walk()
    key = _Key(walk.key(fn))
    walk.finish()
    return (key, arguments, torch.is_grad_enabled()), walk


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def signature_arguments(plan: ScanPlan) -> _Key | None:
    """What a signature holds of the arguments of ``plan``: the structures of the carry and of
    ``x``, and the shape (``x`` without the scanned axis: the length is no part of a signature),
    dtype, device and ``requires_grad`` of their leaves; ``None`` where a leaf is a tensor
    subclass. Read from the plan's metadata alone, so kept in its memo."""
    memo = plan.memo
    if "hoist" in memo:
        return memo["hoist"]
    carry_type = plan.carry
    x_meta: list[Any] = [carry_type.spec, plan.xs_spec]
    key: _Key | None = None
    for leaf, axis in zip(plan.xs_leaves, plan.in_axes, strict=True):
        if leaf is None:
            x_meta.append(None)
        elif type(leaf) not in _PLAIN:
            break
        else:
            assert axis is not None  # None for a None leaf alone
            shape = leaf.shape
            x_meta.append(
                (shape[:axis] + shape[axis + 1 :], leaf.dtype, leaf.device, leaf.requires_grad)
            )
    else:
        if all(leaf is None or type(leaf) in _PLAIN for leaf in carry_type.leaves):
            carry_meta = tuple(None if t is None else _meta(t) for t in carry_type.leaves)
            key = _Key((carry_meta, tuple(x_meta)))
    memo["hoist"] = key
    return key


class _Key:
    """A signature's key with its hash computed once: a step's key is looked up at every call."""

    __slots__ = ("hash", "value")

    def __init__(self, value: Any) -> None:
        self.value, self.hash = value, hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, _Key) and self.hash == other.hash and self.value == other.value
        )


_cache: collections.OrderedDict[Any, Any] = collections.OrderedDict()

traces = 0
"""How many steps were traced (for tests: a signature is traced once)."""


@dataclasses.dataclass
class Outcome:
    """What the last scan that could be hoisted did: ``"hoisted"``, ``"first call"`` (a step
    is traced at call :data:`TRACE_AT_CALL` of its signature, unless ``hoist=True``), or
    ``"loop"``, with
    the reason."""

    what: str = ""
    reason: str = ""


last = Outcome()
"""What the last scan that could be hoisted did (read by tests and when debugging)."""


def lookup(
    plan: ScanPlan,
    arguments: Callable[[], tuple[Any, Any]],
    check: Callable[[Any], Any],
    *,
    now: bool,
    trace: Callable[..., Hoisted],
) -> tuple[Hoisted, _Walk] | None:
    """The hoisted step of this signature, made by ``trace`` (:func:`._trace.trace`) at its
    call :data:`~._policy.TRACE_AT_CALL` (a step called once or twice is not worth a trace) or,
    with ``now``, at its first; ``None`` where it runs as the Python loop (also where an
    argument is a tensor subclass, which no signature holds)."""
    global traces
    step_arguments = signature_arguments(plan)
    if step_arguments is None:
        _outcome("")  # not a scan that could be hoisted
        return None
    fn = plan.fn
    try:
        key, walk = signature(fn, step_arguments)
    except _NotHoistable as reason:
        _outcome("loop", str(reason))
        return None
    entry = _cache.get(key, 0)  # a hoisted step, a refusal, or how many calls were seen
    if isinstance(entry, _Refused):
        _outcome("loop", entry.reason)
        return None
    if not isinstance(entry, int):
        _cache.move_to_end(key)
        _outcome("hoisted")
        return entry, walk
    if entry < _policy.TRACE_AT_CALL - 1 and not now:
        _remember(key, entry + 1)  # calls seen
        _outcome("first call")
        return None
    if sys.getprofile() is not None and not callable(sys.getprofile()):
        _outcome("loop", "a profiler that cannot be chained runs (cProfile)")
        return None  # traced when it no longer runs
    try:
        traces += 1
        hoisted = trace(fn, *arguments(), walk, check)
    except _NotHoistable as reason:
        _remember(key, _Refused(str(reason)))
        _outcome("loop", str(reason))
        return None
    _remember(key, hoisted)
    _outcome("hoisted")
    return hoisted, walk


@dataclasses.dataclass(frozen=True)
class _Refused:
    reason: str


def _outcome(what: str, reason: str = "") -> None:
    last.what, last.reason = what, reason


def refuse(fn: Callable[..., Any], step_arguments: Any, reason: str) -> None:
    """Remember that the step of this signature runs as the Python loop."""
    try:
        key, _ = signature(fn, step_arguments)
    except _NotHoistable:
        return
    _remember(key, _Refused(reason))
    _outcome("loop", reason)


def _remember(key: Any, value: Any) -> None:
    _cache[key] = value
    _cache.move_to_end(key)
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)


def clear() -> None:
    """Forget every traced step."""
    _cache.clear()
    _module_walks.clear()
    _outcome("")


@dataclasses.dataclass(frozen=True)
class Hoisted:
    """The step of one signature, split by class into three generated functions.

    ``once(*captured)`` gives the constant values the other two read; ``over(*x, *once)``, run
    under ``vmap`` over the steps, gives the sequence values; ``loop(carry, columns, fixed,
    order)`` runs the steps in ``order`` on the carry's tensors, reading the sequence values and
    ``x`` leaves of step ``t`` from ``columns`` and the captured tensors and constant values
    from ``fixed``, and returns the last carry's tensors and the columns of ``y``'s tensors."""

    once: Callable[..., list[Any]]
    over: Callable[..., list[Any]]
    loop: Callable[..., tuple[list[Any], list[list[Any]], int]]
    inline: Callable[..., tuple[list[Any], list[list[Any]], int]]  # loop(carry, x, fixed, order)
    captured: tuple[int, ...]  # which walked tensors the graph reads
    x_used: tuple[int, ...]  # which x tensors the loop reads
    y_tensor: tuple[bool, ...]  # which leaves of y are tensors
    y_spec: Any
    y_leaf: bool  # y is one tensor
    sequence_count: int
    sequence_bytes: int  # per step
    source: str  # the generated loop, for debugging
    stops: bool  # the step returns until(stop): the loop may end before its last step
    operations: tuple[str, ...]  # the operations of the loop, by name
