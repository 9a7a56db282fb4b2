"""torchscan's error classes.

Every error torchscan raises itself is a :class:`TorchscanError`, and also an instance of the
builtin exception that says what kind of mistake it is: a ``TypeError`` for a value of the wrong
type, structure, shape or dtype, a ``ValueError`` for a wrong value, a ``NotImplementedError``
for a loop that runs eagerly but cannot be exported as asked. Code that expects the builtins keeps
working; code that wants to tell torchscan's refusals from errors of its own function or of torch
catches ``TorchscanError``. Every message starts with the function that refused (``torchscan.scan:
...``), names the offending leaf by its pytree path (``carry['h']``, ``xs[1]``) and says what to do.

Every warning torchscan gives itself is a :class:`TorchscanWarning`, a ``UserWarning``: an export
that succeeds, but whose model will not run where users are likely to run it.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from typing import Any

__all__ = [
    "ExportError",
    "TorchscanError",
    "TorchscanTypeError",
    "TorchscanValueError",
    "TorchscanWarning",
]


class TorchscanError(Exception):
    """The base class of every error torchscan raises itself."""

    # Tracebacks and reprs name the classes where users import them from.
    __module__ = "torchscan"

    # torch's graph interpreter appends what it was running to the ``args`` of an error that
    # passes through it (a loop body traced again while torch decomposes the program): the
    # message stays torchscan's own. (A property rather than ``__init__``, which TorchDynamo
    # could not trace when it raises one.)
    @property  # type: ignore[override]
    def args(self) -> tuple[object, ...]:
        return BaseException.args.__get__(self)  # type: ignore[attr-defined]

    @args.setter
    def args(self, value: tuple[object, ...]) -> None:
        pass

    def __reduce__(self) -> str | tuple[Any, ...]:
        return reduce_error(self)


def reduce_error(self: BaseException) -> str | tuple[Any, ...]:
    """What pickles the error ``self``, as an exception class's ``__reduce__`` (``__reduce__ =
    reduce_error``): rebuilt without calling ``__init__`` (whose parameters differ between
    classes), with the message and the attributes that pickle, so that an error raised in a
    worker process (multiprocessing, DataLoader, DDP, the check tool's child process) reaches
    the parent as what it is. An attribute that does not pickle (the user's step function, a
    lambda, an argument parser) is left out."""
    state = {}
    for name, value in vars(self).items():
        try:
            pickle.dumps(value)
        except Exception:
            continue
        state[name] = value
    return (_rebuild, (type(self), BaseException.args.__get__(self), state))  # type: ignore[attr-defined]


def _rebuild(
    cls: type[BaseException], args: tuple[object, ...], state: dict[str, object]
) -> BaseException:
    """An error of class ``cls`` with ``args`` and the attributes ``state``, as pickled."""
    error = cls.__new__(cls)
    BaseException.args.__set__(error, args)  # type: ignore[attr-defined]
    vars(error).update(state)
    return error


class TorchscanTypeError(TorchscanError, TypeError):
    """An argument, or a value the step function returned, of the wrong type, pytree structure,
    shape, dtype or device."""

    __module__ = "torchscan"


class TorchscanValueError(TorchscanError, ValueError):
    """An argument of the right type with a wrong value (an axis out of range, a negative
    length), or a model the check tool cannot run as given."""

    __module__ = "torchscan"


class ExportError(TorchscanError, NotImplementedError):
    """A loop that runs eagerly but cannot be exported as asked; the message says why and what
    to do instead."""

    __module__ = "torchscan"


class OnnxImportError(TorchscanError, ValueError):
    """An ONNX model that ``torchscan.onnx.to_torch`` cannot turn into a module: an operator (or
    a version of one) it does not implement, a model that fails ``onnx.checker``, or a node whose
    inputs break its operator's rules; the message names the node.

    Attributes:
      not_implemented: True where what is refused is a limit of ``to_torch`` or of torch (an
        operator, a version of one, an element type or a case that is not implemented), rather
        than a fault of the model; ``torchscan check`` reports such a model as not supported by
        its ``torch`` runtime, not as failed.
    """

    __module__ = "torchscan.onnx"

    def __init__(self, message: str, *, not_implemented: bool = False) -> None:
        super().__init__(message)
        self.not_implemented = not_implemented


class TorchscanWarning(UserWarning):
    """The base class of every warning torchscan gives itself: an export that succeeds, but whose
    model a common runtime will not run as it is (the message says which, and what to do); a
    step given ``hoist=True`` that cannot be hoisted."""

    __module__ = "torchscan"


class HoistWarning(TorchscanWarning):
    """``scan(..., hoist=True)`` with a step that cannot be hoisted: it runs as the Python loop,
    every step as written. The message names the step, where it is defined, and why (the line
    of the step that reads a tensor's value, the state it changes)."""

    __module__ = "torchscan"


@contextlib.contextmanager
def from_api(api: str) -> Iterator[None]:
    """Start the message of a :class:`TorchscanError` raised inside with ``api: `` (where it does
    not already): for functions whose errors are raised by shared helpers, which do not know the
    API they serve."""
    try:
        yield
    except TorchscanError as error:
        message = str(error)
        if not message.startswith(f"{api}: "):
            BaseException.args.__set__(error, (f"{api}: {message}",))  # type: ignore[attr-defined]
        raise
