"""Bugs the differential fuzzer found, each as a plain test of its own (tests/fuzz/)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchscan
from torchscan.onnx._lint._driver import lint

from .._export import onnx_export
from ..onnx._runtimes import run_onnxruntime, run_reference


def _export_and_run(
    module: torch.nn.Module, export_args: tuple, run_args: list[tuple], dynamic, opset: int = 18
) -> None:
    """Export ``module`` with a dynamic length; onnxruntime gives eager's outputs on every
    ``run_args``."""
    model = onnx_export(
        module, export_args, dynamo=True, opset_version=opset, dynamic_shapes=dynamic
    ).model_proto
    for args in run_args:
        with torch.no_grad():
            expected = [
                t.numpy() for t in torch.utils._pytree.tree_leaves(module(*args)) if t is not None
            ]
        names = {i.name for i in model.graph.input}
        feeds = [a for a, i in zip(args, ("w", "xs"), strict=True) if i in names]
        for actual in run_onnxruntime(model, feeds).values():
            assert len(actual) == len(expected)
            for a, e in zip(actual, expected, strict=True):
                np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


class _UntilWithoutOutputs(torch.nn.Module):
    """A scan that stops with until and has no per-step output (``y`` is None)."""

    def forward(self, w, xs):
        def step(c, x):
            c = torch.tanh(c + x)
            return c, None, torchscan.until(c.sum() > 1)

        return torchscan.scan(step, w, xs)


def test_scan_with_until_and_no_outputs_exports() -> None:
    # torch.export failed with PendingUnbackedSymbolNotFound: the Loop's fake implementation made
    # a size for the number of steps run, which no output held.
    module = _UntilWithoutOutputs().eval()
    dim = torch.export.Dim("T", min=0)
    gen = torch.Generator().manual_seed(0)
    runs = [(torch.randn(3, generator=gen), torch.randn(t, 3, generator=gen)) for t in (4, 0, 1, 6)]
    _export_and_run(module, runs[0], runs, (None, {0: dim}))


class _ClampFloat64(torch.nn.Module):
    """A loop whose body clamps float64 values read with the counter."""

    def forward(self, w, xs):
        def body(i, c):
            return (c + xs[i]).clamp(-1.5, 1.5), (xs[i] @ w).clamp(-4, 4)

        return torchscan.loop(body, torch.zeros_like(w), trip_count=xs.shape[0])


@pytest.mark.parametrize("opset", [8, 9, 11])
def test_float64_clamp_below_opset_12_runs_in_onnxruntime(opset) -> None:
    # The conversion kept a double Clip-6 or Clip-11, which the ONNX schema allows but
    # onnxruntime implements for float only: the session failed with NOT_IMPLEMENTED.
    module = _ClampFloat64().eval()
    dim = torch.export.Dim("T", min=0)
    gen = torch.Generator().manual_seed(0)
    runs = [
        (torch.randn(3, dtype=torch.float64, generator=gen),
         torch.randn(t, 3, dtype=torch.float64, generator=gen))
        for t in (4, 0, 1, 6)
    ]  # fmt: skip
    _export_and_run(module, runs[0], runs, (None, {0: dim}), opset)


class _GatherFewerRows(torch.nn.Module):
    """A loop whose body gathers with an index smaller than the carry on the other axis, which
    torch and the ONNX specification allow."""

    def forward(self, w, xs):
        def body(i, c):
            index = torch.tensor([1, 1, 1, 0]).reshape(2, 2)
            return c + xs[i], torch.gather(c, -1, index)

        return torchscan.loop(body, w, trip_count=xs.shape[0])


def test_gather_with_a_smaller_index_runs_in_the_reference_evaluator() -> None:
    # The tests ran onnx's reference evaluator without the check tool's GatherElements, which
    # refuses an index smaller than the data on an axis other than the gathered one.
    module = _GatherFewerRows().eval()
    gen = torch.Generator().manual_seed(0)
    w, xs = torch.randn(2, 3, generator=gen), torch.randn(4, 2, 3, generator=gen)
    dim = torch.export.Dim("T", min=0)
    model = onnx_export(
        module, (w, xs), dynamo=True, opset_version=15, dynamic_shapes=(None, {0: dim})
    ).model_proto
    with torch.no_grad():
        expected = [t.numpy() for t in module(w, xs)]
    for actual in (run_reference(model, [w, xs]), *run_onnxruntime(model, [w, xs]).values()):
        for a, e in zip(actual, expected, strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7)


class _GuardedScanThenSizes(torch.nn.Module):
    """A scan that may run no step, over three sequences of which it reads one, and sizes read
    from its output afterwards: the guard's branches named values in a count of their own,
    which met a name of the outer graph (onnxruntime: "Graph must be in single static
    assignment (SSA) form, however 'val_18' has been used as output names multiple times")."""

    def forward(self, s1, s2, s3):
        def step(carry, x):
            first, _, third = x
            unused = third * 0.5 - 0.25  # noqa: F841  (what the fuzzer drew)
            return None, torch.stack([first, first])

        _, ys = torchscan.scan(step, None, (s1, s2, s3))
        return ys, torch.ones(ys.shape[0], 2) * ys.shape[0] + ys.numel()


@pytest.mark.parametrize("opset", [10, 12, 18])
def test_names_in_the_branches_of_a_guarded_scan_are_unique(opset: int) -> None:
    module = _GuardedScanThenSizes().eval()
    time = torch.export.Dim("T", min=0)

    def inputs(t: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(t)
        return (
            torch.randint(-5, 6, (t,), generator=gen),
            torch.rand(t, generator=gen) > 0.5,
            torch.randn(t, generator=gen),
        )

    model = onnx_export(
        module, inputs(3), dynamo=True, opset_version=opset, dynamic_shapes=({0: time},) * 3
    ).model_proto
    findings = lint(model).findings
    assert not findings, findings
    for t in (1, 3, 5):
        with torch.no_grad():
            expected = [v.numpy() for v in module(*inputs(t))]
        for actual in run_onnxruntime(model, inputs(t)).values():
            for a, e in zip(actual, expected, strict=True):
                np.testing.assert_array_equal(a, e)


def test_vmap_of_a_reduction_over_a_middle_axis_slice_adds_as_the_python_loop() -> None:
    """Under vmap, the first step's copy of a slice of a scan over a middle axis was dense, so
    that its sum added in another order than the Python loop's (a difference of 1e-14 in
    float64, which vmap of the loop does not have)."""

    def step(c, x):
        return torch.tanh(0.5 * c + x[2].sum().to(torch.float64)), c

    def loop(init, xs):
        c, ys = init, []
        for t in range(xs[0].shape[1]):
            c, y = step(c, tuple(x[:, t] for x in xs))
            ys.append(y)
        return c, torch.stack(ys, dim=1)  # stacked along the scanned axis

    torch.manual_seed(0)
    torch.randn(3, 3)
    init = torch.randn(2, 2, 3, dtype=torch.float64)
    xs = (torch.randn(2, 3, 5), torch.randn(2, 3, 5), torch.randn(2, 2, 5, 3))  # vmapped: 2
    actual = torch.func.vmap(lambda h, x: torchscan.scan(step, h, x, axis=1))(init, xs)
    expected = torch.func.vmap(loop)(init, xs)
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)
