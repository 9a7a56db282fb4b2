"""Hoisting: the work of a scan's step that does not depend on the carry, done once per call.

A step such as ``h = tanh(x @ W + h @ U)`` computes ``x @ W`` at every step although it depends
on ``x`` alone. The ``"hoisted"`` strategy traces the step once per signature into a graph of
ATen operations (on fake tensors, so that Python control flow on tensor values fails the trace),
gives every node a class, and runs each class where it belongs:

==========  =========================================================================  ==========
class       what the node depends on                                                   runs
==========  =========================================================================  ==========
constant    captured tensors (parameters, buffers) and constants only                  once
sequence    ``x`` too, but not the carry                                               once, over
                                                                                       every step
                                                                                       (vmap)
carry       the carry, or a random operation (the RNG stream stays the loop's)         every step
==========  =========================================================================  ==========

A step is hoisted only where running the graph instead of the step cannot be told apart from the
Python loop but by rounding (a matmul over the whole sequence may add in another order):

* it traces on fake tensors: no Python control flow on tensor values, no ``.item()``, no
  operation whose output shape depends on values, no value of a captured tensor read by Python
  (``bool(buffer)``, a captured 0-d integer tensor as an index);
* it changes no argument and no captured tensor in place (a batch norm that updates its running
  statistics, a buffer written into); a value it writes into is made in the class of the write;
* the Python it runs on its behalf changes no state: no ``print``, no logging, no warnings, no
  ``random`` or ``time``, no assignment to an attribute, a global, a subscript or an enclosing
  function's variable, no mutation of a list, dict or set it captures, no nested scan; the
  trace stops before such a call, so that tracing changes nothing either;
* it returns ``(carry, y)`` or ``(carry, y, until(stop))`` of tensors, and what it captures is
  of known kinds: tensors, modules, functions, numbers, strings, and containers and plain
  objects of them.

Everything the step captures is part of its signature, read at every call: tensors by their
shapes, dtypes, devices and whether they require gradients (their values are read when the graph
runs, so a parameter updated in place is seen), Python values by value, modules with their
``training`` flag. A step whose signature changes is traced again; one that cannot be hoisted
runs as the Python loop, as before. Results equal the Python loop's within rounding, gradients
to ``xs``, ``init`` and every captured tensor included.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import gc
import operator
import os
import sys
import sysconfig
import types
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from torchscan import _compat, _pytree, _source
from torchscan._errors import HoistWarning
from torchscan._plan import ScanPlan
from torchscan._until import Until

TRACE_AT_CALL = 3
"""A signature's step is traced at its third call: tracing costs about as much as a few calls of
a scan of a hundred steps, which a step called once or twice would not get back."""

BATCH_FROM = 16
"""A scan of fewer steps computes the work that depends on ``x`` alone at every step, in the
loop: batching it over the steps costs more than it saves there."""

_CACHE_SIZE = 128
_WALK_LIMIT = 2000

_CONSTANT, _SEQUENCE, _CARRY = 0, 1, 2


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


_TORCH_DIR = os.path.dirname(torch.__file__)
_TORCHSCAN_DIR = os.path.dirname(os.path.abspath(__file__))
_DISPATCH_FILE = os.path.join(_TORCHSCAN_DIR, "_dispatch.py")  # its run: a nested loop
_STDLIB_DIRS = tuple({os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")})
_SAFE_STDLIB = {
    "abc", "collections", "contextlib", "copy", "dataclasses", "enum", "functools", "inspect",
    "itertools", "math", "numbers", "operator", "re", "typing", "types", "weakref", "warnings",
    "_collections_abc", "threading", "traceback", "linecache", "tokenize", "ast", "dis",
    "keyword", "string", "textwrap", "reprlib", "copyreg", "_weakrefset", "posixpath",
    "genericpath", "os", "fnmatch", "contextvars", "importlib", "codecs", "encodings",
}  # fmt: skip
_STORES = {
    "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_ATTR", "DELETE_ATTR", "STORE_SUBSCR",
    "DELETE_SUBSCR", "STORE_DEREF", "DELETE_DEREF",
}  # fmt: skip
_REFUSED_BUILTINS = {"print", "input", "open", "exec", "eval", "setattr", "delattr", "breakpoint"}
_MUTATORS = {
    "append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem",
    "add", "discard", "appendleft", "extendleft", "popleft", "sort", "reverse", "__setitem__",
    "__delitem__", "__iadd__",
}  # fmt: skip


@functools.cache
def _where(filename: str) -> str:
    """``"torch"``, ``"torchscan"``, ``"stdlib:<module>"`` or ``"user"``."""
    if filename.startswith("<frozen "):  # <frozen importlib._bootstrap>
        return "stdlib:" + filename[8:-1].split(".")[0]
    path = os.path.realpath(filename) if filename and not filename.startswith("<") else filename
    if path.startswith(_TORCH_DIR + os.sep):
        return "torch"
    if path.startswith(_TORCHSCAN_DIR + os.sep):
        return "torchscan"
    for root in _STDLIB_DIRS:
        if path.startswith(root + os.sep) and "site-packages" not in path:
            module = os.path.relpath(path, root).split(os.sep)[0].removesuffix(".py")
            return f"stdlib:{module}"
    return "user"


@functools.cache
def _writes(code: types.CodeType) -> str | None:
    """The first instruction of ``code`` that changes state outside its own frame, if any."""
    import dis

    if code.co_name in ("__init__", "__post_init__", "__new__"):
        return None  # what it writes is the new object
    local_cells = set(code.co_cellvars)
    for instruction in dis.get_instructions(code):
        name = instruction.opname
        if name in _STORES:
            if name in ("STORE_DEREF", "DELETE_DEREF") and instruction.argval in local_cells:
                continue
            return f"{name.lower()} {instruction.argval}"
    return None


class _Watch:
    """A profile function that records why the Python a traced step runs is not pure.

    It follows the frames that run on the step's behalf: the step, what it calls, and what
    torch's Python calls for it (a module's ``forward``, a custom autograd function), and holds
    the user's code among them to the rules; not the frames of torch's tracing machinery, which
    the step's operations enter from C (``__torch_dispatch__``, whose ``f_back`` is the step's
    frame) and which log, cache and import as they please."""

    def __init__(self, containers: set[int], previous: Any, root: types.CodeType) -> None:
        self.containers = containers
        self.previous = previous  # a profile function that was set: called too
        self.reason: str | None = None
        self._root = root  # the code that calls the step
        self._frames: dict[int, bool] = {}  # followed frames: whether they are the user's
        # The garbage collector's callbacks (TorchDynamo keeps one) run on whatever frame
        # allocates when a collection starts: they are not the step's, and are not followed.
        self._collector = {getattr(c, "__code__", None) for c in gc.callbacks} - {None}

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if self.previous is not None:
            self.previous(frame, event, arg)
        if self.reason is not None:
            return
        self._see(frame, event, arg)
        if self.reason is not None:
            # Before the call that would change state: the trace stops, and nothing changed.
            raise _NotHoistable(self.reason)

    def _see(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "return":
            self._frames.pop(id(frame), None)
        elif event == "call":
            caller = frame.f_back
            if caller is None:
                return
            if caller.f_code is self._root:
                by_user = True
            elif id(caller) in self._frames:
                by_user = self._frames[id(caller)]
            else:
                return
            code = frame.f_code
            if code in self._collector:
                return
            if code.co_name == "run" and code.co_filename == _DISPATCH_FILE:
                self.reason = "it runs a scan or loop of its own"
                return
            if code.co_name in ("__torch_dispatch__", "__torch_function__"):
                return  # an operation entered torch's tracing machinery: not the step's Python
            where = _where(code.co_filename)
            if where == "user":
                write = _writes(code)
                if write is not None:
                    self.reason = f"{code.co_name} changes state ({write})"
                    return
            elif where.startswith("stdlib:") and by_user and where[7:] not in _SAFE_STDLIB:
                self.reason = f"it calls {where[7:]}.{code.co_name}"
                return
            self._frames[id(frame)] = where == "user"
        elif event == "c_call" and self._frames.get(id(frame)):
            self._c_call(arg)

    def _c_call(self, function: Any) -> None:
        name = getattr(function, "__name__", "")
        owner = getattr(function, "__self__", None)
        module = getattr(function, "__module__", None) or type(owner).__module__
        if owner is None or isinstance(owner, types.ModuleType):
            if name in _REFUSED_BUILTINS:
                self.reason = f"it calls {name}"
            elif module in _REFUSED_MODULES:
                self.reason = f"it calls {module}.{name}"
        elif id(owner) in self.containers and name in _MUTATORS:
            self.reason = f"it changes a captured {type(owner).__name__} ({name})"
        elif type(owner).__module__ in _REFUSED_MODULES:
            self.reason = f"it draws Python random numbers ({name})"


_VALUE_READS = {
    "item", "__bool__", "__int__", "__float__", "__complex__", "__index__", "tolist", "numpy",
    "__array__", "__format__", "__repr__", "__str__",
}  # fmt: skip

_TENSOR_OPERANDS = {
    "__get__", "size", "dim", "numel", "__len__", "stride", "storage_offset", "is_contiguous",
    "_is_view", "element_size", "is_floating_point", "is_complex", "nelement", "ndimension",
    "get_device", "untyped_storage", "add", "sub", "mul", "div", "true_divide",
    "floor_divide", "remainder", "fmod", "pow", "where", "eq", "ne", "lt", "le", "gt", "ge",
    "maximum", "minimum", "logical_and", "logical_or", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor", "to", "type_as", "clone", "detach", "neg", "abs",
    # functions whose every tensor argument is an operand (metadata, is_*, is read alike)
    "stack", "cat", "concat", "concatenate", "hstack", "vstack", "float", "double", "long",
    "int", "bool", "half", "sum", "mean", "prod", "amax", "amin", "exp", "log", "sqrt", "sin",
    "cos", "tanh", "sigmoid", "relu", "matmul", "mm", "bmm", "outer",
    *(f"__{op}__" for op in (
        "add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv",
        "rfloordiv", "mod", "rmod", "pow", "rpow", "and", "rand", "or", "ror", "xor", "rxor",
        "lt", "le", "gt", "ge", "eq", "ne", "neg", "invert", "matmul", "rmatmul",
    )),
}  # fmt: skip
"""Functions that read their tensor arguments as tensors: a captured 0-d integer tensor is an
operand there, not a number Python reads."""

_REFUSED_MODULES = {"random", "_random", "time", "numpy.random", "numpy.random.mtrand",
                    "logging", "_warnings"}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Tracing and splitting


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


def trace(
    fn: Callable[[Any, Any], Any],
    carry: Any,
    x: Any,
    walk: _Walk,
    check: Callable[[Any], Any],
) -> Hoisted:
    """Trace ``fn(carry, x)`` once and split it by class; :class:`_NotHoistable` if the rules of
    this module do not hold."""
    carry_leaves, carry_spec = _pytree.tree_flatten(carry)
    x_leaves, x_spec = _pytree.tree_flatten(x)
    carry_tensors = [i for i, leaf in enumerate(carry_leaves) if isinstance(leaf, torch.Tensor)]
    x_tensors = [i for i, leaf in enumerate(x_leaves) if isinstance(leaf, torch.Tensor)]
    n_carry = len(carry_tensors)
    shape: dict[str, Any] = {}

    def flat(*tensors: torch.Tensor) -> list[torch.Tensor]:
        c = list(carry_leaves)
        for i, t in zip(carry_tensors, tensors[:n_carry], strict=True):
            c[i] = t
        xl = list(x_leaves)
        for i, t in zip(x_tensors, tensors[n_carry:], strict=True):
            xl[i] = t
        out = fn(_pytree.tree_unflatten(c, carry_spec), _pytree.tree_unflatten(xl, x_spec))
        stop: list[torch.Tensor] = []
        if isinstance(out, tuple) and len(out) == 3 and type(out[2]) is Until:
            if not isinstance(out[2].stop, torch.Tensor):
                raise _NotHoistable(_REFUSED_RESULT)  # as the Python loop refuses it
            stop = [out[2].stop]
        elif not (isinstance(out, tuple) and len(out) == 2):
            raise _NotHoistable("it does not return (carry, y) or (carry, y, until(stop))")
        y_leaves = _pytree.tree_leaves(out[1])
        if any(leaf is not None and not isinstance(leaf, torch.Tensor) for leaf in y_leaves):
            raise _NotHoistable("it returns leaves that are not tensors")
        shape["fake"] = out
        shape["y_tensor"] = tuple(isinstance(leaf, torch.Tensor) for leaf in y_leaves)
        new_carry = [leaf for leaf in _pytree.tree_leaves(out[0]) if isinstance(leaf, torch.Tensor)]
        shape["until"] = bool(stop)
        return new_carry + [leaf for leaf in y_leaves if isinstance(leaf, torch.Tensor)] + stop

    inputs = [
        t.detach().requires_grad_(t.requires_grad)  # leaves: only their metadata is read
        for t in [carry_leaves[i] for i in carry_tensors] + [x_leaves[i] for i in x_tensors]
    ]
    previous = sys.getprofile()
    watch = _Watch(walk.containers, previous, flat.__code__)
    rng = torch.random.get_rng_state()
    gpus = {t.device for t in inputs if t.device.type == "cuda"}
    gpu_rngs = {device: torch.cuda.get_rng_state(device) for device in gpus}
    sys.setprofile(watch)
    try:
        with warnings.catch_warnings(), _NoWritesIntoRealTensors(), _SAVED_AS_THEY_ARE:
            warnings.simplefilter("ignore")  # torch's own, while it traces; the step's are refused
            gm = _compat.trace_on_fake(flat, inputs)
    except _NotHoistable:
        raise
    except Exception as error:
        raise _NotHoistable(_untraceable(error)) from error
    finally:
        sys.setprofile(previous)
        if not torch.equal(torch.random.get_rng_state(), rng):  # fake tensors draw nothing
            torch.random.set_rng_state(rng)
        for device, state in gpu_rngs.items():
            if not torch.equal(torch.cuda.get_rng_state(device), state):
                torch.cuda.set_rng_state(state, device)
    if watch.reason is not None:
        raise _NotHoistable(watch.reason)
    try:
        # the Python loop refuses it, in its words, and checks the carry's type
        shape["y_spec"] = _pytree.tree_structure(check(shape.pop("fake")))
    except Exception as error:
        raise _NotHoistable(_REFUSED_RESULT) from error
    return _split(gm, walk, n_carry, shape)


def _as_it_is(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


_SAVED_AS_THEY_ARE = torch.autograd.graph.saved_tensors_hooks(_as_it_is, _as_it_is)
"""Saved-tensor hooks that keep what the trace saves for backward from the hooks of the caller
(``torch.utils.checkpoint`` counts what a forward saves)."""


class _NoWritesIntoRealTensors(torch.overrides.TorchFunctionMode):
    """While a step is traced its arguments are fake tensors, and so is every tensor it makes;
    a real tensor is one it captures. Fake tensors would write into it for real: refuse the
    write before it happens. A value Python reads from it would be a constant of the graph:
    refuse the read (``.item()``, ``bool()``, a 0-d integer tensor as an index)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _VALUE_READS and args and type(args[0]) in _TENSORS:
            raise _NotHoistable(f"it reads the value of a captured tensor ({name})")
        writes = name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))
        writes = writes or (name.startswith("__i") and name.endswith("__") and name != "__index__")
        targets = [args[0]] if writes and args else []
        if "out" in kwargs:
            targets += _pytree.tree_leaves(kwargs["out"])
        for target in targets:
            if type(target) in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer):
                raise _NotHoistable(f"it writes in place into a captured tensor ({name})")
        if name not in _TENSOR_OPERANDS and not name.startswith("is_"):  # is_*: metadata
            for value in _pytree.tree_leaves((args, kwargs)):
                # a 0-d integer tensor that torch may read as an int (an index, a size, a start)
                if type(value) in _TENSORS and value.ndim == 0 and not value.is_floating_point():
                    raise _NotHoistable(f"it reads the value of a captured 0-d tensor ({name})")
        return func(*args, **kwargs)


