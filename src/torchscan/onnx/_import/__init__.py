"""ONNX models as PyTorch modules, their ``Scan``, ``Loop`` and ``If`` as torchscan's loops."""

from __future__ import annotations

import os

import onnx

from torchscan._errors import OnnxImportError, TorchscanTypeError
from torchscan.onnx._files import check_readable, load_model
from torchscan.onnx._import import (  # noqa: F401 (registers)
    _ops_control,
    _ops_image,
    _ops_index,
    _ops_math,
    _ops_ml,
    _ops_nn,
    _ops_quantization,
    _ops_sequence,
    _ops_shape,
)
from torchscan.onnx._import._graph import OnnxModule, compile_model
from torchscan.onnx._import._registry import implemented
from torchscan.onnx._import._weights import Trainable


def to_torch(
    model: onnx.ModelProto | str | os.PathLike[str] | bytes,
    *,
    trainable: Trainable = "weights",
) -> OnnxModule:
    """The ONNX ``model`` as a ``torch.nn.Module`` whose ``forward`` computes its graph.

    The module runs the graph's nodes in order, each as torch computes its operator, so that it
    runs eagerly on any device, with autograd, and exports again with ``torch.onnx.export``.
    Every ``Scan`` becomes a ``torchscan.scan`` (its axes and directions as ``in_axes``,
    ``in_reverse``, ``out_axes`` and ``out_reverse``; Scan-8's batch and ``sequence_lens`` run
    example by example), every ``Loop`` a ``torchscan.loop`` (its trip count and condition as
    ``trip_count``, ``cond`` and ``until``), every ``If`` the branch its condition picks
    (``torch.cond`` while ``torch.export`` traces it), nested to any depth; a body reads the
    values of the graphs around it by name, as ONNX scopes them.

    Unlike onnxruntime, the module computes in torch: floating-point results may differ in
    their last bits, and an operator is computed only in the versions listed in the guide's
    coverage table (docs/import.md); any other is refused when the model is imported.

    Args:
        model: an ``onnx.ModelProto``, the path of an ``.onnx`` file (its external data read
            from beside it), or its bytes.
        trainable: which floating-point tensors (initializers, and the values of ``Constant``
            nodes) are the module's parameters; the others are buffers, which training leaves
            as they are. ``"weights"`` (the default): every one but the model's constants, a
            tensor of one element (an exponent, the ``1`` of ``1 - z``), one that holds an
            infinity (a mask), one used as a comparison's operand, an exponent or in shape and
            index arithmetic, a rank-1 table read by ``Gather`` (docs/import.md). ``"all"``:
            every one; ``"none"``; a collection of names; or a predicate
            ``trainable(name, tensor) -> bool``.

    Returns:
        An ``OnnxModule``: ``module(*inputs)`` takes the graph's inputs in order (or by name, as
        keywords) and returns its output, or a tuple of its outputs. The ``trainable`` tensors
        are its parameters (so it can be fine-tuned without changing the model's constants),
        the others its buffers.

    Raises:
        OnnxImportError: the file is empty, truncated or corrupt, or no ONNX model (the
            message says which, as ``torchscan check`` does); the model fails
            ``onnx.checker``, or a node's operator (in the version of the model's opset) is not
            implemented, or a node breaks its operator's rules (the message names the node, its
            operator and version).
        FileNotFoundError: no file at the path.

    Example:
        >>> import torch, torchscan, torchscan.onnx
        >>> class Cumsum(torch.nn.Module):
        ...     def forward(self, xs):
        ...         return torchscan.scan(lambda c, x: (c + x, c + x), xs[0] * 0, xs)[1]
        >>> xs = torch.ones(3, 2)
        >>> length = {0: torch.export.Dim("T")}  # (a static length would refuse length 4)
        >>> program = torch.onnx.export(
        ...     Cumsum().eval(), (xs,), dynamic_shapes=(length,), dynamo=True, verbose=False
        ... )
        >>> module = torchscan.onnx.to_torch(program.model_proto)
        >>> module(torch.ones(4, 2)).tolist()
        [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]
    """
    if not isinstance(model, onnx.ModelProto):
        if not isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview)):
            raise TorchscanTypeError(
                "torchscan.onnx.to_torch: model must be an onnx.ModelProto, a path or bytes, "
                f"but got {type(model).__name__}"
            )
        try:
            model, label = load_model(model)
            check_readable(model, label)
        except ValueError as error:
            raise OnnxImportError(f"torchscan.onnx.to_torch: {error}") from None
    return compile_model(model, trainable)


def coverage() -> dict[str, list[int]]:
    """The versions of every operator ``to_torch`` implements."""
    return implemented()


__all__ = ["OnnxImportError", "OnnxModule", "coverage", "to_torch"]
