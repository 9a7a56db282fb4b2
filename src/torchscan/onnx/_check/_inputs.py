"""The inputs ``check`` is given and the outputs it is told to expect: from an ``.npz`` file or a
folder of ``input_*.pb`` and ``output_*.pb`` files, a mapping or a sequence, or the tensors of
``args``; made what the runtimes take (numpy arrays, lists of them for sequences, None for empty
optionals; torch's bfloat16 and float8 through ``ml_dtypes``), held against the model's input
types (read in onnx_ir) before anything runs, and described in the words of the report. The
``.pb`` files are protobuf by nature, and read as such (:func:`_read_proto`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
from google.protobuf.message import DecodeError

from torchscan._errors import TorchscanValueError
from torchscan.onnx import _ir
from torchscan.onnx._lint._load import UNTYPED_TENSOR


def graph_inputs(model: ir.Model) -> list[ir.Value]:
    """The inputs a model must be fed: its graph inputs that are not initializers."""
    initialized = set(model.graph.initializers)
    return [i for i in model.graph.inputs if i.name not in initialized]


def input_names(model: ir.Model) -> list[str]:
    """The names of the inputs a model must be fed, in order."""
    return [_ir.name_of(i) for i in graph_inputs(model)]


def output_names(model: ir.Model) -> list[str]:
    """The names of the model's outputs, in order."""
    return [o.name or "" for o in model.graph.outputs]


def value_type(value: ir.Value) -> ir.TypeProtocol | None:
    """The type of a value as the model declares it, or None where it declares none. A tensor
    type without an element type, which onnx_ir reads as no type (keeping its shape, if any),
    is a tensor of an undefined element type."""
    if value.type is None and (value.shape is not None or value.meta.get(UNTYPED_TENSOR)):
        return ir.TensorType(ir.DataType.UNDEFINED)
    return value.type


_KINDS: tuple[tuple[type, str], ...] = (
    (ir.TensorType, "tensor_type"),
    (ir.SparseTensorType, "sparse_tensor_type"),
    (ir.SequenceType, "sequence_type"),
    (ir.OptionalType, "optional_type"),
)


def _kind(type_: ir.TypeProtocol | None) -> str | None:
    """What ``type_`` is, by the name of its field in ONNX's ``TypeProto`` (``"tensor_type"``,
    ``"sequence_type"``, ...), as messages name it; None for no type."""
    if type_ is None:
        return None
    return next((name for cls, name in _KINDS if isinstance(type_, cls)), str(type_))


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, list):
        return f"seq[{len(value)}]" + (f" of {_describe(value[0])}" if value else "")
    return f"{_dtype_name(value.dtype)}[{', '.join(str(d) for d in value.shape)}]"


def _dtype_name(dtype: np.dtype) -> str:
    return "string" if dtype.kind in "OUS" else dtype.name


def _type_text(type_: ir.TypeProtocol | None, shape: ir.Shape | None) -> str:
    """An ONNX type in the words of :func:`_describe`, as in ``float32[T, 2]``; ``shape`` is the
    shape of its tensor (onnx_ir keeps the shape of a sequence's or an optional's tensor on the
    value, as that of the value)."""
    if isinstance(type_, ir.SequenceType):
        return f"seq of {_type_text(type_.elem_type, shape)}"
    if isinstance(type_, ir.OptionalType):
        return f"optional {_type_text(type_.elem_type, shape)}"
    if not isinstance(type_, ir.TensorType):
        return str(_kind(type_))
    expected = _np_dtype(type_.dtype)
    name = _dtype_name(expected) if expected is not None else type_.dtype.name.lower()
    if shape is None:
        return f"{name} of any shape"
    return f"{name}[{', '.join(_dim_text(d) for d in shape)}]"


def _dim_text(dim: int | ir.SymbolicDim) -> str:
    if isinstance(dim, int):
        return str(dim)
    return "?" if dim.value is None else dim.value


@functools.cache
def _numpy_dtypes() -> dict[int, np.dtype]:
    """numpy's type for every ONNX element type that has one (all but UNDEFINED), by number."""
    found = {}
    for data_type in ir.DataType:
        try:
            found[int(data_type)] = np.dtype(data_type.numpy())
        except (KeyError, ValueError, TypeError):
            continue
    return found