def _untraceable(error: Exception) -> str:
    """Why a step does not trace, at the line of the user's code where it stopped."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if _source.is_users(f.filename)]
    at = (
        f" at {frames[-1].filename}:{frames[-1].lineno} ({(frames[-1].line or '').strip()})"
        if frames
        else ""
    )
    data = ("DataDependent", "GuardOnDataDependent", "DynamicOutputShape")
    if any(type(e).__name__.startswith(data) for e in (error, error.__cause__) if e is not None):
        why = f"it reads a tensor's value in Python or makes a shape from one{at}"
        if _source.in_torch_distributions(
            f.filename for f in traceback.extract_tb(error.__traceback__)
        ):
            why += f"; {_source.DISTRIBUTIONS_REMEDY[:-1]}"
        return why
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"it does not trace on fake tensors{at}: {type(error).__name__}: {first}"


def _split(gm: torch.fx.GraphModule, walk: _Walk, n_carry: int, shape: dict[str, Any]) -> Hoisted:
    graph = gm.graph
    graph.eliminate_dead_code()
    _without_copies(graph)
    by_id = {id(t): i for i, t in enumerate(walk.tensors)}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    carry_in, x_in = placeholders[:n_carry], placeholders[n_carry:]
    klass: dict[torch.fx.Node, int] = {}
    captured: dict[torch.fx.Node, int] = {}  # get_attr node -> walked tensor index
    fresh: dict[torch.fx.Node, torch.Tensor] = {}  # tensors the step makes from Python values
    for node in carry_in:
        klass[node] = _CARRY
    for node in x_in:
        klass[node] = _SEQUENCE
    output = next(n for n in graph.nodes if n.op == "output")
    for node in graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)  # type: ignore[arg-type]
            index = by_id.get(id(value))
            if index is not None:
                captured[node] = index
            elif all(
                user.op == "call_function" and user.target is torch.ops.aten.lift_fresh_copy.default
                for user in node.users
            ):
                fresh[node] = value
            else:
                raise _NotHoistable("it reads a tensor that its signature does not reach")
            klass[node] = _CONSTANT
        elif node.op not in ("placeholder", "output", "call_function"):
            raise _NotHoistable(f"its graph has a {node.op} node")
    # A write in place into a value runs where the value is made: a value written at every
    # step (a random mask drawn into an empty tensor) is made at every step. Raise the class
    # of what is written into until nothing changes.
    floor: dict[torch.fx.Node, int] = {}
    for _ in range(_CARRY + 1):
        for node in graph.nodes:
            if node.op == "call_function":
                klass[node] = max(_classify(node, klass), floor.get(node, _CONSTANT))
        raised = False
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            for written in _written(node):
                for value in (written, _root(written)):
                    if value.op == "call_function" and klass[value] < klass[node]:
                        floor[value] = klass[node]
                        raised = True
        if not raised:
            break
    else:
        raise _NotHoistable("it writes in place into values of several classes")
    outputs: list[Any] = list(output.args[0])  # type: ignore[arg-type]
    lifted = sorted(set(captured.values()))

    def crossing(level: int) -> list[torch.fx.Node]:
        """The nodes of ``level`` that a node of a later class (or the output) reads."""
        needed: dict[torch.fx.Node, None] = {}
        for node in graph.nodes:
            if node.op == "output" or (node.op == "call_function" and klass[node] > level):
                for source in node.all_input_nodes:
                    if klass.get(source) == level and source.op != "placeholder":
                        needed[source] = None
        return list(needed)

    nodes = [n for n in graph.nodes if n.op in ("get_attr", "call_function")]
    constant_out = crossing(_CONSTANT)
    sequence_out = crossing(_SEQUENCE)
    x_used = tuple(
        i for i, node in enumerate(x_in) if any(klass.get(u, _CARRY) == _CARRY for u in node.users)
    )
    names: dict[torch.fx.Node, str] = {}
    for k, index in enumerate(lifted):
        for node, i in captured.items():
            if i == index:
                names[node] = f"captured_{k}"
    once = _generate(
        "once",
        [f"captured_{k}" for k in range(len(lifted))],
        [n for n in nodes if klass[n] == _CONSTANT],
        constant_out,
        dict(names),
        fresh,
        fast=True,  # run at every call, like the loop
    )
    over_names = {node: f"x_{i}" for i, node in enumerate(x_in)}
    over_names.update({node: f"constant_{k}" for k, node in enumerate(constant_out)})
    over = _generate(
        "over",
        [
            *(f"x_{i}" for i in range(len(x_in))),
            *(f"constant_{k}" for k in range(len(constant_out))),
        ],
        [n for n in nodes if klass[n] == _SEQUENCE],
        sequence_out,
        over_names,
        fresh,
        fast=False,
    )
    columns = [*sequence_out, *(x_in[i] for i in x_used)]
    loop_names = {node: f"k_{len(lifted) + j}" for j, node in enumerate(constant_out)}
    loop_names.update({node: f"k_{lifted.index(i)}" for node, i in captured.items()})
    loop, source = _generate_loop(
        carry_in,
        columns,
        len(lifted) + len(constant_out),
        [n for n in nodes if klass[n] == _CARRY],
        outputs[:n_carry],
        outputs[n_carry : len(outputs) - shape["until"]],
        loop_names,
        outputs[-1] if shape["until"] else None,
    )
    # Below BATCH_FROM steps the sequence part runs at every step, in the loop: batching it
    # costs more than it saves there.
    inline, _ = _generate_loop(
        carry_in,
        list(x_in),
        len(lifted) + len(constant_out),
        [n for n in nodes if klass[n] in (_SEQUENCE, _CARRY) and n.op != "placeholder"],
        outputs[:n_carry],
        outputs[n_carry : len(outputs) - shape["until"]],
        loop_names,
        outputs[-1] if shape["until"] else None,
    )
    return Hoisted(
        once=once,
        over=over,
        loop=loop,
        inline=inline,
        captured=tuple(lifted),
        x_used=x_used,
        y_tensor=shape["y_tensor"],
        y_spec=shape["y_spec"],
        y_leaf=_pytree.is_leaf_spec(shape["y_spec"]) and shape["y_tensor"] == (True,),
        sequence_count=len(sequence_out),
        sequence_bytes=sum(_bytes(n) for n in sequence_out),
        source=source,
        stops=bool(shape["until"]),
        operations=tuple(
            str(getattr(n.target, "__name__", n.target))
            for n in nodes
            if klass[n] == _CARRY and n.op == "call_function"
        ),
    )


_COPIES = (torch.ops.aten.clone.default, torch.ops.aten._to_copy.default)


def _without_copies(graph: torch.fx.Graph) -> None:
    """The graph without the copies that change nothing it computes.

    Reference implementations copy values before they update them (``S = S.clone()``, then
    ``S = S + k * v`` or ``S += k * v``; ``v[:, i].clone()``), which costs a copy per step:

    * a copy (``clone``, ``to`` of the same dtype and device) with the strides of its source,
      into which nothing writes, of a source into which nothing writes, that is not an output
      (the carry or ``y`` returned must not be the caller's tensor), is its source;
    * a copy written into once, by an operation with a functional form (``add_``, ``mul_``,
      ...), is that functional operation on its source (a new tensor, returned or not), where
      it gives the dtype, shape and strides of the copy, nothing wrote into the source between
      them and nothing read a view of the copy before the write.
    """
    nodes = list(graph.nodes)
    order = {node: i for i, node in enumerate(nodes)}
    output = nodes[-1]
    outputs = {_root(n) for n in _pytree.tree_leaves(output.args) if isinstance(n, torch.fx.Node)}
    writes: dict[torch.fx.Node, list[int]] = {}  # root -> positions of the writes into it
    for node in nodes:
        for written in _written(node):
            writes.setdefault(_root(written), []).append(order[node])
    for node in nodes:
        if node.op != "call_function" or node.target not in _COPIES:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node) or not _same_layout(node, source):
            continue
        source_writes = writes.get(_root(source), [])
        if node in writes:
            _fold_copy_into_write(graph, node, source, order, writes[node], source_writes)
        elif node not in outputs and not any(at > order[node] for at in source_writes):
            node.replace_all_uses_with(source)
            graph.erase_node(node)


def _fold_copy_into_write(
    graph: torch.fx.Graph,
    copy: torch.fx.Node,
    source: torch.fx.Node,
    order: dict[torch.fx.Node, int],
    copy_writes: list[int],
    source_writes: list[int],
) -> None:
    """``copy = clone(source); copy.add_(v)`` as ``add(source, v)`` (see :func:`_without_copies`):
    what reads the copy before the write (no view: a view would see the write) reads
    ``source``, what reads it after reads the new tensor."""
    if len(copy_writes) != 1:
        return
    write = next((user for user in copy.users if order[user] == copy_writes[0]), None)
    if (
        write is None
        or write.args[:1] != (copy,)
        or copy in (*write.args[1:], *write.kwargs.values())
    ):
        return
    before = [user for user in copy.users if order[user] < order[write]]
    if any(
        not isinstance(user.target, _compat.OpOverload) or user.target.is_view for user in before
    ) or any(order[copy] < at <= order[write] for at in source_writes):
        return
    target = write.target
    if not isinstance(target, _compat.OpOverload):
        return
    name = target.overloadpacket.__name__
    packet = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") else None
    functional = getattr(packet, target._overloadname, None) if packet is not None else None
    if functional is None or functional._schema.arguments[0].is_write:
        return
    value = copy.meta.get("val")
    if not isinstance(value, _compat.FakeTensor):
        return
    arguments = [source, *write.args[1:]]
    try:
        with value.fake_mode:
            made = functional(*_pytree.tree_map(_meta_value, arguments), **write.kwargs)
    except Exception:  # the functional form does not take these arguments
        return
    if not (
        isinstance(made, torch.Tensor)
        and made.dtype == value.dtype
        and made.shape == value.shape
        and made.stride() == value.stride()
    ):
        return
    with graph.inserting_before(write):
        folded = graph.call_function(functional, tuple(arguments), dict(write.kwargs))
    folded.meta = dict(write.meta)
    folded.meta["val"] = made
    for user in before:
        user.replace_input_with(copy, source)
    write.replace_all_uses_with(folded)
    copy.replace_all_uses_with(folded)
    graph.erase_node(write)
    graph.erase_node(copy)


def _meta_value(value: Any) -> Any:
    return value.meta["val"] if isinstance(value, torch.fx.Node) else value


def _same_layout(copy: torch.fx.Node, source: torch.fx.Node) -> bool:
    """Whether ``copy`` has the dtype, device, shape and strides of ``source``."""
    a, b = copy.meta.get("val"), source.meta.get("val")
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.device == b.device
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def _classify(node: torch.fx.Node, klass: dict[torch.fx.Node, int]) -> int:
    """The class of an operation: that of its latest input, every step for a random one;
    refuse a write in place into an input or a captured tensor."""
    level = max((klass[n] for n in node.all_input_nodes), default=_CONSTANT)
    target = node.target
    if target is operator.getitem:
        return level
    if not isinstance(target, _compat.OpOverload):
        raise _NotHoistable(f"it calls {target}")
    if torch.Tag.nondeterministic_seeded in target.tags:
        level = _CARRY  # random: at every step, in the loop's order
    for written in _written(node):
        if _root(written).op in ("placeholder", "get_attr"):
            raise _NotHoistable(f"it writes in place into an input or captured tensor ({target})")
    return level


def _written(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The values an operation writes into, as its schema says (``Tensor(a!)``)."""
    _, written = _compat.written_arguments(node)
    flat = [
        item
        for value in written
        for item in (value if isinstance(value, (list, tuple)) else [value])
    ]
    return [item for item in flat if isinstance(item, torch.fx.Node)]


def _bytes(node: torch.fx.Node) -> int:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return 0


def _root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` views (following view operations)."""
    while node.op == "call_function":
        target = node.target
        if target is not operator.getitem and not (
            isinstance(target, _compat.OpOverload) and target.is_view
        ):
            break
        node = node.args[0]  # type: ignore[assignment]
    return node


def _callable(target: Any, fast: bool) -> Any:
    """What a generated function calls for ``target``: with ``fast``, the function of the
    ``torch`` namespace that the operator's overload packet names where there is one (it
    resolves the same overload from the same arguments, and is called at less cost than the
    overload), else the operator."""
    if fast and isinstance(target, _compat.OpOverload):
        function = _compat.torch_function_of(target)
        if function is not None:
            return function
    return target


class _Source:
    """The source of a generated function, and the objects it reads as globals."""

    def __init__(self, names: dict[torch.fx.Node, str], fresh: dict[torch.fx.Node, torch.Tensor]):
        self.names = names
        self.fresh = fresh
        self.globals: dict[str, Any] = {"operator": operator}
        self.lines: list[str] = []
        self._ids: dict[int, str] = {}

    def value(self, obj: Any) -> str:
        if isinstance(obj, torch.fx.Node):
            if obj in self.names:
                return self.names[obj]
            return self.constant(self.fresh[obj])
        if isinstance(obj, (list, tuple)):
            items = ", ".join(self.value(item) for item in obj)
            return (
                f"[{items}]"
                if isinstance(obj, list)
                else f"({items}{',' if len(obj) == 1 else ''})"
            )
        if isinstance(obj, (bool, int, str)) or obj is None:
            return repr(obj)
        return self.constant(obj)

    def constant(self, obj: Any) -> str:
        name = self._ids.get(id(obj))
        if name is None:
            name = self._ids[id(obj)] = f"g_{len(self.globals)}"
            self.globals[name] = obj
        return name

    def operation(self, node: torch.fx.Node, fast: bool, indent: str) -> None:
        if node in self.names:  # an argument of the function
            return
        name = self.names[node] = f"v_{len(self.names)}"
        if node.op == "get_attr":
            self.lines.append(f"{indent}{name} = {self.constant(self.fresh[node])}")
            return
        if node.target is operator.getitem:
            base, index = node.args
            self.lines.append(f"{indent}{name} = {self.value(base)}[{int(index)}]")  # type: ignore[call-overload]
            return
        function = self.constant(_callable(node.target, fast))
        arguments = [self.value(a) for a in node.args]
        arguments += [f"{k}={self.value(v)}" for k, v in node.kwargs.items()]
        self.lines.append(f"{indent}{name} = {function}({', '.join(arguments)})")

    def compile(self, name: str) -> Callable[..., Any]:
        text = "\n".join(self.lines) + "\n"
        namespace = dict(self.globals)
        exec(compile(text, f"<torchscan hoisted {name}>", "exec"), namespace)
        return namespace[name]


def _generate(
    name: str,
    parameters: Sequence[str],
    nodes: Sequence[torch.fx.Node],
    outputs: Sequence[torch.fx.Node],
    names: dict[torch.fx.Node, str],
    fresh: dict[torch.fx.Node, torch.Tensor],
    *,
    fast: bool,
) -> Callable[..., list[Any]]:
    source = _Source(names, fresh)
    source.lines.append(f"def {name}({', '.join(parameters)}):")
    for node in nodes:
        source.operation(node, fast, "    ")
    source.lines.append(f"    return [{', '.join(source.value(n) for n in outputs)}]")
    return source.compile(name)


def _generate_loop(
    carry: Sequence[torch.fx.Node],
    columns: Sequence[torch.fx.Node],
    n_fixed: int,
    nodes: Sequence[torch.fx.Node],
    carry_out: Sequence[Any],
    y_out: Sequence[Any],
    fixed_names: dict[torch.fx.Node, str],
    stop: Any,
) -> tuple[Callable[..., Any], str]:
    """``loop(carry, columns, fixed, order)``: the Python loop of the carry's class; with
    ``stop`` (what ``until`` returns), the step that returns a true one is the last."""
    names = dict(fixed_names)
    for i, node in enumerate(carry):
        names[node] = f"c_{i}"
    for i, node in enumerate(columns):
        names[node] = f"s_{i}"
    source = _Source(names, {})
    lines = source.lines
    lines.append("def loop(carry, columns, fixed, order):")
    for count, prefix, group in (
        (len(carry), "c", "carry"),
        (len(columns), "column", "columns"),
        (n_fixed, "k", "fixed"),
    ):
        if count:
            lines.append(f"    {', '.join(f'{prefix}_{i}' for i in range(count))}, = {group}")
    for i in range(len(y_out)):
        lines.append(f"    ys_{i} = []")
    lines.append("    ran = 0")
    lines.append("    for t in order:")
    lines.append("        ran += 1")
    read = {a for n in nodes for a in n.all_input_nodes} | {
        v for v in (*carry_out, *y_out, stop) if isinstance(v, torch.fx.Node)
    }
    for i, node in enumerate(columns):
        if node in read:  # (a column nothing reads, a step number the body ignores: not taken)
            lines.append(f"        s_{i} = column_{i}[t]")
    for node in nodes:
        source.operation(node, True, "        ")
    for i, node in enumerate(y_out):  # before the carry changes: y may be the old carry
        lines.append(f"        ys_{i}.append({source.value(node)})")
    if stop is not None:
        lines.append(f"        stop = {source.value(stop)}")
    if carry:
        new = ", ".join(source.value(n) for n in carry_out)
        lines.append(f"        {', '.join(f'c_{i}' for i in range(len(carry)))}, = {new},")
    if stop is not None:
        lines.append("        if stop:")
        lines.append("            break")
    if not nodes and not carry and not y_out:
        lines.append("        pass")
    carry_list = ", ".join(f"c_{i}" for i in range(len(carry)))
    ys_list = ", ".join(f"ys_{i}" for i in range(len(y_out)))
    lines.append(f"    return [{carry_list}], [{ys_list}], ran")
    return source.compile("loop"), "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The cache and the runner


_cache: collections.OrderedDict[Any, Any] = collections.OrderedDict()
traces = 0
"""How many steps were traced (for tests: a signature is traced once)."""


def signature(fn: Callable[..., Any], arguments: Any) -> tuple[Any, _Walk]:
    """The key of a step's signature (what it captures, its arguments' :func:`signature_arguments`,
    and the grad mode), and the walk that read it. The modules it reaches are read again only
    where they changed (:func:`_module_walk`): a step made anew at every call (a closure, a
    bound method) is walked quickly."""
    walk = _Walk()
    key = _Key(walk.key(fn))
    walk.finish()
    return (key, arguments, torch.is_grad_enabled()), walk


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
    fn: Callable[[Any, Any], Any],
    step_arguments: Any,
    arguments: Callable[[], tuple[Any, Any]],
    check: Callable[[Any], Any],
    *,
    now: bool,
) -> tuple[Hoisted, _Walk] | None:
    """The hoisted step of this signature, traced at its call :data:`TRACE_AT_CALL` (a step
    called once or twice is not worth a trace) or, with ``now``, at its first; ``None`` where it
    runs as the Python loop."""
    global traces
    try:
        key, walk = signature(fn, step_arguments)
    except _NotHoistable as reason:
        _outcome("loop", str(reason))
        return None
    entry = _cache.get(key, 0)
    if isinstance(entry, Hoisted):
        _cache.move_to_end(key)
        _outcome("hoisted")
        return entry, walk
    if isinstance(entry, _Refused):
        _outcome("loop", entry.reason)
        return None
    if isinstance(entry, int) and entry < TRACE_AT_CALL - 1 and not now:
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


AUTO_MEMORY_LIMIT = 1 << 30
"""With ``hoist=None``, a scan whose sequence values, batched over every step, would take more
bytes than this computes them at every step instead (as the Python loop does)."""


def eligible(plan: ScanPlan) -> bool:
    """Whether the context of ``plan`` lets it be hoisted at all (read before its signature)."""
    if plan.hoist is False or plan.direction is None or not isinstance(plan.length, int):
        return False
    if torch.is_autocast_enabled() or torch.is_inference_mode_enabled():
        return False
    return not _compat.functorch_transforms_active()


def scan(plan: ScanPlan) -> tuple[Any, Any] | None:
    """The steps of ``plan`` with the work that does not depend on the carry done once; ``None``
    where the step cannot be hoisted, and runs as the Python loop."""
    return _run(plan)


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


def _run(plan: ScanPlan) -> tuple[Any, Any] | None:
    reverse = plan.direction[0]  # type: ignore[index]
    n = plan.length
    carry_type = plan.carry
    x_key = signature_arguments(plan)
    if x_key is None:
        return None
    protocol = plan.protocol

    def first_step() -> tuple[Any, Any]:
        first = n - 1 if reverse else 0
        x_leaves = [
            None if leaf is None or a is None else leaf.select(a, first)  # None: no axis
            for leaf, a in zip(plan.xs_leaves, plan.in_axes, strict=True)
        ]
        return carry_type.init, _pytree.tree_unflatten(x_leaves, plan.xs_spec)

    found = lookup(
        plan.fn,
        x_key,
        first_step,
        lambda out: protocol.check_fake_result(out, carry_type, plan.out),
        # under saved-tensor hooks a recomputation (torch.utils.checkpoint's) must take the
        # path its forward took, whatever the calls between them: traced at the first call
        now=plan.hoist is True or _compat.saved_tensors_hooks_active(),
    )
    if found is None:
        # (a step whose result the Python loop refuses is refused there, without a warning)
        if plan.hoist is True and last.what == "loop" and last.reason != _REFUSED_RESULT:
            _warn(plan, last.reason)
        return None
    hoisted, walk = found
    captured = [walk.tensors[i] for i in hoisted.captured]
    once = hoisted.once(*captured)
    xs = [leaf for leaf in plan.xs_leaves if leaf is not None]
    axes = [a for a in plan.in_axes if a is not None]  # those of the tensors, as xs
    carry = [leaf for leaf in carry_type.leaves if leaf is not None]
    order = range(n - 1, -1, -1) if reverse else range(n)
    too_big = plan.hoist is None and hoisted.sequence_bytes * n > AUTO_MEMORY_LIMIT
    if too_big:
        _outcome(
            "hoisted",
            "the sequence part runs at every step: batched, it would take more "
            "than AUTO_MEMORY_LIMIT bytes",
        )
    if n < BATCH_FROM or not hoisted.sequence_count or too_big:
        # a loop that may stop early takes each step's slice as it comes to it
        columns = [
            _Slices(x, a) if hoisted.stops else x.unbind(a) for x, a in zip(xs, axes, strict=True)
        ]
        loop = hoisted.inline
    else:
        try:
            sequences = _compat.map_over(hoisted.over, list(zip(xs, axes, strict=True)), once)
        except Exception as error:
            reason = f"vmap cannot batch it ({type(error).__name__}: {error})"
            refuse(plan.fn, x_key, reason)
            _warn(plan, reason)
            return None
        columns = [s.unbind(0) for s in sequences]
        columns += [xs[i].unbind(axes[i]) for i in hoisted.x_used]
        loop = hoisted.loop
    carry_out, y_columns, _ = loop(carry, columns, [*captured, *once], order)
    if carry_type.single:
        final_carry: Any = carry_out[0]
    else:
        tensors = iter(carry_out)
        final = [next(tensors) if leaf is not None else None for leaf in carry_type.leaves]
        final_carry = _pytree.tree_unflatten(final, carry_type.spec)
    # Every step's y has the types the trace checked: stacked without checking them again.
    layout, flags = plan.out, hoisted.y_tensor
    if layout.axes_prefix is None and isinstance(layout.reverse_prefix, bool):
        axes = [layout.axis] * len(y_columns)
        reverses = [layout.reverse_prefix] * len(y_columns)
    else:
        y_first = _pytree.tree_unflatten(
            _fill([column[0] for column in y_columns], flags), hoisted.y_spec
        )
        axes = [a for a, t in zip(layout.axes(y_first), flags, strict=True) if t]
        reverses = [r for r, t in zip(layout.reverse(y_first), flags, strict=True) if t]
    stacked = [
        torch.stack(column[::-1] if backwards else column, axis)
        for column, axis, backwards in zip(y_columns, axes, reverses, strict=True)
    ]
    if hoisted.y_leaf:
        return final_carry, stacked[0]
    return final_carry, _pytree.tree_unflatten(_fill(stacked, flags), hoisted.y_spec)


class _Slices:
    """``x.unbind(axis)`` taken one step at a time: ``[t]`` is ``x.select(axis, t)``."""

    __slots__ = ("axis", "x")

    def __init__(self, x: torch.Tensor, axis: int) -> None:
        self.x, self.axis = x, axis

    def __getitem__(self, t: int) -> torch.Tensor:
        return self.x.select(self.axis, t)


def _warn(plan: ScanPlan, reason: str) -> None:
    """With ``hoist=True``, say why the step runs as the Python loop instead."""
    source = _source.StepSource.of(plan.user, plan.protocol.api, plan.protocol.fn_name)
    where = f", defined at {source.defined}" if source.defined else ""
    warnings.warn(
        f"{source.who}{where} is not hoisted although hoist=True: {reason}. It runs as the "
        "Python loop, every step as written.",
        HoistWarning,
        stacklevel=_users_frame(),
    )


def _users_frame() -> int:
    """The ``stacklevel`` of the first frame of the user's code that calls this one."""
    frame, level = sys._getframe(1), 1
    while frame is not None and not _source.is_users(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def _fill(tensors: Sequence[Any], flags: Sequence[bool]) -> list[Any]:
    it = iter(tensors)
    return [next(it) if flag else None for flag in flags]
