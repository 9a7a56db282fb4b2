"""``torchscan.onnx.check``: lint a model's Scan and Loop nodes, and compare its runtimes.

The model is read (from a path, bytes or a ``ModelProto``) with errors that say what is wrong
with the file; its ``Scan`` and ``Loop`` nodes are linted (:mod:`torchscan.onnx._lint`); then it
is run in onnxruntime and in onnx's reference evaluator, and optionally eager PyTorch, on the
same inputs, and every output is held against a baseline.

onnxruntime runs in this process, except where a crash is plausible: on inputs with an empty
dimension (onnxruntime 1.32 ends the process with SIGFPE on some zero-length scans) and on models
the lint found fault with. There it runs in a child process, whose death is reported as an error.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import os
import pickle
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.checker
import onnx.external_data_helper
import onnx.numpy_helper
from google.protobuf.message import DecodeError

from torchscan._errors import TorchscanTypeError, TorchscanValueError
from torchscan.onnx import _lint
from torchscan.onnx._report import (
    BASELINE,
    ERROR,
    MISMATCH,
    OK,
    UNSUPPORTED,
    CheckReport,
    Comparison,
    OutputDiff,
)

RUNTIMES = ("onnxruntime", "reference")
"""The ONNX runtimes ``check`` can run: onnxruntime's CPU provider, and
``onnx.reference.ReferenceEvaluator``."""

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5
SEED = 0
"""Random inputs are drawn from ``numpy.random.default_rng(SEED)``: the same model gets the same
inputs on every run."""
FIRST_DEFAULT_DIM = 3
"""The smallest size of a dynamic dimension that ``dims`` leaves unset. Each such dimension gets
a size of its own, 3, 4, 5, ... skipping the sizes of the model's static dimensions, so that two
axes an export mixed up do not go unnoticed by being of one size; the exception is dimensions the
specification makes equal (the lengths of the scan inputs of one Scan), which get one size."""
MAX_RANDOM_ELEMENTS = 2**24
"""The most elements a random input may hold (16,777,216): larger sizes in ``dims`` are refused
rather than left to exhaust the memory."""


def check(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    inputs: str | os.PathLike | Mapping[str, Any] | Sequence[Any] | None = None,
    expected: Mapping[str, Any] | Sequence[Any] | None = None,
    module: Callable[..., Any] | None = None,
    args: Sequence[Any] | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    dims: Mapping[str, int] | None = None,
    runtimes: Sequence[str] = RUNTIMES,
) -> CheckReport:
    """Lint every ``Scan`` and ``Loop`` node of an ONNX model and compare runtimes on it.

    Lint: each ``Scan`` and ``Loop`` node, bodies and local functions included, is checked
    against the rules of the version in force in the model (body arity, ``num_scan_inputs``,
    axes and directions, element types, ``M`` and ``cond``, carried types and shapes, Scan-8's
    batch axis and ``sequence_lens``); each finding names the node, the rule and quotes the
    specification. ``docs/check.md`` lists the rules.

    Compare: the model runs in each of ``runtimes`` on the same inputs, and ``module(*args)``
    runs eagerly when a module is given. Every output is held against a baseline: ``expected``
    (or the ``output_*.pb`` files next to the inputs) where given, else PyTorch's outputs, else
    the first runtime that ran. An output agrees when every element ``a`` is within
    ``atol + rtol * |b|`` of the baseline's ``b`` (NaNs where the baseline has NaNs), with the
    same shape and element type. A runtime that does not run a model (onnx's reference evaluator
    on Scan-8, on a Scan along an axis other than 0 or in reverse; onnxruntime on 4-bit and 2-bit
    types; either on a zero-length scan) is reported as not supported, which is not a failure.

    The inputs are, in this order of preference: ``inputs``; the tensors among ``args`` (as
    ``torch.onnx.export`` flattens them) when a module is given; random values built from the
    model's input types. Given inputs must be of the element types, ranks and static sizes of
    the model's inputs. Random inputs have dynamic dimensions of the sizes in ``dims``; one left
    unset gets a size of its own (3, 4, 5, ... in the order they appear, skipping the sizes of
    static dimensions), except that dimensions the specification makes equal (the lengths of
    one Scan's scan inputs along their scan axes) get one size. Random floats are standard
    normal, integers lie in [1, 3], a bool scalar is True (so that a Loop's ``cond`` lets it
    run), and the draw is the same on every call. A model with a Loop that can never end (a
    ``loop-never-ends`` finding) is not run.

    Args:
      model: a path to an ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.
      inputs: a path to an ``.npz`` file (arrays named after the model's inputs, or saved
        positionally), a folder of ``input_*.pb`` files (an ONNX test case's
        ``test_data_set_*``, or the test case folder itself, whose first data set is used), a
        mapping from input name to value, or a sequence of values in the model's input order.
        Values are numpy arrays or scalars, torch tensors, lists for sequence inputs, and None
        for empty optional inputs.
      expected: the model's outputs that the runtimes must give, as a mapping by output name or
        a sequence in output order.
      module: a callable, typically the ``torch.nn.Module`` that was exported, run as is (put it
        in eval mode first) under ``torch.no_grad()``.
      args: the positional arguments of ``module``; needed exactly when ``module`` is given.
      atol: the absolute tolerance, at least 0.
      rtol: the relative tolerance, at least 0.
      dims: sizes of named dynamic dimensions (``dim_param``) for random inputs.
      runtimes: which of ``"onnxruntime"`` and ``"reference"`` to run; empty to lint only.

    Returns:
      A :class:`CheckReport`; ``report.ok`` is True when nothing was found and no output
      disagrees or failed to be computed. ``print(report)`` shows it as tables.

    Raises:
      FileNotFoundError: ``model`` or ``inputs`` names no file.
      ValueError: the model cannot be read (not ONNX, truncated, empty, corrupt, without the
        opset imports that give its Scan and Loop nodes a version), has no Scan or Loop node,
        or the inputs or options do not fit it (inputs of another element type, rank or size;
        random inputs too large); the message says which and why.
      TypeError: ``model`` is of none of the accepted types.
    """
    _check_options(atol, rtol, runtimes, module, args)
    proto, label = load_model(model)
    _check_readable(proto, label)
    try:
        linted = _lint.lint(proto)
    except ValueError as error:
        raise TorchscanValueError(f"{label}: {error}") from None
    if not linted.nodes:
        raise TorchscanValueError(f"{label}: has no Scan or Loop node; there is nothing to check")
    comparisons: tuple[Comparison, ...] = ()
    described: tuple[str, ...] = ()
    notes = linted.notes
    endless = [f.node for f in linted.findings if f.rule == "loop-never-ends"]
    if runtimes or module is not None:
        feeds, expected_values, described = _inputs(proto, inputs, expected, module, args, dims)
    if endless and (runtimes or module is not None):
        notes += (
            f"the model was not run: {endless[0]} never ends (see its loop-never-ends finding), "
            f"so no runtime could finish it",
        )
    elif runtimes or module is not None:
        comparisons = compare(
            proto,
            feeds,
            expected=expected_values,
            module=module,
            args=args,
            atol=atol,
            rtol=rtol,
            runtimes=runtimes,
            isolate=bool(linted.findings),
        )
    return CheckReport(
        model=label,
        opset=linted.opset,
        nodes=linted.nodes,
        findings=linted.findings,
        comparisons=comparisons,
        inputs=described,
        atol=atol,
        rtol=rtol,
        notes=notes,
    )


def _check_options(
    atol: float, rtol: float, runtimes: Sequence[str], module: Any, args: Any
) -> None:
    for name, value in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise TorchscanValueError(f"{name} must be a finite number at least 0, not {value!r}")
    if isinstance(runtimes, str):
        raise TorchscanValueError(f"runtimes is a sequence of names, not the string {runtimes!r}")
    for runtime in runtimes:
        if runtime not in RUNTIMES:
            raise TorchscanValueError(
                f"unknown runtime {runtime!r}; the runtimes are {', '.join(RUNTIMES)}"
            )
    if (module is None) != (args is None):
        given, missing = ("module", "args") if args is None else ("args", "module")
        raise TorchscanValueError(
            f"{given} was given without {missing}: PyTorch runs module(*args)"
        )


# --- reading the model ------------------------------------------------------------------------

_MODEL_FIELDS = {
    1: ("ir_version", 0),
    2: ("producer_name", 2),
    3: ("producer_version", 2),
    4: ("domain", 2),
    5: ("model_version", 0),
    6: ("doc_string", 2),
    7: ("graph", 2),
    8: ("opset_import", 2),
    14: ("metadata_props", 2),
    20: ("training_info", 2),
    25: ("functions", 2),
    26: ("configuration", 2),
}
"""The top-level fields of ``onnx.ModelProto``: number -> (name, protobuf wire type)."""


def load_model(model: Any) -> tuple[onnx.ModelProto, str]:
    """Read ``model`` (path, bytes or ModelProto): the proto, and a label for messages.

    Raises:
      FileNotFoundError: no file at the path.
      ValueError: a folder, an empty file, a file that is not an ONNX model or is truncated.
      TypeError: none of the accepted types.
    """
    if isinstance(model, onnx.ModelProto):
        return model, "<ModelProto>"
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _parse(bytes(model), "<bytes>"), "<bytes>"
    if not isinstance(model, (str, os.PathLike)):
        raise TorchscanTypeError(
            f"model is a path, bytes or an onnx.ModelProto, not {type(model).__name__}"
        )
    path = Path(model)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise TorchscanValueError(f"{path}: is a folder, not an ONNX model file")
    proto = _parse(path.read_bytes(), str(path))
    try:  # weights saved next to the model; nothing to do for a model without any
        onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as error:
        raise TorchscanValueError(f"{path}: cannot read its external data: {error}") from None
    return proto, str(path)


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    if not data:
        raise TorchscanValueError(f"{label}: is empty, not an ONNX model")
    problem = _wire_problem(data)
    if problem:
        raise TorchscanValueError(f"{label}: {problem}")
    try:
        proto = onnx.ModelProto.FromString(data)
    except DecodeError as error:
        raise TorchscanValueError(f"{label}: is not a valid ONNX model ({error})") from None
    if not proto.HasField("graph"):
        raise TorchscanValueError(f"{label}: is not an ONNX model (it has no graph)")
    return proto


def _check_readable(model: onnx.ModelProto, label: str) -> None:
    """Refuse a model that parsed but that no tool can read: one with a string that is not
    UTF-8, which protobuf leaves as bytes, or one with no opset_import at all (a model cut short
    right after its graph field parses so)."""
    where = _bad_string(model, "")
    if where is not None:
        path, value = where
        raise TorchscanValueError(
            f"{label}: is corrupt: its string {path} is not valid UTF-8 ({value[:40]!r})"
        )
    if not model.opset_import:
        raise TorchscanValueError(
            f"{label}: has no opset_import, which every ONNX model needs to say the versions of "
            f"its operators (a file cut short right after its graph field reads like this)"
        )


def _bad_string(message: Any, path: str) -> tuple[str, bytes] | None:
    """The first string field under ``message`` that protobuf could not decode as UTF-8 (and
    so gives as bytes), with its path as in ``graph.node[3].output[0]``, or None."""
    from google.protobuf.descriptor import FieldDescriptor

    for field in message.DESCRIPTOR.fields:
        if field.type not in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE):
            continue  # bytes fields (raw_data) are not read, let alone copied
        name = f"{path}.{field.name}" if path else field.name
        repeated = getattr(field, "is_repeated", None)  # protobuf 6.31+; label before it
        if repeated is None:
            repeated = field.label == FieldDescriptor.LABEL_REPEATED
        if repeated:
            values = [(f"{name}[{i}]", v) for i, v in enumerate(getattr(message, field.name))]
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not message.HasField(field.name):
            continue
        else:
            values = [(name, getattr(message, field.name))]
        for where, value in values:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                found = _bad_string(value, where)
                if found is not None:
                    return found
            elif not isinstance(value, str):
                return where, value
    return None


def _wire_problem(data: bytes) -> str | None:
    """Why ``data`` is not, at its top level, a whole ``ModelProto``, or None.

    Protobuf parses much that is not ONNX, and says only "Error parsing message" of a file cut
    short; reading the top-level fields tells the two apart, and says where a truncated file
    ends.
    """
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        number, wire = (tag >> 3, tag & 7) if tag is not None else (None, None)
        name, expected_wire = _MODEL_FIELDS.get(number, (None, None))
        if name is None or wire != expected_wire:
            return f"is not an ONNX model (byte {start} does not start a field of ModelProto)"
        value, pos = _varint(data, pos)
        if value is None:
            return f"is truncated: it ends inside the {name} field, at byte {len(data)}"
        if wire == 2:
            if pos + value > len(data):
                return (
                    f"is truncated: its {name} field declares {value} bytes, but the file ends "
                    f"{len(data) - pos} bytes into it"
                )
            pos += value
    return None


def _varint(data: bytes, pos: int) -> tuple[int | None, int]:
    value = shift = 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None, pos


# --- inputs -----------------------------------------------------------------------------------


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a model must be fed: its graph inputs that are not initializers."""
    initialized = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initialized]


