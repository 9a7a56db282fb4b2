"""torchscan's error classes: every error torchscan raises itself is a ``TorchscanError`` and an
instance of the builtin that says what kind of mistake it is, recognised by ``isinstance``."""

from __future__ import annotations

import ast
import builtins
import pickle
import sys
from pathlib import Path

import pytest
import torch

import torchscan
import torchscan.onnx
import torchscan.theano
from torchscan import ExportError, TorchscanError, TorchscanTypeError, TorchscanValueError

PACKAGE = Path(torchscan.__file__).parent


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (TorchscanTypeError, TypeError),
        (TorchscanValueError, ValueError),
        (ExportError, NotImplementedError),
        (torchscan.onnx.OpsetConversionError, NotImplementedError),
    ],
)
def test_each_class_is_a_torchscan_error_and_its_builtin(error: type, builtin: type) -> None:
    assert issubclass(error, TorchscanError)
    assert issubclass(error, builtin)


def _add(carry, x):
    return carry + x, carry


CASES = {
    "scan: carry changes dtype": (
        lambda: torchscan.scan(lambda c, x: (c.double(), c), torch.zeros(2), torch.ones(3, 2)),
        TorchscanTypeError,
    ),
    "scan: axis out of range": (
        lambda: torchscan.scan(_add, torch.zeros(2), torch.ones(3, 2), axis=5),
        TorchscanValueError,
    ),
    "scan: fn not callable": (
        lambda: torchscan.scan(1, torch.zeros(2), torch.ones(3, 2)),
        TypeError,
    ),
    "loop: never ends": (
        lambda: torchscan.loop(lambda i, c: (c, None), torch.zeros(2)),
        ValueError,
    ),
    "theano: bad truncate_gradient": (
        lambda: torchscan.theano.scan(lambda x: x, sequences=[torch.ones(3)], truncate_gradient=-2),
        TorchscanValueError,
    ),
    "check: not a model": (lambda: torchscan.onnx.check(b""), TorchscanValueError),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_errors_of_every_front_end_are_torchscan_errors(case: str) -> None:
    run, expected = CASES[case]
    with pytest.raises(expected) as info:
        run()
    assert isinstance(info.value, TorchscanError)
    assert str(info.value).startswith(f"{APIS[case.partition(':')[0]]}: ")


APIS = {
    "scan": "torchscan.scan",
    "loop": "torchscan.loop",
    "theano": "torchscan.theano.scan",
    "check": "torchscan.onnx.check",
}
"""The API each case of :data:`CASES` calls, which its message starts with."""


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_errors_pickle_with_their_class_and_message(case: str) -> None:
    """multiprocessing, a DataLoader's workers and DDP pass an error to the parent pickled."""
    run, expected = CASES[case]
    with pytest.raises(expected) as info:
        run()
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is type(info.value)
    assert str(copy) == str(info.value)
    assert copy.args == info.value.args


def _error_classes() -> list[type[BaseException]]:
    """Every exception class torchscan defines, public or private: those found in the namespace
    of every module of the package, and their subclasses."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(torchscan.__path__, "torchscan."):
        importlib.import_module(info.name)
    found: set[type[BaseException]] = set()
    for name, module in list(sys.modules.items()):
        if name != "torchscan" and not name.startswith("torchscan."):
            continue
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__.partition(".")[0] == "torchscan"
            ):
                found.add(value)
    todo = list(found)
    while todo:
        for subclass in todo.pop().__subclasses__():
            if subclass not in found:
                found.add(subclass)
                todo.append(subclass)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _instance(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` as torchscan makes one."""
    import argparse

    from torchscan._autoloop._runtime import _Fallback
    from torchscan._cli import _UsageError
    from torchscan._source import StepSource
    from torchscan._traced._body import InPlaceWrite, Written
    from torchscan._traced._indexing import DataDependentSlice
    from torchscan.onnx._check._limit import TimedOut
    from torchscan.onnx._check._runtimes import _ChildError

    if cls is torchscan.onnx.OpsetConversionError:
        return cls("Scan", 9, 8, "Scan-8 has no scan_input_axes", node="scan")
    if cls is DataDependentSlice:
        return cls("model.py:3", "the shape of y needs it")
    if cls is InPlaceWrite:
        step = StepSource.of(lambda c, x: (c, x), "torchscan.scan", "fn")  # holds a lambda
        return cls(step, [Written(None, "self.count", "add_", " at model.py:4")])
    if cls is TimedOut:
        return cls(2.5)
    if cls is _ChildError:
        return cls("Fail", "onnxruntime: a node failed")
    if cls is _Fallback:
        return cls("the loop runs 3 steps", ValueError("the user's own error"))
    if cls is _UsageError:
        return cls(argparse.ArgumentParser(prog="torchscan"), "unrecognized arguments: --x")
    if cls is torchscan.onnx.OnnxImportError:
        return cls("torchscan.onnx.to_torch: node 'a' (Foo)", not_implemented=True)
    return cls("torchscan.scan: a refusal")


def _pickles(value: object) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_exception_class_pickles_with_its_message_and_attributes(cls: type) -> None:
    """Public and private alike: an error raised in a worker (multiprocessing, a DataLoader's
    workers, DDP, the check tool's child process) reaches the parent as what it is."""
    error = _instance(cls)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.args == error.args
    # every attribute but those that do not pickle (a lambda, an argument parser)
    expected = {k: repr(v) for k, v in vars(error).items() if _pickles(v)}
    assert {k: repr(v) for k, v in vars(copy).items()} == expected
    builtin = next(b for b in cls.__mro__ if b.__module__ == "builtins" and b is not object)
    assert isinstance(copy, builtin)


def test_every_exception_class_is_found() -> None:
    names = {c.__qualname__ for c in _error_classes()}
    assert {"TorchscanError", "TimedOut", "_ChildError", "_Fallback", "_NotHoistable"} <= names


# Builtin exceptions raised on purpose that are not torchscan's refusals: argparse's own error
# type in the command line, a missing dependency, and internal states that no user input reaches.
ALLOWED = {
    ("_cli.py", "ArgumentTypeError"),
    ("onnx/__init__.py", "AttributeError"),  # a module's __getattr__ for a name it lacks
    ("onnx/_check/_inputs.py", "FileNotFoundError"),
    ("onnx/_files.py", "FileNotFoundError"),
    # onnx.reference's convention for what an operator does not run: "not supported" in reports
    ("onnx/_check/_reference_ops.py", "NotImplementedError"),
    ("onnx/_check/_runtimes.py", "RuntimeError"),
    ("onnx/_export/_translate.py", "RuntimeError"),
    # what a missing dependency raises in Python: the onnx extra not installed
    ("onnx/_extra.py", "ImportError"),
}


def _raised_builtins(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name.endswith("Error") and (hasattr(builtins, name) or name == "ArgumentTypeError"):
                found.add(name)
    return found


def test_the_package_raises_its_own_classes() -> None:
    raised = {
        (str(path.relative_to(PACKAGE)), name)
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name not in ("_compat.py", "_errors.py")
        for name in _raised_builtins(path)
    }
    assert raised <= ALLOWED, f"raise torchscan's error classes instead: {sorted(raised - ALLOWED)}"


def _chain() -> RuntimeError:
    """torch.onnx's error raised from torchscan's refusal, which was raised, from None, while
    handling another refusal."""
    try:
        try:
            raise TorchscanValueError("torchscan: the refusal handled first")
        except TorchscanValueError:
            raise ExportError("torchscan: the refusal that stands") from None
    except ExportError as refusal:
        try:
            raise RuntimeError("torch.onnx could not export the model") from refusal
        except RuntimeError as wrapped:
            return wrapped


def test_the_refusal_torch_onnx_wrapped_is_found_by_class() -> None:
    from torchscan._torch_onnx_hook import _torchscan_cause

    wrapped = _chain()
    assert str(_torchscan_cause(wrapped)) == "torchscan: the refusal that stands"
    assert _torchscan_cause(wrapped.__cause__) is wrapped.__cause__
    plain = RuntimeError("wrapped")
    plain.__cause__ = ValueError("torchscan: a message alone does not make a torchscan error")
    assert _torchscan_cause(plain) is None


def test_the_message_stays_torchscans_own() -> None:
    """torch's graph interpreter rewrites ``args`` of an error that passes through it (a loop
    body traced again while torch decomposes the program) to append what it was running."""
    refusal = ExportError("torchscan: the refusal")
    refusal.args = ("torchscan: the refusal\n\nWhile executing %torchscan_scan",)
    assert str(refusal) == "torchscan: the refusal"
    assert refusal.args == ("torchscan: the refusal",)
    assert repr(refusal) == "ExportError('torchscan: the refusal')"
