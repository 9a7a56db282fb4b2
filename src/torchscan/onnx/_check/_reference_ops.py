"""Operators of onnx's reference evaluator that ``check`` replaces, through its public ``new_ops``
argument, where onnx 1.23's implementation departs from the specification: ``ReduceLogSumExp``
(NaN where every element reduced is -inf), ``GatherElements`` (a negative ``axis``, and more
than 64 entries along the axis at rank 3 or more, fail) and ``Pad`` (negative pads fail). Each
is a subclass of onnx's own class (or of its base class), named after the operator, as
``new_ops`` requires; it replaces every version of the operator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from torchscan._errors import TorchscanValueError

if TYPE_CHECKING:
    from onnx.reference import ReferenceEvaluator


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
            axes = self.handle_axes(axes, bool(noop_with_empty_axes))
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


@functools.cache
def pad() -> type:
    """onnx.reference's ``Pad``, with negative pads.

    The specification: ``pads`` holds "the number of padding elements to add or remove (if
    negative) at the beginning and end of each axis", in every version from Pad-2 (Pad-1's
    ``paddings`` too). onnx 1.23 hands them to ``numpy.pad``, which refuses a negative width
    ("index can't contain negative values"), so that a model that crops with ``Pad`` (what
    ``torch.nn.functional.pad`` with a negative width exports to) does not run. This removes
    the elements of each negative pad first, then pads what is left with the others, as
    onnxruntime does (``wrap`` wraps around what is left, ``reflect`` and ``edge`` read it).
    One class serves every version: before Pad-11 the pads and the value are attributes
    (``paddings`` and ``value`` in Pad-1), from Pad-11 inputs, with ``axes`` from Pad-18.
    """
    from onnx.reference.op_run import OpRun

    class Pad(OpRun):
        def _run(  # the inputs and attributes of every version, by name
            self,
            data,
            pads=None,
            constant_value=None,
            axes=None,
            mode=None,
            paddings=None,
            value=None,
        ):
            widths = [int(p) for p in np.asarray(pads if pads is not None else paddings).ravel()]
            rank = data.ndim
            chosen = list(range(rank)) if axes is None else [int(a) for a in np.ravel(axes)]
            if len(widths) != 2 * len(chosen):
                raise TorchscanValueError(
                    f"Pad: pads {widths} do not give 2 values for each of {len(chosen)} axes"
                )
            kept = [slice(None)] * rank
            added = [(0, 0)] * rank
            count = len(chosen)
            for axis, begin, end in zip(chosen, widths[:count], widths[count:], strict=True):
                if not -rank <= axis < rank:
                    raise TorchscanValueError(f"Pad: axis {axis} is out of range for rank {rank}")
                axis %= rank
                size = data.shape[axis]
                if size + begin + end < 0:
                    raise TorchscanValueError(
                        f"Pad: pads {widths} remove more than the {size} elements of axis {axis}"
                    )
                kept[axis] = slice(max(-begin, 0), size - max(-end, 0))
                added[axis] = (max(begin, 0), max(end, 0))
            cropped = data[tuple(kept)]
            mode = "constant" if mode is None else mode
            if mode == "constant":
                fill = constant_value if constant_value is not None else value
                fill = 0 if fill is None else np.asarray(fill).reshape(-1)[0]
                out = np.pad(cropped, added, mode="constant", constant_values=fill)
            else:
                out = np.pad(cropped, added, mode=mode)
            return (out.astype(data.dtype),)

    return Pad


@functools.cache
def scatter() -> type:
    """``Scatter``, which onnx's reference evaluator does not implement: the operator of opsets 9
    and 10 that opset 11 renamed ``ScatterElements`` ("This operator is deprecated. Please use
    ScatterElements, which provides the same functionality"), without its ``reduction``. What
    ``torch.Tensor.scatter`` and writes at the step number export to below opset 11."""
    from onnx.reference.ops.op_scatter_elements import ScatterElements

    class Scatter(ScatterElements):
        def _run(self, data, indices, updates, axis=None):
            return super()._run(data, indices, updates, axis=0 if axis is None else int(axis))

    return Scatter


@functools.cache
def spec_loop() -> type:
    """onnx.reference's ``Loop`` with two departures from the specification undone.

    In onnx 1.23 it runs no iteration when ``cond`` is omitted (the ``(M, "")`` mode is a for
    loop that ignores the body's condition), and it joins scan outputs with ``np.vstack``, which
    concatenates per-iteration tensors of rank 2 or more instead of stacking them. This follows
    the specification's pseudo-code. A Loop that runs no iteration gives its scan outputs the
    shapes its body declares (``(0, *shape)``); where a declared shape is not static, it raises
    ``NotImplementedError``: the runtime does not run such a model.
    """
    import onnx.reference.ops.op_loop

    class Loop(onnx.reference.ops.op_loop.Loop):
        # set by OpRun from the node's attributes, which onnx's classes do not declare
        body: ReferenceEvaluator
        _run_body: Callable[..., Any]

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
            carried = [inputs[name] for name in names[2:]]
            if self.K and i == 0:
                empty = _empty_stacks(self.onnx_node, 1 + self.N, "a Loop that runs no iteration")
                return tuple(carried + empty)
            return tuple(carried + [np.stack(column) for column in scan_outputs])

    return Loop


@functools.cache
def spec_scan() -> type:
    """A ``Scan`` for onnx's reference evaluator that runs every version as the specification's
    pseudo-code says.

    onnx 1.23's own runs Scan only along axis 0 and forward (it raises for any other
    ``scan_input_axes``, ``scan_output_axes`` or direction) and runs Scan-8 as if it were Scan-9.
    This one follows the specification of the version in force, read from the evaluator's opset
    of the default domain:

    - Scan-9 and later: ``scan_input_axes`` (negative ones counting from the back, from Scan-11),
      ``scan_input_directions`` (1 reads a sequence from its end), ``scan_output_axes`` and
      ``scan_output_directions`` (1 prepends each step's element).
    - Scan-8: batch axis 0 and sequence axis 1 on every scan input and output, the state
      variables batched on axis 0 too, each example running its own ``sequence_lens[b]``
      steps (the maximum where ``sequence_lens`` is omitted), ``directions`` reading a
      sequence backwards within its length; scan outputs are padded to the maximum length with
      zeros (the specification leaves those values undefined; onnxruntime writes zeros).

    A Scan that runs no step at all has scan outputs whose element shape only the body's run
    would tell: it raises ``NotImplementedError`` (the runtime does not run such a model), as
    onnx's own does.
    """
    from onnx.reference.op_run import OpRun

    class Scan(OpRun):
        # set by OpRun from the node's attributes (None where omitted), which it does not declare
        body: ReferenceEvaluator
        _run_body: Callable[..., Any]
        num_scan_inputs: int
        scan_input_axes: list[int] | None
        scan_input_directions: list[int] | None
        scan_output_axes: list[int] | None
        scan_output_directions: list[int] | None

        def need_context(self) -> bool:
            return True  # the body may read values of the enclosing graphs

        def _run(self, *args, context=None, attributes=None, bindings=None, **_):
            opsets = self.run_params.get("opsets") or {}
            opset = opsets.get("", opsets.get("ai.onnx"))
            run = self._run_8 if opset is not None and opset < 9 else self._run_9
            return run(list(args), context, attributes, bindings)

        def _step(self, context, states, elements, attributes, bindings):
            names = self.body.input_names
            inputs = dict(context or {})
            inputs.update(zip(names, [*states, *elements], strict=True))
            return list(self._run_body(inputs, attributes=attributes, bindings=bindings))

        def _run_9(self, args, context, attributes, bindings):
            m = int(self.num_scan_inputs)
            n = len(args) - m
            states, scans = args[:n], [np.asarray(s) for s in args[n:]]
            in_axes = _per_item(self.scan_input_axes, m, 0)
            in_dirs = _per_item(self.scan_input_directions, m, 0)
            axes = [
                _axis(a, s.ndim, "scan_input_axes") for a, s in zip(in_axes, scans, strict=True)
            ]
            lengths = {s.shape[a] for s, a in zip(scans, axes, strict=True)}
            if len(lengths) != 1:
                raise TorchscanValueError(
                    f"Scan: the scan inputs have different lengths {sorted(lengths)} along "
                    "their scan axes"
                )
            length = lengths.pop()
            k = len(self.body.output_names) - n
            elements: list[list[np.ndarray]] = [[] for _ in range(k)]
            for t in range(length):
                picked = [
                    np.take(s, length - 1 - t if d else t, axis=a)
                    for s, a, d in zip(scans, axes, in_dirs, strict=True)
                ]
                outputs = self._step(context, states, picked, attributes, bindings)
                states = outputs[:n]
                for j in range(k):
                    elements[j].append(np.asarray(outputs[n + j]))
            out_axes = _per_item(self.scan_output_axes, k, 0)
            out_dirs = _per_item(self.scan_output_directions, k, 0)
            results = list(states)
            if k and not length:
                empty = _empty_stacks(self.onnx_node, n, "a Scan that runs no step")
                moved = [
                    np.moveaxis(e, 0, _axis(a, e.ndim, "scan_output_axes"))
                    for e, a in zip(empty, out_axes, strict=True)
                ]
                return tuple(results + moved)
            for column, axis, direction in zip(elements, out_axes, out_dirs, strict=True):
                ordered = column[::-1] if direction else column
                rank = column[0].ndim + 1
                results.append(np.stack(ordered, axis=_axis(axis, rank, "scan_output_axes")))
            return tuple(results)

        def _run_8(self, args, context, attributes, bindings):
            m = int(self.num_scan_inputs)
            lens = args[0]
            rest = args[1:]
            n = len(rest) - m
            inits, scans = rest[:n], [np.asarray(s) for s in rest[n:]]
            dirs = _per_item(getattr(self, "directions", None), m, 0)
            batch, longest = scans[0].shape[0], scans[0].shape[1]
            for s in scans:
                if s.shape[:2] != (batch, longest):
                    raise TorchscanValueError(
                        "Scan-8: the scan inputs have different batch sizes or lengths on axes "
                        f"0 and 1: {[s.shape[:2] for s in scans]}"
                    )
            final: list[list[np.ndarray]] = [[] for _ in range(n)]
            k = len(self.body.output_names) - n
            outputs_of: list[list[list[np.ndarray]]] = []
            for b in range(batch):
                steps = longest if lens is None else int(np.asarray(lens)[b])
                if not 0 <= steps <= longest:
                    raise TorchscanValueError(
                        f"Scan-8: sequence_lens[{b}] is {steps}, outside [0, {longest}]"
                    )
                states = [np.asarray(init)[b] for init in inits]
                columns: list[list[np.ndarray]] = [[] for _ in range(k)]
                for t in range(steps):
                    picked = [
                        s[b, steps - 1 - t if d else t] for s, d in zip(scans, dirs, strict=True)
                    ]
                    outputs = self._step(context, states, picked, attributes, bindings)
                    states = outputs[:n]
                    for j in range(k):
                        columns[j].append(np.asarray(outputs[n + j]))
                for i, state in enumerate(states):
                    final[i].append(np.asarray(state))
                outputs_of.append(columns)
            results = [
                np.stack(states) if states else np.asarray(init)[:0]
                for states, init in zip(final, inits, strict=True)
            ]
            shapes = None
            for j in range(k):
                ran = [columns[j][0] for columns in outputs_of if columns[j]]
                if ran:
                    element = ran[0]
                else:
                    shapes = shapes or _empty_stacks(self.onnx_node, n, "a Scan that runs no step")
                    element = shapes[j][0:0].reshape(shapes[j].shape[1:])
                out = np.zeros((batch, longest, *element.shape), dtype=element.dtype)
                for b, columns in enumerate(outputs_of):
                    for t, value in enumerate(columns[j]):
                        out[b, t] = value
                results.append(out)
            return tuple(results)

    return Scan


def _per_item(values, count: int, default: int) -> list[int]:
    """An optional list attribute with one entry per input or output, its default filled in."""
    values = [] if values is None else [int(v) for v in values][:count]
    return values + [default] * (count - len(values))


def _axis(axis: int, rank: int, attribute: str) -> int:
    if not -rank <= axis < rank:
        raise TorchscanValueError(f"Scan: {attribute} holds {axis}, outside [{-rank}, {rank - 1}]")
    return axis % rank


def _empty_stacks(node, first: int, what: str) -> list[np.ndarray]:
    """The scan outputs of a loop node that ran no step: empty along a new axis 0, of the element
    types and shapes its body declares for its outputs from ``first`` on. Raises
    ``NotImplementedError`` (the runtime does not run the model) where a shape is not static."""
    body = next(a.g for a in node.attribute if a.name == "body")
    stacks = []
    for output in body.output[first:]:
        tensor = output.type.tensor_type
        dims = tensor.shape.dim if output.type.HasField("tensor_type") else None
        if (
            dims is None
            or not tensor.HasField("shape")
            or any(not d.HasField("dim_value") for d in dims)
        ):
            raise NotImplementedError(
                f"{what} has scan outputs whose shape its body does not declare "
                f"({output.name!r}), so their shape is unknown"
            )
        dtype = ir.DataType(tensor.elem_type).numpy()
        stacks.append(np.empty((0, *(d.dim_value for d in dims)), dtype=dtype))
    return stacks