def _inputs(
    model: onnx.ModelProto,
    inputs: Any,
    expected: Any,
    module: Any,
    args: Any,
    dims: Mapping[str, int] | None,
) -> tuple[dict[str, Any], list[Any] | None, tuple[str, ...]]:
    """The feeds, the expected outputs (or None) and a description of the feeds."""
    expected_values = None if expected is None else _by_position(model, expected)
    if inputs is None and module is None:
        feeds = random_inputs(model, dims or {})
        source = f"random (seed {SEED})"
    elif dims:
        raise TorchscanValueError("dims sets the sizes of random inputs, but the inputs were given")
    elif inputs is None:
        feeds = _feeds_from_args(model, args)
        source = "the tensors of args"
    elif isinstance(inputs, (str, os.PathLike)):
        feeds, from_files = read_inputs(inputs, model)
        expected_values = expected_values if expected_values is not None else from_files
        source = f"{inputs}"
    else:
        feeds = _feeds(model, inputs, "the inputs")
        source = "given"
    described = (
        f"source: {source}",
        *(f"{name}: {_describe(value)}" for name, value in feeds.items()),
    )
    return feeds, expected_values, described


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, list):
        return f"seq[{len(value)}]" + (f" of {_describe(value[0])}" if value else "")
    return f"{_dtype_name(value.dtype)}[{', '.join(str(d) for d in value.shape)}]"


