"""The trace of a step on fake tensors into a graph of ATen operations, watching the Python it
runs so that tracing changes no state (:class:`_Watch`), and refusing writes into real tensors."""

from __future__ import annotations

import functools
import gc
import os
import sys
import sysconfig
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from torchscan import _compat, _pytree, _source
from torchscan._hoist._signature import _REFUSED_RESULT, _TENSORS, Hoisted, _NotHoistable, _Walk
from torchscan._hoist._split import _split
from torchscan._until import Until

_TORCH_DIR = os.path.dirname(torch.__file__)
_TORCHSCAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