def _np_dtype(elem_type: ir.DataType) -> np.dtype | None:
    return _numpy_dtypes().get(int(elem_type))


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where given inputs come from, in the words of the errors about them.

    Attributes:
      name: the file or folder they were read from (``"in.npz"``), or what they are, in the
        plural (``"the inputs"``).
      model: the model's path, or ``"the model"``.
      plural: whether ``name`` is plural (``"the inputs give"``, ``"in.npz gives"``).
      files: the file each input was read from, by input name (``input_*.pb`` files).
    """

    name: str
    model: str = "the model"
    plural: bool = False
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def gives(self, input_name: str | None = None) -> str:
        """``"in.npz gives"``, or the file the input came from: ``"case/input_0.pb gives"``."""
        file = self.files.get(input_name or "")
        if file is not None:
            return f"{file} gives"
        return f"{self.name} {'give' if self.plural else 'gives'}"


def model_name(label: str) -> str:
    """How errors about inputs name a model: its path, or "the model" (bytes, a proto)."""
    return "the model" if label.startswith("<") else label


def _check_fit(model: ir.Model, feeds: Mapping[str, Any], source: _Source) -> None:
    """Refuse values that the model's inputs do not take, before anything runs: a runtime
    would fail on them, or worse, onnx.reference would compute in their type."""
    for info in graph_inputs(model):
        value = feeds[_ir.name_of(info)]
        type_ = value_type(info)
        problem = _misfit(type_, info.shape, value)
        if problem:
            raise TorchscanValueError(
                f"{source.model}: input {info.name!r} takes {_type_text(type_, info.shape)}, "
                f"but {source.gives(info.name)} {_describe(value)}: {problem}"
            )


def _misfit(
    type_: ir.TypeProtocol | None, shape: ir.Shape | None, value: Any, shapes: bool = True
) -> str | None:
    """Why ``value`` is not of type ``type_`` (its tensor of shape ``shape``), or None.
    Sequence elements are held to their element type only, as their declared shapes often stand
    for several shapes."""
    if isinstance(type_, ir.OptionalType):
        return None if value is None else _misfit(type_.elem_type, shape, value)
    if isinstance(type_, ir.SequenceType):
        if not isinstance(value, list):
            return "it is not a sequence (give a list of tensors)"
        for i, item in enumerate(value):
            problem = _misfit(type_.elem_type, shape, item, shapes=False)
            if problem:
                return f"its element {i}: {problem}"
        return None
    if not isinstance(type_, ir.TensorType):
        return None  # map and sparse inputs: the runtimes say what they make of them
    if value is None or isinstance(value, list):
        return "it is not a tensor"
    expected = _np_dtype(type_.dtype)
    if expected is not None and not (
        value.dtype == expected or (expected.kind == "O" and value.dtype.kind in "OUS")
    ):
        return f"its element type is {_dtype_name(value.dtype)}, not {_dtype_name(expected)}"
    if not shapes or shape is None:
        return None
    dims = list(shape)
    if value.ndim != len(dims):
        return f"its rank is {value.ndim}, not {len(dims)}"
    for axis, (dim, size) in enumerate(zip(dims, value.shape, strict=True)):
        if isinstance(dim, int) and dim != size:
            return f"its dimension {axis} is {size}, not {dim}"
    return None


def _feeds(model: ir.Model, values: Any, source: _Source) -> dict[str, Any]:
    """Map given values (by name or by position) onto the model's inputs."""
    names = input_names(model)
    listed = ", ".join(names) or "none"
    if isinstance(values, Mapping):
        unknown = [k for k in values if k not in names]
        if unknown:
            raise TorchscanValueError(
                f"{source.gives()} values for {', '.join(map(repr, unknown))}, which "
                f"{source.model} has no input for; its inputs are: {listed}"
            )
        missing = [n for n in names if n not in values]
        if missing:
            raise TorchscanValueError(
                f"{source.gives()} no value for input {missing[0]!r} of {source.model}; its "
                f"inputs are: {listed}"
            )
        feeds = {n: _as_value(values[n]) for n in names}
    else:
        values = list(values)
        if len(values) != len(names):
            raise TorchscanValueError(
                f"{source.gives()} {len(values)} values, but {source.model} has {len(names)} "
                f"inputs: {listed}"
            )
        feeds = {n: _as_value(v) for n, v in zip(names, values, strict=True)}
    _check_fit(model, feeds, source)
    return feeds


def _by_position(model: ir.Model, values: Any) -> list[Any]:
    """The expected outputs, in the model's output order."""
    names = output_names(model)
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


# --- files ------------------------------------------------------------------------------------