def _dtype_name(dtype: np.dtype) -> str:
    return "string" if dtype.kind in "OUS" else dtype.name


def _type_text(type_proto: onnx.TypeProto) -> str:
    """An ONNX type in the words of :func:`_describe`, as in ``float32[T, 2]``."""
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        return f"seq of {_type_text(type_proto.sequence_type.elem_type)}"
    if kind == "optional_type":
        return f"optional {_type_text(type_proto.optional_type.elem_type)}"
    if kind != "tensor_type":
        return str(kind)
    tensor = type_proto.tensor_type
    expected = _np_dtype(tensor.elem_type)
    name = (
        _dtype_name(expected)
        if expected is not None
        else onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
    )
    if not tensor.HasField("shape"):
        return f"{name} of any shape"
    return f"{name}[{', '.join(_dim_text(d) for d in tensor.shape.dim)}]"


def _dim_text(dim: onnx.TensorShapeProto.Dimension) -> str:
    if dim.HasField("dim_value"):
        return str(dim.dim_value)
    return dim.dim_param if dim.HasField("dim_param") else "?"


def _np_dtype(elem_type: int) -> np.dtype | None:
    if elem_type == onnx.TensorProto.UNDEFINED:
        return None
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        return None


def _check_fit(model: onnx.ModelProto, feeds: Mapping[str, Any], what: str) -> None:
    """Refuse values that the model's inputs do not take, before anything runs: a runtime
    would fail on them, or worse, onnx.reference would compute in their type."""
    for info in graph_inputs(model):
        value = feeds[info.name]
        problem = _misfit(info.type, value)
        if problem:
            raise TorchscanValueError(
                f"{what} give input {info.name!r} as {_describe(value)}, but the model takes "
                f"{_type_text(info.type)}: {problem}"
            )


def _misfit(type_proto: onnx.TypeProto, value: Any, shapes: bool = True) -> str | None:
    """Why ``value`` is not of type ``type_proto``, or None. Sequence elements are held to their
    element type only, as their declared shapes often stand for several shapes."""
    kind = type_proto.WhichOneof("value")
    if kind == "optional_type":
        return None if value is None else _misfit(type_proto.optional_type.elem_type, value)
    if kind == "sequence_type":
        if not isinstance(value, list):
            return "it is not a sequence (give a list of tensors)"
        for i, item in enumerate(value):
            problem = _misfit(type_proto.sequence_type.elem_type, item, shapes=False)
            if problem:
                return f"its element {i}: {problem}"
        return None
    if kind != "tensor_type":
        return None  # map and sparse inputs: the runtimes say what they make of them
    if value is None or isinstance(value, list):
        return "it is not a tensor"
    tensor = type_proto.tensor_type
    expected = _np_dtype(tensor.elem_type)
    if expected is not None and not (
        value.dtype == expected or (expected.kind == "O" and value.dtype.kind in "OUS")
    ):
        return f"its element type is {_dtype_name(value.dtype)}, not {_dtype_name(expected)}"
    if not (shapes and tensor.HasField("shape")):
        return None
    dims = tensor.shape.dim
    if value.ndim != len(dims):
        return f"its rank is {value.ndim}, not {len(dims)}"
    for axis, (dim, size) in enumerate(zip(dims, value.shape, strict=True)):
        if dim.HasField("dim_value") and dim.dim_value != size:
            return f"its dimension {axis} is {size}, not {dim.dim_value}"
    return None


