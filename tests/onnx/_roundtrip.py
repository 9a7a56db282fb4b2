"""The checks every exported model goes through: structure, checker, runtimes against eager."""

from __future__ import annotations

import os

import onnx
import torch
import torch.utils._pytree as pytree

from torchscan.onnx import loop_version, scan_version, to_torch
from torchscan.onnx._lint._driver import lint

from ._models import Case
from ._runtimes import (
    assert_outputs_close,
    eager_outputs,
    nodes,
    run_onnxruntime,
    run_reference,
)

ALL_OPSETS = [8, 9, 11, 13, 16, 17, 18, 19, 21, 23, 24, 25]
OPSETS = [
    opset
    for opset in ALL_OPSETS
    if str(opset) in os.environ.get("TORCHSCAN_TEST_OPSETS", "").split(",")
    or not os.environ.get("TORCHSCAN_TEST_OPSETS")
]
"""The opsets test models are exported at: all of them, or those that the environment
variable ``TORCHSCAN_TEST_OPSETS`` lists (``8,9,13,18,25``), which CI sets for the other torch
releases to keep its run short."""

EVERY_PAIR = os.environ.get("TORCHSCAN_TEST_ALL_OPSETS", "") not in ("", "0")
"""Whether every case is exported at every opset (``TORCHSCAN_TEST_ALL_OPSETS=1``), rather
than at the sample of :func:`opset_pairs`."""


