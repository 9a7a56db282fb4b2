"""Operators of onnx's reference evaluator that ``check`` replaces, through its public ``new_ops``
argument, where onnx 1.23's implementation departs from the specification: ``ReduceLogSumExp``
(NaN where every element reduced is -inf) and ``GatherElements`` (a negative ``axis``, and more
than 64 entries along the axis at rank 3 or more, fail). Each is a subclass of onnx's own class,
named after the operator, as ``new_ops`` requires; it replaces every version of the operator.
"""

from __future__ import annotations

import functools

import numpy as np

from torchscan._errors import TorchscanValueError


@functools.cache
def log_sum_exp() -> type:
    """onnx.reference's ``ReduceLogSumExp``, with a row of -inf giving -inf.

    The specification defines the operator as ``log(sum(exp(x)))`` over the axes, and a reduction
    over an empty set as -inf: a row whose elements are all -inf sums to 0, whose log is -inf
    (as in onnxruntime and ``torch.logsumexp``). onnx 1.23 subtracts the row's maximum, -inf, from
    every element first, which gives NaN. This subtracts the maximum only where it is finite.
    One class serves every version: before opset 18 ``axes`` is an attribute, from 18 an input.
    """
    from onnx.reference.ops.op_reduce_log_sum_exp import ReduceLogSumExp_18

    class ReduceLogSumExp(ReduceLogSumExp_18):
        def _run(self, data, axes=None, keepdims=1, noop_with_empty_axes=0):
            if data.size == 0 or not np.issubdtype(data.dtype, np.floating):
                # an empty set is -inf, and integers are refused, as onnx's own does
                return super()._run(data, axes, keepdims, noop_with_empty_axes)
            axes = self.handle_axes(axes, noop_with_empty_axes)
            if axes == ():
                return (data.copy(),)  # noop_with_empty_axes: no axis is reduced
            with np.errstate(all="ignore"):
                top = np.max(data, axis=axes, keepdims=True)
                shift = np.where(np.isfinite(top), top, 0).astype(data.dtype)
                total = np.sum(np.exp(data - shift), axis=axes, keepdims=True, dtype=data.dtype)
                result = (np.log(total) + shift).astype(data.dtype)
            if not keepdims:
                result = np.squeeze(result, axis=axes)
            return (result,)

    return ReduceLogSumExp


@functools.cache
def gather_elements() -> type:
    """onnx.reference's ``GatherElements``, following the specification for every ``axis``.

    The specification: ``out[i][j][k] = input[index[i][j][k]][j][k]`` along axis 0 (and likewise
    along the others), the output of the shape of ``indices``, ``axis`` in ``[-r, r-1]`` and
    indices in ``[-s, s-1]`` along an axis of size ``s``. onnx 1.23 fails on a negative ``axis``
    (it slices the shapes with it as if it were not negative), and, through ``numpy.choose``, on
    an axis of more than 64 entries at rank 3 or more. This is ``numpy.take_along_axis`` over the
    part of ``data`` that ``indices`` covers (``indices`` may be smaller than ``data`` on the
    other axes, as in onnxruntime).
    """
    from onnx.reference.ops.op_gather_elements import GatherElements as Reference

    class GatherElements(Reference):
        def _run(self, data, indices, axis=None):
            axis = 0 if axis is None else int(axis)
            if indices.ndim != data.ndim or not -data.ndim <= axis < data.ndim:
                raise TorchscanValueError(
                    f"GatherElements: indices of rank {indices.ndim} and axis {axis} do not fit "
                    f"data of rank {data.ndim}"
                )
            axis %= data.ndim
            for d, (n, size) in enumerate(zip(indices.shape, data.shape, strict=True)):
                if d != axis and n > size:
                    raise TorchscanValueError(
                        f"GatherElements: indices have {n} entries on axis {d}, where data has "
                        f"{size}"
                    )
            covered = tuple(
                slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices.shape)
            )
            return (np.take_along_axis(data[covered], indices.astype(np.int64), axis=axis),)

    return GatherElements