def _feeds(model: onnx.ModelProto, values: Any, what: str) -> dict[str, Any]:
    """Map given values (by name or by position) onto the model's inputs."""
    names = [i.name for i in graph_inputs(model)]
    listed = ", ".join(names) or "none"
    if isinstance(values, Mapping):
        unknown = [k for k in values if k not in names]
        if unknown:
            raise TorchscanValueError(
                f"{what} give values for {', '.join(map(repr, unknown))}, which the model has no "
                f"input for; its inputs are: {listed}"
            )
        missing = [n for n in names if n not in values]
        if missing:
            raise TorchscanValueError(
                f"{what} give no value for model input {missing[0]!r}; its inputs are: {listed}"
            )
        feeds = {n: _as_value(values[n]) for n in names}
    else:
        values = list(values)
        if len(values) != len(names):
            raise TorchscanValueError(
                f"{what} give {len(values)} values, but the model has {len(names)} inputs: {listed}"
            )
        feeds = {n: _as_value(v) for n, v in zip(names, values, strict=True)}
    _check_fit(model, feeds, what)
    return feeds


def _by_position(model: onnx.ModelProto, values: Any) -> list[Any]:
    names = [o.name for o in model.graph.output]
    if isinstance(values, Mapping):
        missing = [n for n in names if n not in values]
        if missing:
            raise TorchscanValueError(f"expected has no value for model output {missing[0]!r}")
        return [_as_value(values[n]) for n in names]
    values = [_as_value(v) for v in values]
    if len(values) != len(names):
        raise TorchscanValueError(
            f"expected holds {len(values)} values, but the model has {len(names)} outputs"
        )
    return values


def _as_value(value: Any) -> Any:
    """A value as runtimes take it: numpy arrays, lists of them for sequences, or None."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [_as_value(v) for v in value]
    if hasattr(value, "detach") and hasattr(value, "dtype"):
        return _torch_to_numpy(value)
    return np.asarray(value)


def read_inputs(path: str | os.PathLike, model: onnx.ModelProto) -> tuple[dict, list | None]:
    """Feeds from an ``.npz`` file or a folder of ``input_*.pb`` files, and the expected
    outputs from the folder's ``output_*.pb`` files where there are any.

    Raises:
      FileNotFoundError: nothing at ``path``.
      ValueError: the file or folder cannot be read, or does not fit the model's inputs.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        return _read_test_data(path, model)
    if path.suffix != ".npz":
        raise TorchscanValueError(
            f"{path}: cannot read inputs from it: expected a .npz file or a folder of "
            f"input_*.pb files"
        )
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
    except Exception as error:  # numpy raises several unrelated types for a bad archive
        raise TorchscanValueError(f"{path}: cannot read arrays from it ({error})") from None
    names = [i.name for i in graph_inputs(model)]
    positional = [f"arr_{i}" for i in range(len(arrays))]
    if sorted(arrays) == sorted(positional) and not set(arrays) & set(names):
        return _feeds(model, [arrays[k] for k in positional], f"the arrays of {path}"), None
    return _feeds(model, arrays, f"the arrays of {path}"), None


def _read_test_data(folder: Path, model: onnx.ModelProto) -> tuple[dict, list | None]:
    if not list(folder.glob("input_*.pb")):
        data_sets = sorted(folder.glob("test_data_set_*"))
        if not data_sets:
            raise TorchscanValueError(
                f"{folder}: has no input_*.pb files and no test_data_set_* folder"
            )
        folder = data_sets[0]
    inputs = _read_protos(folder, "input", graph_inputs(model))
    outputs = _read_protos(folder, "output", list(model.graph.output))
    return _feeds(model, inputs, f"the files of {folder}"), outputs or None


def _read_protos(folder: Path, prefix: str, infos: Sequence[onnx.ValueInfoProto]) -> list[Any]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: _index(p, prefix))
    if files and len(files) != len(infos):
        raise TorchscanValueError(
            f"{folder}: has {len(files)} {prefix}_*.pb files, but the model has {len(infos)} "
            f"{prefix}s"
        )
    return [_read_proto(file, info.type) for file, info in zip(files, infos, strict=False)]


def _index(path: Path, prefix: str) -> int:
    match = re.fullmatch(rf"{prefix}_(\d+)\.pb", path.name)
    return int(match.group(1)) if match else -1


def _read_proto(file: Path, type_proto: onnx.TypeProto) -> Any:
    """One ``.pb`` file, read as the proto its value's type calls for (as ONNX's backend tests
    write them: TensorProto, SequenceProto or OptionalProto)."""
    kind = type_proto.WhichOneof("value")
    readers = {
        "tensor_type": (onnx.TensorProto, onnx.numpy_helper.to_array),
        "sequence_type": (onnx.SequenceProto, onnx.numpy_helper.to_list),
        "optional_type": (onnx.OptionalProto, onnx.numpy_helper.to_optional),
    }
    if kind not in readers:
        raise TorchscanValueError(f"{file}: cannot read a value of type {kind} from it")
    proto_type, to_value = readers[kind]
    try:
        return to_value(proto_type.FromString(file.read_bytes()))
    except (DecodeError, ValueError, TypeError) as error:
        raise TorchscanValueError(f"{file}: is not a {proto_type.__name__} ({error})") from None


def random_inputs(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, Any]:
    """Random values for the model's inputs, from their types (see :func:`check`)."""
    infos = graph_inputs(model)
    sizes = _dim_sizes(model, infos, dims)
    rng = np.random.default_rng(SEED)
    return {info.name: _random_value(info.name, info.type, sizes, rng) for info in infos}


