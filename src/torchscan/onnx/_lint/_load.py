"""Reading the model ``check`` is given, from a path, bytes or an ``onnx.ModelProto``, with the
errors of :mod:`torchscan.onnx._files` that say what is wrong with a file.

This module is the check's boundary with protobuf: the model read, and the types ONNX shape
inference adds to it (onnx's C++, on protobuf), are read into ``onnx_ir`` once
(:class:`LoadedModel`), and every analysis of the check reads them there; the proto is kept as
loaded for the runtimes, which take protobuf or its bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from typing import Any

import onnx
import onnx.checker
import onnx.external_data_helper
import onnx.shape_inference
import onnx_ir as ir

from torchscan._errors import TorchscanValueError
from torchscan.onnx._files import check_readable, load_model


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A model as ``check`` reads it, read once.

    Attributes:
      label: how messages name the model: its path, ``"<bytes>"`` or ``"<ModelProto>"``.
      model: the model as given, in onnx_ir: what its inputs, its random inputs, the outputs
        that depend on a random operator and the element types onnxruntime lacks are read from.
      typed: the model with the types and shapes ONNX shape inference adds, in onnx_ir: what the
        lint and the dimensions random inputs must give one size are read from; ``model``
        itself where inference fails.
      proto: the model as loaded (its external data read in), which the runtimes run: they take
        protobuf (onnx's reference evaluator) or its bytes (onnxruntime, :attr:`data`).
    """

    label: str
    model: ir.Model
    typed: ir.Model
    proto: onnx.ModelProto

    @functools.cached_property
    def data(self) -> bytes:
        """The model as loaded, serialized once for every run of onnxruntime."""
        return self.proto.SerializeToString()


UNTYPED_TENSOR = "torchscan.check.untyped_tensor"
"""The key in ``ir.Value.meta`` that marks a graph input or output whose type is a tensor type
without an element type: onnx_ir reads it as no type at all, and the check as a tensor of an
undefined element type (``undefined of any shape``)."""


def load(model: Any) -> LoadedModel:
    """Read ``model`` (path, bytes or ModelProto), refuse it where no tool can read it, infer its
    types and read both into onnx_ir.

    Returns:
      The model, read once (:class:`LoadedModel`).

    Raises:
      FileNotFoundError: no file at the path.
      ValueError: a folder, an empty file, a file that is not an ONNX model, is truncated or
        corrupt, or that onnx_ir cannot read; the message starts with the model's label.
      TypeError: none of the accepted types.
    """
    proto, label = load_model(model)
    check_readable(proto, label)
    return read_model(proto, label)


def read_model(proto: onnx.ModelProto, label: str) -> LoadedModel:
    """``proto`` read into onnx_ir, as given and with the types ONNX shape inference adds.

    Returns:
      The model, read once (:class:`LoadedModel`).

    Raises:
      ValueError: onnx_ir cannot read the model (it has map types, for one); the message starts
        with ``label``.
    """
    inferred = _with_inferred_types(proto)
    try:
        typed = _deserialize(inferred)
        model = typed if inferred is proto else _deserialize(proto)
    except TorchscanValueError as error:
        raise TorchscanValueError(f"{label}: {error}") from None
    _mark_untyped_tensors(proto, model)
    return LoadedModel(label, model, typed, proto)


def typed_model(proto: onnx.ModelProto) -> ir.Model:
    """``proto`` with the types and shapes ONNX shape inference adds, in onnx_ir.

    Returns:
      The model in onnx_ir.

    Raises:
      ValueError: onnx_ir cannot read the model.
    """
    return _deserialize(_with_inferred_types(proto))


def _with_inferred_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the types and shapes ONNX can infer, or as it is where inference fails
    (a model broken enough to be linted is often too broken to be inferred)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception:  # any failure of inference leaves the model's own annotations
        return model


def _deserialize(model: onnx.ModelProto) -> ir.Model:
    """``model`` in onnx_ir, without the log lines onnx_ir writes about a broken model: the
    lint's findings say what is broken."""
    logger = logging.getLogger(ir.serde.__name__)
    disabled, logger.disabled = logger.disabled, True
    try:
        return ir.serde.deserialize_model(model)
    except Exception as error:  # SerdeError, and whatever a corrupt model makes onnx_ir raise
        cause: BaseException = error
        while cause.__cause__ is not None:  # onnx_ir wraps the reason in errors of its own
            cause = cause.__cause__
        reason = " ".join(str(cause).split()) or type(cause).__name__
        raise TorchscanValueError(f"onnx_ir cannot read the model to lint it: {reason}") from None
    finally:
        logger.disabled = disabled


def _mark_untyped_tensors(proto: onnx.ModelProto, model: ir.Model) -> None:
    """Mark (:data:`UNTYPED_TENSOR`) the graph inputs and outputs of ``model`` whose type in
    ``proto`` is a tensor type without an element type, which onnx_ir reads as no type."""
    graph = model.graph
    for infos, values in ((proto.graph.input, graph.inputs), (proto.graph.output, graph.outputs)):
        for info, value in zip(infos, values, strict=False):
            if info.type.HasField("tensor_type") and not info.type.tensor_type.HasField(
                "elem_type"
            ):
                value.meta[UNTYPED_TENSOR] = True
