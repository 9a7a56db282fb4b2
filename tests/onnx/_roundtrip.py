"""The checks every exported model goes through: structure, checker, runtimes against eager."""

from __future__ import annotations

import onnx
import torch

from torchscan.onnx import loop_version, scan_version

from ._models import Case
from ._runtimes import (
    assert_outputs_close,
    eager_outputs,
    nodes,
    run_onnxruntime,
    run_reference,
)

SCAN_ATTRIBUTES = {
    "body",
    "num_scan_inputs",
    "scan_input_axes",
    "scan_input_directions",
    "scan_output_axes",
    "scan_output_directions",
}


def default_opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def check_structure(model: onnx.ModelProto, case: Case, opset: int) -> None:
    """The asked opset, one loop node per call, axes and directions as attributes."""
    assert default_opset(model) == opset
    op_types = [node.op_type for node, _ in nodes(model.graph)]
    assert {op: op_types.count(op) for op in ("Scan", "Loop")} == {"Scan": 0, "Loop": 0, **case.ops}
    if "Loop" not in case.ops:
        # A Scan takes axes and directions as attributes; a Loop stacks its outputs on axis 0 in
        # the order it ran, so a scan with until may move or flip them afterwards.
        assert not {"Transpose", "ReverseSequence"} & set(op_types)
    for node, _ in nodes(model.graph):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Scan" and not scan_version(opset).batch_axis:
            assert set(attributes) <= SCAN_ATTRIBUTES
            axes = attributes["scan_input_axes"] + attributes.get("scan_output_axes", [])
            assert scan_version(opset).negative_axes or all(a >= 0 for a in axes)
        if node.op_type == "Loop":
            assert loop_version(opset).op == "Loop"
            assert list(attributes) == ["body"]


def check_onnxruntime(model: onnx.ModelProto, eager: torch.nn.Module, case: Case) -> None:
    for length in case.run_lengths or (case.export_length,):
        inputs = case.inputs(length)
        assert_outputs_close(run_onnxruntime(model, inputs), eager_outputs(eager, inputs), model)


def check_reference(model: onnx.ModelProto, eager: torch.nn.Module, case: Case) -> None:
    lengths = case.run_lengths if case.reference_lengths is None else case.reference_lengths
    for length in lengths or (case.export_length,):
        inputs = case.inputs(length)
        assert_outputs_close(run_reference(model, inputs), eager_outputs(eager, inputs), model)