def _dim_sizes(
    model: onnx.ModelProto, infos: Sequence[onnx.ValueInfoProto], dims: Mapping[str, int]
) -> dict[str, int]:
    """The size of each dynamic dimension of the inputs: as ``dims`` sets it, else as the
    dimensions it must equal (:func:`_equal_dims`), else one of its own that no static
    dimension of the model has."""
    named: list[str] = []
    for info in infos:
        for dim in _tensor_dims(info.type):
            if dim.HasField("dim_param") and dim.dim_param not in named:
                named.append(dim.dim_param)
    for name, size in dims.items():
        if name not in named:
            listed = ", ".join(named) or "none"
            raise TorchscanValueError(
                f"dims sets {name!r}, which is not a dynamic dimension of the model's inputs; "
                f"theirs are: {listed}"
            )
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TorchscanValueError(
                f"dims sets {name!r} to {size!r}, not a size (an int at least 0)"
            )
    parent = {name: name for name in named}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    groups = []
    for why, group in _equal_dims(model):
        params = [d.dim_param for d in group if d.HasField("dim_param") and d.dim_param in parent]
        values = {d.dim_value for d in group if d.HasField("dim_value")}
        for name in params[1:]:
            parent[root(name)] = root(params[0])
        if params:
            groups.append((params[0], why, values))
    why_of: dict[str, str] = {}
    static: dict[str, int] = {}
    for first, why, values in groups:
        why_of.setdefault(root(first), why)
        if len(values) == 1:  # several: the lint reports the Scan's inputs
            static.setdefault(root(first), values.pop())
    chosen: dict[str, tuple[str, int]] = {}
    for name in named:
        if name not in dims:
            continue
        group, size = root(name), dims[name]
        if group in static and static[group] != size:
            raise TorchscanValueError(
                f"dims sets {name!r} to {size}, but it is one of {why_of[group]}, which must be "
                f"equal, and another of them is {static[group]}"
            )
        if group in chosen and chosen[group][1] != size:
            other, other_size = chosen[group]
            raise TorchscanValueError(
                f"dims sets {other!r} to {other_size} and {name!r} to {size}, but they must be "
                f"equal: both are among {why_of[group]}"
            )
        chosen[group] = (name, size)
    taken = _static_sizes(model) | set(dims.values()) | set(static.values())
    free = (n for n in itertools.count(FIRST_DEFAULT_DIM) if n not in taken)
    sizes = {}
    for name in named:
        group = root(name)
        if group not in chosen:
            chosen[group] = (name, static[group] if group in static else next(free))
        sizes[name] = chosen[group][1]
    return sizes


def _static_sizes(model: onnx.ModelProto) -> set[int]:
    """The sizes of the static dimensions of the model's inputs, outputs and initializers."""
    graph = model.graph
    sizes = {int(d) for t in graph.initializer for d in t.dims}
    for value in (*graph.input, *graph.output, *graph.value_info):
        sizes |= {d.dim_value for d in _tensor_dims(value.type) if d.HasField("dim_value")}
    return sizes


def _equal_dims(model: onnx.ModelProto) -> list[tuple[str, list[onnx.TensorShapeProto.Dimension]]]:
    """Dimensions the specification makes equal, with what makes them so: the lengths of the
    scan inputs of each Scan node along their scan axes, and at Scan-8 the batch sizes of its
    inputs too. The shapes are the model's, completed by ONNX shape inference."""
    opset = _lint.default_opset(model.opset_import)
    version = None if opset is None else _lint.version_in_force("Scan", opset)
    if version is None:
        return []
    types: dict[str, onnx.TypeProto] = {}
    found: list[tuple[str, list[onnx.TensorShapeProto.Dimension]]] = []

    def visit(graph: onnx.GraphProto, prefix: str) -> None:
        for value in (*graph.input, *graph.value_info, *graph.output):
            types.setdefault(value.name, value.type)
        for index, node in enumerate(graph.node):
            label = f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"
            if node.op_type == "Scan" and node.domain in ("", "ai.onnx"):
                found.extend(_scan_dims(node, prefix + label, types, version))
            for attr in node.attribute:
                for body in [attr.g] if attr.HasField("g") else attr.graphs:
                    visit(body, f"{prefix}{label} > {attr.name} > ")

    visit(_lint._with_inferred_types(model).graph, "")
    return found


def _scan_dims(
    node: onnx.NodeProto, label: str, types: Mapping[str, onnx.TypeProto], version: Any
) -> list[tuple[str, list[onnx.TensorShapeProto.Dimension]]]:
    attrs = {a.name: a for a in node.attribute}
    variadic = list(node.input[1:] if version.batch_axis else node.input)
    m = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
    if not 1 <= m <= len(variadic):
        return []
    shapes = [
        list(_tensor_dims(types[name])) if name in types and _has_shape(types[name]) else None
        for name in variadic
    ]
    if version.batch_axis:
        axes = [1] * m
    elif "scan_input_axes" in attrs:
        axes = list(attrs["scan_input_axes"].ints)
    else:
        axes = [0] * m
    scans = shapes[len(variadic) - m :]
    lengths = [
        dims[axis]
        for dims, axis in zip(scans, axes, strict=False)
        if dims is not None and -len(dims) <= axis < len(dims)
    ]
    found = [(f"the lengths of the scan inputs of {label}", lengths)]
    if version.batch_axis:
        batch = [dims[0] for dims in shapes if dims]
        found.append((f"the batch sizes of the inputs of {label}", batch))
    return found


def _has_shape(type_proto: onnx.TypeProto) -> bool:
    return type_proto.WhichOneof("value") == "tensor_type" and type_proto.tensor_type.HasField(
        "shape"
    )


def _tensor_dims(type_proto: onnx.TypeProto) -> list[onnx.TensorShapeProto.Dimension]:
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return list(type_proto.tensor_type.shape.dim)
    if kind == "sequence_type":
        return _tensor_dims(type_proto.sequence_type.elem_type)
    if kind == "optional_type":
        return _tensor_dims(type_proto.optional_type.elem_type)
    return []


def _random_value(
    name: str, type_proto: onnx.TypeProto, sizes: dict[str, int], rng: np.random.Generator
) -> Any:
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        elem = type_proto.sequence_type.elem_type
        return [_random_value(name, elem, sizes, rng) for _ in range(2)]
    if kind == "optional_type":
        return _random_value(name, type_proto.optional_type.elem_type, sizes, rng)
    if kind != "tensor_type":
        raise TorchscanValueError(f"input {name!r} is of type {kind}: give its values with inputs")
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        raise TorchscanValueError(f"input {name!r} has no shape (not even a rank): give its values")
    shape = tuple(
        d.dim_value if d.HasField("dim_value") else sizes.get(d.dim_param, FIRST_DEFAULT_DIM)
        for d in tensor.shape.dim
    )
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
    what = f"random input {name!r}, {_dtype_name(np.dtype(dtype))}{list(shape)},"
    count = math.prod(shape)
    if count > MAX_RANDOM_ELEMENTS:
        raise TorchscanValueError(
            f"{what} would hold {count:,} elements, more than the {MAX_RANDOM_ELEMENTS:,} a "
            f"random input may hold; give its dynamic dimensions smaller sizes with dims "
            f"(--dim NAME=SIZE)"
        )
    try:
        return _random_array(dtype, shape, rng)
    except MemoryError:
        raise TorchscanValueError(
            f"{what} does not fit in memory; give its dynamic dimensions smaller sizes with dims "
            f"(--dim NAME=SIZE)"
        ) from None