def opset_pairs(
    names: list[str], opsets: list[int] | tuple[int, ...] = (), per_case: int | None = None
) -> list[tuple[str, int]]:
    """The ``(case, opset)`` points the export tests run: every one of ``opsets`` (default
    :data:`OPSETS`) for every case with ``TORCHSCAN_TEST_ALL_OPSETS=1``; else for each case the
    oldest opset (where the most is converted: Scan-8's batch axis) and 18 (what torch.onnx
    builds, converted by nothing), and for every other case one more in turn, the newest first
    and then from both ends inwards (25, 9, 24, 11, ...), so that every suite exports the
    newest opset and a suite of 20 cases or more every opset.
    With ``per_case``, each case gets that many of ``opsets`` in turn instead (each opset is
    then exported by a share of the cases)."""
    allowed = sorted(opsets or OPSETS)
    if EVERY_PAIR:
        return [(name, opset) for name in names for opset in allowed]
    if per_case is not None:
        return [
            (name, opset)
            for index, name in enumerate(names)
            for opset in sorted(
                {allowed[(index * per_case + k) % len(allowed)] for k in range(per_case)}
            )
        ]
    fixed = sorted({allowed[0], *(o for o in allowed if o == 18)})
    inner = [o for o in allowed if o not in fixed]
    rest = [inner[k // 2] if k % 2 else inner[-1 - k // 2] for k in range(len(inner))]
    pairs = []
    for index, name in enumerate(names):
        # every other case one more opset, in turn
        extra = [rest[(index // 2) % len(rest)]] if rest and index % 2 == 0 else []
        pairs += [(name, opset) for opset in sorted([*fixed, *extra])]
    return pairs


def pair_ids(pairs: list[tuple[str, int]]) -> list[str]:
    return [f"{name}-{opset}" for name, opset in pairs]


"""Every opset whose Scan or Loop differs from the one before, and 13 and 17 (below 18, where
torch.onnx builds nothing itself)."""

CALL_BODIES = ("torchscan_scan_body", "torchscan_loop_body")
"""The names the translation gives the bodies of the nodes that torchscan calls become."""

HELPER_BODIES = ("range_body", "cumsum_body", "reverse_body")
"""The names the conversion below opset 11 gives the bodies of the loops it adds."""

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
    weights = {t.name for t in model.graph.initializer}
    # (a weight's transpose stays a node, which onnxruntime folds: the weight keeps its name)
    op_types = [
        node.op_type
        for node, _ in nodes(model.graph)
        if not (node.op_type == "Transpose" and node.input[0] in weights)
    ]
    calls, helpers = [], []
    for node, _ in nodes(model.graph):
        if node.op_type in ("Scan", "Loop"):
            body = next(a.g for a in node.attribute if a.name == "body")
            (calls if body.name.startswith(CALL_BODIES) else helpers).append((node, body))
    counts = {op: [n.op_type for n, _ in calls].count(op) for op in ("Scan", "Loop")}
    assert counts == {"Scan": 0, "Loop": 0, **case.ops}
    # Below opset 11 the conversion computes what Range, CumSum and flips of a dynamic axis did
    # with small loops of its own, and Scan-8 reverses an output with a second Scan.
    assert opset < 11 or not helpers
    assert all(body.name.startswith(HELPER_BODIES) for _, body in helpers)
    if scan_version(opset).batch_axis:
        # Scan-8 scans axis 1 of batched inputs and appends its outputs: other axes take a
        # Transpose around it.
        return
    if "Loop" not in case.ops:
        # A Scan takes axes and directions as attributes; a Loop stacks its outputs on axis 0 in
        # the order it ran, so a scan with until may move or flip them afterwards.
        assert not {"Transpose", "ReverseSequence"} & set(op_types)
    for node, _ in calls:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Scan":
            assert set(attributes) <= SCAN_ATTRIBUTES
            axes = attributes["scan_input_axes"] + attributes.get("scan_output_axes", [])
            assert scan_version(opset).negative_axes or all(a >= 0 for a in axes)
        if node.op_type == "Loop":
            assert loop_version(opset).op == "Loop"
            assert list(attributes) == ["body"]


def check_valid(model: onnx.ModelProto) -> None:
    """``onnx.checker`` in full, and torchscan's lint of its Scan, Loop and If nodes (an If
    whose branches disagree on a static shape misleads onnxruntime's optimizations)."""
    onnx.checker.check_model(model, full_check=True)
    findings = lint(model).findings
    assert not findings, "\n".join(map(str, findings))


def check_onnxruntime(model: onnx.ModelProto, eager: torch.nn.Module, case: Case) -> None:
    for length in case.run_lengths or (case.export_length,):
        inputs = case.inputs(length)
        assert_outputs_close(run_onnxruntime(model, inputs), eager_outputs(eager, inputs), model)


def check_reference(model: onnx.ModelProto, eager: torch.nn.Module, case: Case) -> None:
    lengths = case.run_lengths if case.reference_lengths is None else case.reference_lengths
    for length in lengths or (case.export_length,):
        inputs = case.inputs(length)
        assert_outputs_close(run_reference(model, inputs), eager_outputs(eager, inputs), model)


REEXPORT_OPSET = 18 if 18 in OPSETS else max(OPSETS)
"""The opset at which the imported models are exported again (one of the sampled opsets of every
case, so that the first export is shared)."""


def imported_sample(pairs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The ``(case, opset)`` points whose export the test command imports back: every other
    one of ``pairs`` (each case at half of its sampled opsets, its oldest among them); all of
    them with ``TORCHSCAN_TEST_ALL_OPSETS=1``."""
    if EVERY_PAIR:
        return list(pairs)
    seen: dict[str, int] = {}
    kept = []
    for name, opset in pairs:
        if seen.setdefault(name, 0) % 2 == 0:
            kept.append((name, opset))
        seen[name] += 1
    return kept


def reexported_sample(names: list[str], refused: list[str]) -> list[str]:
    """The models whose imported module the test command exports again: every fourth one, and
    every one that is refused; all of them with ``TORCHSCAN_TEST_ALL_OPSETS=1``."""
    if EVERY_PAIR:
        return list(names)
    return [name for index, name in enumerate(names) if index % 4 == 0 or name in refused]


def _loop_nodes(graph: onnx.GraphProto) -> list[str]:
    """The Scan and Loop nodes of a graph and its bodies, by operator, sorted."""
    found = []
    for node in graph.node:
        if node.op_type in ("Scan", "Loop"):
            found.append(node.op_type)
        for attribute in node.attribute:
            for body in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                found += _loop_nodes(body)
    return sorted(found)


def check_reexported(
    model: onnx.ModelProto, eager: torch.nn.Module, case: Case, opset: int, refused: bool = False
) -> None:
    """``torch.onnx.export`` of ``torchscan.onnx.to_torch`` of the export, at the same opset and
    with the same dynamic dimensions, has the same Scan and Loop nodes (one Scan stays one Scan;
    an If may be added where torchscan guards a loop that may run no step, as it does for a
    length it cannot tell is positive), and onnxruntime computes the eager model's outputs with
    it at every run length. ``refused``: torch.export refuses to trace the module, with an
    error (see the ``NOT_REEXPORTED`` lists of the test files)."""
    import pytest

    if refused:
        with pytest.raises(
            Exception,
            match=r"torch\.export cannot trace it|Failed to export the model with torch\.export",
        ):
            check_reexported(model, eager, case, opset)
        return
    from .._export import onnx_export

    module = to_torch(model)
    again = onnx_export(
        module,
        tuple(case.inputs(case.export_length)),
        dynamo=True,
        opset_version=opset,
        dynamic_shapes=case.dynamic_shapes(),
    ).model_proto
    assert _loop_nodes(again.graph) == _loop_nodes(model.graph)
    assert [o.version for o in again.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    check_onnxruntime(again, eager, case)


def check_imported(model: onnx.ModelProto, eager: torch.nn.Module, case: Case) -> None:
    """``torchscan.onnx.to_torch`` of the export computes the eager model's outputs at every
    run length, and at the export length the eager model's gradients to every floating input.
    (Not to the parameters: the export folds what it computes from parameters alone into
    constants, and the imported module trains the graph it was given.)"""
    module = to_torch(model)
    for length in case.run_lengths or (case.export_length,):
        inputs = case.inputs(length)
        with torch.no_grad():
            got = module(*inputs)
        got = [got] if isinstance(got, torch.Tensor) else list(got)
        assert_outputs_close([g.detach().numpy() for g in got], eager_outputs(eager, inputs), model)
    inputs = [
        t.detach().clone().requires_grad_(t.is_floating_point())
        for t in case.inputs(case.export_length)
    ]
    imported_inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    want = [leaf for leaf in pytree.tree_leaves(eager(*inputs)) if leaf is not None]
    got = module(*imported_inputs)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    floats = [i for i, w in enumerate(want) if w.is_floating_point() and w.requires_grad]
    if not floats:
        return
    weights = {i: torch.linspace(-1, 1, want[i].numel()).reshape(want[i].shape) for i in floats}
    sum((got[i] * weights[i]).sum() for i in floats).backward()
    try:
        sum((want[i] * weights[i]).sum() for i in floats).backward()
    except RuntimeError as error:
        # A step that reshapes a view of its carry in place (squeeze_) bumps the version of a
        # tensor autograd saved: the eager model, as its Python loop, has no backward.
        if "modified by an inplace operation" not in str(error):
            raise
        return
    for original, imported in zip(inputs, imported_inputs, strict=True):
        if original.grad is not None:
            torch.testing.assert_close(imported.grad, original.grad, rtol=1e-4, atol=1e-5)