def read_inputs(
    path: str | os.PathLike, model: ir.Model, label: str = "the model"
) -> tuple[dict, list | None]:
    """Feeds from an ``.npz`` file or a folder of ``input_*.pb`` files, and the expected
    outputs from the folder's ``output_*.pb`` files where there are any; errors name the model
    by ``label`` (its path), the file, and the input.

    Raises:
      FileNotFoundError: nothing at ``path``.
      ValueError: the file or folder cannot be read, or does not fit the model's inputs.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        return _read_test_data(path, model, label)
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
    names = input_names(model)
    positional = [f"arr_{i}" for i in range(len(arrays))]
    source = _Source(str(path), model_name(label))
    if sorted(arrays) == sorted(positional) and not set(arrays) & set(names):
        return _feeds(model, [arrays[k] for k in positional], source), None
    return _feeds(model, arrays, source), None


def _read_test_data(folder: Path, model: ir.Model, label: str) -> tuple[dict, list | None]:
    if not list(folder.glob("input_*.pb")):
        data_sets = sorted(folder.glob("test_data_set_*"))
        if not data_sets:
            raise TorchscanValueError(
                f"{folder}: has no input_*.pb files and no test_data_set_* folder"
            )
        folder = data_sets[0]
    infos = graph_inputs(model)
    inputs, files = _read_protos(folder, "input", infos, label)
    outputs, _ = _read_protos(folder, "output", list(model.graph.outputs), label)
    named = {_ir.name_of(info): str(file) for info, file in zip(infos, files, strict=False)}
    source = _Source(str(folder), model_name(label), files=named)
    return _feeds(model, inputs, source), outputs or None


def _read_protos(
    folder: Path, prefix: str, infos: Sequence[ir.Value], label: str
) -> tuple[list[Any], list[Path]]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: _index(p, prefix))
    if files and len(files) != len(infos):
        raise TorchscanValueError(
            f"{folder}: has {len(files)} {prefix}_*.pb files, but {model_name(label)} has "
            f"{len(infos)} {prefix}s"
        )
    values = [
        _read_proto(file, _kind(value_type(info)), f"{prefix} {info.name!r}")
        for file, info in zip(files, infos, strict=False)
    ]
    return values, files


def _index(path: Path, prefix: str) -> int:
    match = re.fullmatch(rf"{prefix}_(\d+)\.pb", path.name)
    return int(match.group(1)) if match else -1


def _read_proto(file: Path, kind: str | None, what: str) -> Any:
    """One ``.pb`` file, read as the proto its value's type (of :func:`_kind` ``kind``) calls
    for, as ONNX's backend tests write them: TensorProto, SequenceProto or OptionalProto. These
    files are protobuf by nature: this is the one reader of them."""
    readers = {
        "tensor_type": (onnx.TensorProto, onnx.numpy_helper.to_array),
        "sequence_type": (onnx.SequenceProto, onnx.numpy_helper.to_list),
        "optional_type": (onnx.OptionalProto, onnx.numpy_helper.to_optional),
    }
    if kind not in readers:
        raise TorchscanValueError(f"{file}: cannot read {what}, of type {kind}, from it")
    proto_type, to_value = readers[kind]
    try:
        return to_value(proto_type.FromString(file.read_bytes()))
    except (DecodeError, ValueError, TypeError) as error:
        raise TorchscanValueError(
            f"{file}: cannot read {what} from it: it is not a {proto_type.__name__} ({error})"
        ) from None


# --- torch tensors ----------------------------------------------------------------------------


def _feeds_from_args(
    model: ir.Model, args: Sequence[Any], label: str = "the model"
) -> dict[str, Any]:
    import torch

    from torchscan import _pytree

    tensors = [leaf for leaf in _pytree.tree_leaves(list(args)) if isinstance(leaf, torch.Tensor)]
    names = input_names(model)
    if len(tensors) != len(names):
        raise TorchscanValueError(
            f"args hold {len(tensors)} tensors, but the model has {len(names)} inputs "
            f"({', '.join(names) or 'none'}); give the model's inputs with inputs"
        )
    feeds = {n: _torch_to_numpy(t) for n, t in zip(names, tensors, strict=True)}
    _check_fit(model, feeds, _Source("the tensors of args", model_name(label), plural=True))
    return feeds


def _torch_args(feeds: Mapping[str, Any]) -> list[Any]:
    """The feeds as the positional arguments of a PyTorch module: copies as torch tensors (lists
    of them for sequences, None for empty optionals), in the model's input order; values torch
    has no tensors for (strings) stay numpy arrays."""
    return [_numpy_to_torch(value) for value in feeds.values()]


def _numpy_to_torch(value: Any) -> Any:
    import torch

    if value is None:
        return None
    if isinstance(value, list):
        return [_numpy_to_torch(v) for v in value]
    for torch_type, (_, ml_dtype) in _ml_dtypes_of_torch().items():
        if value.dtype == np.dtype(ml_dtype):  # through signed integers of its width
            bits = np.array(value, copy=True).view(f"int{8 * value.dtype.itemsize}")
            return torch.from_numpy(bits).view(torch_type)
    if value.dtype.kind not in "biufc":
        return value
    return torch.from_numpy(np.array(value, copy=True))


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