def _random_array(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> Any:
    """An array (never a numpy scalar: runtimes take arrays) of random values. A bool scalar
    is True: it is most often the condition of a Loop, which would run no iteration if False."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(True) if shape == () else rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        values = rng.integers(1, 3, size=shape, endpoint=True)
    elif np.issubdtype(dtype, np.complexfloating):
        values = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    elif dtype == np.object_:
        values = rng.choice(np.array(["a", "b"], dtype=object), size=shape)
    else:
        values = rng.standard_normal(shape)
    return np.asarray(values).astype(dtype)


def _feeds_from_args(model: onnx.ModelProto, args: Sequence[Any]) -> dict[str, Any]:
    import torch

    from torchscan import _pytree

    tensors = [leaf for leaf in _pytree.tree_leaves(list(args)) if isinstance(leaf, torch.Tensor)]
    names = [i.name for i in graph_inputs(model)]
    if len(tensors) != len(names):
        raise TorchscanValueError(
            f"args hold {len(tensors)} tensors, but the model has {len(names)} inputs "
            f"({', '.join(names) or 'none'}); give the model's inputs with inputs"
        )
    feeds = {n: _torch_to_numpy(t) for n, t in zip(names, tensors, strict=True)}
    _check_fit(model, feeds, "the tensors of args")
    return feeds


@functools.cache
def _ml_dtypes_of_torch() -> dict[Any, tuple[Any, Any]]:
    """torch dtypes numpy has no type for -> (same-width torch int type, ml_dtypes type)."""
    import ml_dtypes
    import torch

    pairs = {
        "bfloat16": ("uint16", "bfloat16"),
        "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
        "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
        "float8_e5m2": ("uint8", "float8_e5m2"),
        "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"),
        "float8_e8m0fnu": ("uint8", "float8_e8m0fnu"),
    }
    return {
        getattr(torch, t): (getattr(torch, bits), getattr(ml_dtypes, m))
        for t, (bits, m) in pairs.items()
        if hasattr(torch, t) and hasattr(ml_dtypes, m)
    }


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    tensor = tensor.detach().cpu()
    exotic = _ml_dtypes_of_torch().get(tensor.dtype)
    if exotic is None:
        return tensor.numpy()
    bits, ml_dtype = exotic
    return tensor.view(bits).numpy().view(ml_dtype)


# --- running ----------------------------------------------------------------------------------


class _Unsupported(Exception):
    """A runtime does not run this model; not a fault of the model."""


def compare(
    model: onnx.ModelProto,
    feeds: dict[str, Any],
    *,
    expected: list[Any] | None = None,
    module: Callable[..., Any] | None = None,
    args: Sequence[Any] | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    runtimes: Sequence[str] = RUNTIMES,
    isolate: bool = False,
) -> tuple[Comparison, ...]:
    """Run ``model`` in ``runtimes`` (and ``module(*args)``) and hold each against a baseline.

    Args:
      model: the model.
      feeds: its inputs by name.
      expected: the outputs it must give, in output order; the baseline where given.
      module: eager PyTorch to compare with; its outputs are the baseline unless ``expected``.
      args: the positional arguments of ``module``.
      atol: the absolute tolerance.
      rtol: the relative tolerance.
      runtimes: the runtimes to run, among :data:`RUNTIMES`.
      isolate: run onnxruntime in a child process even where the inputs seem safe.

    Returns:
      One :class:`Comparison` per source, the baseline first.
    """
    names = [o.name for o in model.graph.output]
    results: dict[str, list[Any] | BaseException] = {}
    if expected is not None:
        results["expected"] = expected
    if module is not None:
        results["pytorch"] = _attempt(lambda: _pytorch_outputs(module, args or ()))
    empty = _has_empty_dimension(feeds)
    for runtime in runtimes:
        run = _RUNNERS[runtime]
        results[runtime] = _attempt(lambda run=run: run(model, feeds, isolate or empty))
    baseline = next((s for s, r in results.items() if not isinstance(r, BaseException)), None)
    comparisons = []
    for source, result in results.items():
        if isinstance(result, BaseException):
            comparisons.append(_failed(source, baseline or "", result, empty))
        elif source == baseline:
            diffs = tuple(
                OutputDiff(n, _shape_text(v), None, None, True)
                for n, v in _named_outputs(names, result)
            )
            comparisons.append(Comparison(source, source, BASELINE, "", diffs))
        else:
            diffs = _diff_all(names, result, results[baseline], atol, rtol)
            status = OK if all(d.ok for d in diffs) else MISMATCH
            comparisons.append(Comparison(source, baseline, status, "", diffs))
    comparisons.sort(key=lambda c: c.status != BASELINE)
    return tuple(comparisons)


def _attempt(run: Callable[[], list[Any]]) -> list[Any] | BaseException:
    try:
        return run()
    except Exception as error:  # a runtime's failure is a result to report, not to raise
        return error


def _failed(source: str, against: str, error: BaseException, empty: bool) -> Comparison:
    reason = _one_line(error)
    if isinstance(error, _Unsupported) or _says_unsupported(source, error):
        return Comparison(source, against, UNSUPPORTED, reason)
    if empty and source in RUNTIMES:
        # Both runtimes fail on zero-length scans, which the specification allows.
        return Comparison(
            source, against, UNSUPPORTED, f"an input has an empty dimension: {reason}"
        )
    return Comparison(source, against, ERROR, reason)


def _says_unsupported(source: str, error: BaseException) -> bool:
    """Whether a runtime's error says that it lacks a feature, rather than that the model is
    wrong: onnxruntime's NOT_IMPLEMENTED status, onnx.reference's "not implemented"."""
    name = getattr(error, "child_type", type(error).__name__)
    if name in ("NotImplementedError", "NotImplemented"):
        return True
    said = re.search(r"not (implemented|supported)", str(error), re.IGNORECASE)
    return source == "reference" and bool(said)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _has_empty_dimension(feeds: Mapping[str, Any]) -> bool:
    def empty(value: Any) -> bool:
        if value is None:
            return False
        if isinstance(value, list):
            return any(map(empty, value))
        return 0 in np.shape(value)

    return any(empty(v) for v in feeds.values())


def _pytorch_outputs(module: Callable[..., Any], args: Sequence[Any]) -> list[Any]:
    import torch

    from torchscan import _pytree

    with torch.no_grad():
        out = module(*args)
    return [_as_value(leaf) for leaf in _pytree.tree_leaves(out) if leaf is not None]


# onnx.reference ---------------------------------------------------------------------------------


def _run_reference(model: onnx.ModelProto, feeds: dict[str, Any], _isolate: bool) -> list[Any]:
    why = _reference_cannot_run(model)
    if why:
        raise _Unsupported(why)
    import onnx.reference

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        evaluator = onnx.reference.ReferenceEvaluator(model, new_ops=[_spec_loop()])
        return list(evaluator.run(None, feeds))


def _reference_cannot_run(model: onnx.ModelProto) -> str | None:
    """Why onnx's reference evaluator would not run ``model`` right, or None: it runs Scan-8
    wrongly, and Scan only along axis 0, forward."""
    opset = _lint.default_opset(model.opset_import)
    functions = [node for function in model.functions for node in function.node]
    for node in _all_nodes(model.graph) + functions:
        if node.op_type != "Scan" or node.domain not in ("", "ai.onnx") or opset is None:
            continue
        version = _lint.version_in_force("Scan", opset)
        if version is not None and version.batch_axis:
            return f"onnx.reference does not run Scan-{version.since} right"
        for attr in node.attribute:
            if attr.name.startswith("scan_") and any(v != 0 for v in attr.ints):
                return f"onnx.reference runs Scan only along axis 0, forward ({attr.name})"
    return None


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    found = []
    for node in graph.node:
        found.append(node)
        for attr in node.attribute:
            for body in [attr.g] if attr.HasField("g") else attr.graphs:
                found += _all_nodes(body)
    return found


@functools.cache
def _spec_loop() -> type:
    """onnx.reference's ``Loop`` with two departures from the specification undone.

    In onnx 1.23 it runs no iteration when ``cond`` is omitted (the ``(M, "")`` mode is a for
    loop that ignores the body's condition), and it joins scan outputs with ``np.vstack``, which
    concatenates per-iteration tensors of rank 2 or more instead of stacking them. This follows
    the specification's pseudo-code.
    """
    import onnx.reference.ops.op_loop

    class Loop(onnx.reference.ops.op_loop.Loop):
        def _run(self, M, cond, *args, context=None, body=None, attributes=None, bindings=None):
            names = self.body.input_names
            inputs = dict(context or {})
            inputs.update(zip(names[2:], args, strict=False))
            scan_outputs: list[list[np.ndarray]] = [[] for _ in range(self.K)]
            keep_going, i = True if cond is None else bool(cond), 0
            while keep_going and (M is None or i < M):
                inputs[names[0]] = np.array(i, dtype=np.int64)
                inputs[names[1]] = np.array(keep_going)
                outputs = self._run_body(inputs, attributes=attributes, bindings=bindings)
                if cond is not None:
                    keep_going = bool(outputs[0])
                inputs.update(zip(names[2:], outputs[1 : 1 + self.N], strict=True))
                for k in range(self.K):
                    scan_outputs[k].append(outputs[1 + self.N + k])
                i += 1
            if self.K and i == 0:
                raise NotImplementedError(
                    "a Loop that runs no iteration has scan outputs of unknown shape"
                )
            carried = [inputs[name] for name in names[2:]]
            return tuple(carried + [np.stack(column) for column in scan_outputs])

    return Loop


# onnxruntime ------------------------------------------------------------------------------------

_NO_ORT_KERNELS = ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
"""Element types onnxruntime 1.32 has no CPU kernels for."""


def _run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, Any], isolate: bool) -> list[Any]:
    why = _onnxruntime_cannot_run(model)
    if why:
        raise _Unsupported(why)
    data = model.SerializeToString()
    if isolate:
        return _in_child_process(data, feeds)
    return run_onnxruntime(data, feeds)


def _onnxruntime_cannot_run(model: onnx.ModelProto) -> str | None:
    missing = {
        getattr(onnx.TensorProto, n) for n in _NO_ORT_KERNELS if hasattr(onnx.TensorProto, n)
    }
    found = sorted(
        {onnx.TensorProto.DataType.Name(t) for t in _element_types(model.graph)}
        & {onnx.TensorProto.DataType.Name(t) for t in missing}
    )
    if found:
        return f"onnxruntime has no CPU kernels for {', '.join(t.lower() for t in found)}"
    return None


def _element_types(graph: onnx.GraphProto) -> set[int]:
    """Every tensor element type a graph names, its bodies included."""
    types = {t.data_type for t in graph.initializer}
    for info in (*graph.input, *graph.output, *graph.value_info):
        types |= _elem_types_of(info.type)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                types.add(attr.t.data_type)
            if attr.HasField("i") and attr.name == "to":
                types.add(attr.i)
            for body in [attr.g] if attr.HasField("g") else attr.graphs:
                types |= _element_types(body)
    return types


def _elem_types_of(type_proto: onnx.TypeProto) -> set[int]:
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return {type_proto.tensor_type.elem_type}
    if kind == "sequence_type":
        return _elem_types_of(type_proto.sequence_type.elem_type)
    if kind == "optional_type":
        return _elem_types_of(type_proto.optional_type.elem_type)
    return set()


def run_onnxruntime(data: bytes, feeds: dict[str, Any]) -> list[Any]:
    """Run a serialized model in onnxruntime's CPU provider, graph optimizations off.

    Tensors of types numpy lacks (bfloat16, float8; numpy arrays of ``ml_dtypes`` types) go in
    and come out through ``OrtValue`` and their bits.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # warnings about unused initializers are not findings
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    exotic = any(_is_exotic(v) for v in feeds.values()) or any(
        _exotic_onnx_type(o.type) for o in session.get_outputs()
    )
    if not exotic:
        return list(session.run(None, feeds))
    values = {name: _to_ort_value(ort, value) for name, value in feeds.items()}
    return [_from_ort_value(v) for v in session.run_with_ort_values(None, values)]


def _is_exotic(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind == "V"


def _exotic_onnx_type(type_name: str) -> bool:
    return bool(re.fullmatch(r"tensor\((bfloat16|float8\w*)\)", type_name))


def _to_ort_value(ort: Any, value: Any) -> Any:
    if not _is_exotic(value):
        return ort.OrtValue.ortvalue_from_numpy(value)
    onnx_type = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
    # ascontiguousarray would make a scalar a vector of one
    bits = np.array(value, order="C", copy=True).view(f"uint{8 * value.dtype.itemsize}")
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx_type)


def _from_ort_value(value: Any) -> np.ndarray:
    if not _exotic_onnx_type(value.data_type()):
        return value.numpy()
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.element_type()))
    shape, size = tuple(value.shape()), value.tensor_size_in_bytes()
    raw = (ctypes.c_char * size).from_address(value.data_ptr()) if size else b""
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(shape)


_CHILD = """
import pickle, sys
from torchscan.onnx._compare import run_onnxruntime
folder = sys.argv[1]
with open(folder + "/in.pkl", "rb") as f:
    data, feeds = pickle.load(f)
try:
    result = ("ok", run_onnxruntime(data, feeds))
except Exception as error:
    result = ("error", type(error).__name__, str(error))
with open(folder + "/out.pkl", "wb") as f:
    pickle.dump(result, f)
"""


class _ChildError(RuntimeError):
    """What onnxruntime raised in the child process, with its type's name."""

    def __init__(self, child_type: str, message: str) -> None:
        super().__init__(message)
        self.child_type = child_type


def _in_child_process(data: bytes, feeds: dict[str, Any]) -> list[Any]:
    """``run_onnxruntime`` in a child process, so that a crash of onnxruntime ends only it."""
    import signal

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="torchscan-check-") as folder:
        with open(os.path.join(folder, "in.pkl"), "wb") as f:
            pickle.dump((data, feeds), f)
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, folder], capture_output=True, text=True, env=env
        )
        if done.returncode < 0:
            name = signal.Signals(-done.returncode).name
            raise RuntimeError(f"onnxruntime ended its process with {name}")
        out = os.path.join(folder, "out.pkl")
        if not os.path.exists(out):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"onnxruntime's process failed: {last}")
        with open(out, "rb") as f:
            result = pickle.load(f)
    if result[0] == "ok":
        return result[1]
    raise _ChildError(result[1], result[2])


_RUNNERS: dict[str, Callable[[onnx.ModelProto, dict[str, Any], bool], list[Any]]] = {
    "onnxruntime": _run_onnxruntime,
    "reference": _run_reference,
}


# --- comparing --------------------------------------------------------------------------------


def _named_outputs(names: list[str], values: list[Any]) -> list[tuple[str, Any]]:
    return [
        (names[i] if i < len(names) else f"output {i}", value) for i, value in enumerate(values)
    ]


def _diff_all(
    names: list[str], actual: list[Any], baseline: list[Any], atol: float, rtol: float
) -> tuple[OutputDiff, ...]:
    diffs = [
        _diff(name, a, b, atol, rtol)
        for (name, a), b in zip(_named_outputs(names, actual), baseline, strict=False)
    ]
    if len(actual) != len(baseline):
        note = f"{len(actual)} outputs, where the baseline has {len(baseline)}"
        diffs.append(OutputDiff("(outputs)", "", None, None, False, note))
    return tuple(diffs)


def _shape_text(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, list):
        return f"seq[{len(value)}]"
    return str(tuple(np.shape(value)))


def _diff(name: str, a: Any, b: Any, atol: float, rtol: float) -> OutputDiff:
    """How far ``a`` is from the baseline's ``b``; sequences element by element."""
    shape = _shape_text(a)
    if a is None or b is None or isinstance(a, list) != isinstance(b, list):
        same = a is None and b is None
        note = "" if same else f"{_shape_text(a)} where the baseline has {_shape_text(b)}"
        return OutputDiff(name, shape, 0.0 if same else None, 0.0 if same else None, same, note)
    if isinstance(a, list):
        if len(a) != len(b):
            note = f"{len(a)} elements, where the baseline has {len(b)}"
            return OutputDiff(name, shape, None, None, False, note)
        parts = [_diff(name, x, y, atol, rtol) for x, y in zip(a, b, strict=True)]
        return OutputDiff(
            name,
            shape,
            _worst(p.max_abs for p in parts),
            _worst(p.max_rel for p in parts),
            all(p.ok for p in parts),
            next((p.note for p in parts if p.note), ""),
        )
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        note = f"shape {a.shape}, where the baseline has {b.shape}"
        return OutputDiff(name, shape, None, None, False, note)
    max_abs, max_rel, close = _errors(a, b, atol, rtol)
    note = "" if a.dtype == b.dtype else f"element type {a.dtype}, where the baseline has {b.dtype}"
    return OutputDiff(name, shape, max_abs, max_rel, close and not note, note)


def _worst(values: Any) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else max(values, default=0.0)


def _errors(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> tuple[float, float, bool]:
    """Largest absolute and relative errors of ``a`` against ``b``, and whether all elements
    are within ``atol + rtol * |b|`` (NaNs agreeing with NaNs)."""
    if a.size == 0:
        return 0.0, 0.0, True
    if not (_numeric(a) and _numeric(b)):
        equal = bool(np.array_equal(a, b))
        return (0.0, 0.0, True) if equal else (math.inf, math.inf, False)
    x, y = _widen(a), _widen(b)
    with np.errstate(all="ignore"):
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        diff = np.where(same, 0.0, np.abs(x - y))
        diff = np.where(np.isnan(diff), np.inf, diff)
        scale = np.abs(y)
        rel = np.where(diff == 0, 0.0, np.where(scale > 0, diff / scale, np.inf))
        close = bool(np.all(same | (diff <= atol + rtol * scale)))
    return float(diff.max()), float(rel.max()), close


def _numeric(a: np.ndarray) -> bool:
    return a.dtype.kind in "biufcV"


def _widen(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    if a.dtype.kind == "V":  # ml_dtypes' bfloat16 and float8 types convert through float32
        return a.astype(np.float32).astype(np.float64)
    return a.astype(np.float64)
