"""The five points every zoo case is held to, as test functions.

A test file of the zoo imports these functions and names its cases in ``NAMES``; ``conftest.py``
parametrizes them over those cases (and the opsets). Every model is exported once per opset and
worker process (``exported``).

1. eager = oracle: the port against its oracle (an installed library where one computes the same
   thing, else a plain Python loop of the original code), forward at several lengths, gradients
   with respect to the float inputs and every parameter;
2. export: ``torch.onnx.export(dynamo=True)`` with a dynamic sequence length at each opset of
   ``OPSETS``: the asked opset, one ``Scan``/``Loop`` per ``scan``/``loop`` call, and the same
   graph at two example lengths (nothing unrolled);
3. onnxruntime against eager at lengths 1, 2 and a longer one (length 1 makes every scan over
   ``xs[1:]`` empty);
4. ``torchscan.onnx.to_torch`` of the model against eager at lengths 1, 2 and a longer one, and
   its gradients to the float inputs against eager's;
5. ``torchscan check`` on the model, with the inputs it was exported with, exits 0.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.utils._pytree as pytree

from torchscan import TorchscanWarning
from torchscan._cli import main as torchscan_main
from torchscan.onnx import to_torch

from .._export import onnx_export
from ..onnx._runtimes import nodes, run_onnxruntime_on
from ._cases import CASES, ZooCase

OPSETS = (9, 11, 13, 17, 18, 21, 25)
CALL_BODIES = ("torchscan_scan_body", "torchscan_loop_body")
GRAD_ATOL, GRAD_RTOL = 1e-4, 1e-3

_exports: dict[tuple[str, int, int], onnx.ModelProto | Exception] = {}
_warned: dict[tuple[str, int, int], list[str]] = {}
_modules: dict[str, torch.nn.Module] = {}


def module_of(name: str) -> torch.nn.Module:
    if name not in _modules:
        _modules[name] = CASES[name].make().eval()
    return _modules[name]


def exported(name: str, opset: int, length: int | None = None) -> onnx.ModelProto:
    """Case ``name`` exported at ``opset`` with inputs of ``length`` (its export length by
    default), once per process; an export that failed fails every test that needs it."""
    case = CASES[name]
    length = case.export_length if length is None else length
    key = (name, opset, length)
    if key not in _exports:
        # torchscan's warnings are kept for the tests that look at them (see ``warned``).
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TorchscanWarning)
            try:
                program = onnx_export(
                    module_of(name),
                    case.inputs(length),
                    dynamo=True,
                    opset_version=opset,
                    dynamic_shapes=case.dynamic_shapes(),
                )
                _exports[key] = program.model_proto
            except Exception as error:  # re-raised by every test that needs this export
                _exports[key] = error
        _warned[key] = [str(w.message) for w in caught if w.category is TorchscanWarning]
        for other in caught:
            if other.category is not TorchscanWarning:
                warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    result = _exports[key]
    if isinstance(result, Exception):
        raise result
    return result


def warned(name: str, opset: int) -> list[str]:
    """torchscan's warnings from the export of case ``name`` at ``opset``."""
    exported(name, opset)
    return _warned[name, opset, CASES[name].export_length]


def tensors(tree: object) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def assert_close(actual, expected, case: ZooCase, what: str, atol=None, rtol=None) -> None:
    atol = case.atol if atol is None else atol
    rtol = case.rtol if rtol is None else rtol
    assert len(actual) == len(expected), f"{what}: {len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        a = torch.as_tensor(np.asarray(a)) if not isinstance(a, torch.Tensor) else a.detach()
        e = e.detach()
        assert tuple(a.shape) == tuple(e.shape), f"{what}, output {i}: shape"
        assert a.dtype == e.dtype, f"{what}, output {i}: dtype {a.dtype}, expected {e.dtype}"
        if a.is_floating_point():
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True, msg=what)
        else:
            assert torch.equal(a, e), f"{what}, output {i}: {a} != {e}"


def run(case: ZooCase, module: torch.nn.Module, inputs: tuple, oracle: bool = False):
    torch.manual_seed(0)  # the cases that draw random numbers draw the same in port and oracle
    return case.oracle(module, inputs) if oracle else module(*inputs)


def graph_inputs(module: torch.nn.Module, model: onnx.ModelProto, inputs: tuple) -> list:
    """The model's inputs in its order: ``forward``'s arguments matched by name, else by
    position (torch.onnx lower-cases some names: ``X`` becomes ``x``)."""
    by_name = dict(zip(inspect.signature(module.forward).parameters, inputs, strict=False))
    return [
        by_name[info.name] if info.name in by_name else inputs[i]
        for i, info in enumerate(model.graph.input)
    ]


def feeds(module: torch.nn.Module, model: onnx.ModelProto, inputs: tuple) -> dict:
    """The model's inputs by name, as numpy arrays (:func:`graph_inputs`)."""
    values = graph_inputs(module, model, inputs)
    return {
        info.name: value.detach().numpy()
        for info, value in zip(model.graph.input, values, strict=True)
    }


# -- 1. eager = oracle -------------------------------------------------------------------------


def test_eager_forward_matches_oracle(zoo_case: str) -> None:
    case, module = CASES[zoo_case], module_of(zoo_case)
    for length in sorted({*case.run_lengths, case.export_length}):
        inputs = case.inputs(length)
        with torch.no_grad():
            port = tensors(run(case, module, inputs))
            oracle = tensors(run(case, module, inputs, oracle=True))
        assert_close(port, oracle, case, f"{zoo_case} at length {length}")


def _gradients(case: ZooCase, module: torch.nn.Module, inputs: list, oracle: bool) -> dict:
    module.zero_grad(set_to_none=True)
    args = [x.detach().clone().requires_grad_(i in case.grad_inputs) for i, x in enumerate(inputs)]
    outputs = [o for o in tensors(run(case, module, args, oracle)) if o.requires_grad]
    weights = torch.Generator().manual_seed(42)
    loss = sum(
        (torch.where(o.isfinite(), o, 0.0) * torch.randn(o.shape, generator=weights)).sum()
        for o in outputs
    )
    loss.backward()
    grads = {f"input {i}": args[i].grad for i in case.grad_inputs}
    grads.update({name: p.grad for name, p in module.named_parameters()})
    return grads


def test_eager_gradients_match_oracle(zoo_case: str) -> None:
    case, module = CASES[zoo_case], module_of(zoo_case)
    inputs = list(case.inputs(case.export_length))
    port = _gradients(case, module, inputs, oracle=False)
    oracle = _gradients(case, module, inputs, oracle=True)
    assert port.keys() == oracle.keys()
    assert any(g is not None for g in port.values())
    for name, grad in port.items():
        assert (grad is None) == (oracle[name] is None), f"gradient of {name}"
        if grad is not None:
            assert_close([grad], [oracle[name]], case, f"gradient of {name}", GRAD_ATOL, GRAD_RTOL)


# -- 2. export ---------------------------------------------------------------------------------


def test_export_has_one_loop_node_per_call(zoo_case: str, opset: int) -> None:
    model = exported(zoo_case, opset)
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == opset
    calls = {"Scan": 0, "Loop": 0}
    for node, _ in nodes(model.graph):
        if node.op_type in calls:
            body = next(a.g for a in node.attribute if a.name == "body")
            calls[node.op_type] += body.name.startswith(CALL_BODIES)
    assert calls == {"Scan": 0, "Loop": 0, **CASES[zoo_case].loops}
    if not CASES[zoo_case].random:
        assert warned(zoo_case, opset) == []


def test_export_is_not_unrolled(zoo_case: str) -> None:
    """Exported from examples of two lengths, the graph is the same size: one loop body, not one
    copy of it per step."""
    case = CASES[zoo_case]
    sizes = [
        sum(1 for _ in nodes(exported(zoo_case, 18, length).graph))
        for length in (case.export_length, case.export_length + 3)
    ]
    assert sizes[0] == sizes[1]


# -- 3. onnxruntime ----------------------------------------------------------------------------


def test_onnxruntime_matches_eager(zoo_case: str, opset: int) -> None:
    case, module = CASES[zoo_case], module_of(zoo_case)
    model = exported(zoo_case, opset)
    for length in (1, 2, case.run_lengths[-1]):
        inputs = case.inputs(length)
        with torch.no_grad():
            expected = tensors(run(case, module, inputs))
        runs = run_onnxruntime_on(model, feeds(module, model, inputs))
        for level, actual in runs.items():
            what = f"{zoo_case} at opset {opset}, length {length}, onnxruntime {level}"
            if case.random:  # another generator: the same shapes and types, finite values
                assert [a.shape for a in actual] == [tuple(e.shape) for e in expected], what
                assert all(np.isfinite(a).all() for a in actual), what
            else:
                assert_close(actual, expected, case, what)


# -- 4. imported back into PyTorch -----------------------------------------------------------


def test_imported_module_matches_eager(zoo_case: str, opset: int) -> None:
    """``torchscan.onnx.to_torch`` of the export computes the eager outputs at lengths 1, 2 and a
    longer one, and the eager gradients to the float inputs at the export length."""
    case, module = CASES[zoo_case], module_of(zoo_case)
    model = exported(zoo_case, opset)
    imported = to_torch(model)
    single = len(model.graph.output) == 1
    for length in (1, 2, case.run_lengths[-1]):
        inputs = case.inputs(length)
        with torch.no_grad():
            expected = tensors(run(case, module, inputs))
            actual = imported(*graph_inputs(module, model, inputs))
        actual = [actual] if single else list(actual)
        what = f"{zoo_case} at opset {opset}, length {length}, imported"
        if case.random:  # another generator: the same shapes and types
            assert [a.shape for a in actual] == [e.shape for e in expected], what
        else:
            assert_close(actual, expected, case, what)
    if case.random or case.stops_gradients or not case.grad_inputs:
        return
    inputs = case.inputs(case.export_length)
    grads = []
    for through_import in (False, True):
        args = tuple(
            x.detach().clone().requires_grad_(i in case.grad_inputs) for i, x in enumerate(inputs)
        )
        if through_import:
            outputs = imported(*graph_inputs(module, model, args))
            outputs = [outputs] if single else list(outputs)
        else:
            outputs = tensors(run(case, module, args))
        weights = torch.Generator().manual_seed(42)
        loss = sum(
            (torch.where(o.isfinite(), o, 0.0) * torch.randn(o.shape, generator=weights)).sum()
            for o in outputs
            if o.requires_grad
        )
        loss.backward()
        grads.append([args[i].grad for i in case.grad_inputs])
    for index, want, got in zip(case.grad_inputs, grads[0], grads[1], strict=True):
        what = f"{zoo_case} at opset {opset}, imported: gradient of input {index}"
        assert (got is None) == (want is None), f"{what}: {got} where eager has {want}"
        if want is not None:
            assert_close([got], [want], case, what, GRAD_ATOL, GRAD_RTOL)


# -- 5. torchscan check ------------------------------------------------------------------------


def test_torchscan_check_passes(zoo_case: str, opset: int, tmp_path: Path) -> None:
    case, module = CASES[zoo_case], module_of(zoo_case)
    model = exported(zoo_case, opset)
    path, inputs = tmp_path / "model.onnx", tmp_path / "inputs.npz"
    onnx.save(model, path)
    np.savez(inputs, **feeds(module, model, case.inputs(case.export_length)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = torchscan_main(["check", str(path), "--inputs", str(inputs)])
    assert status == 0, out.getvalue()
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("OK:"), last
    assert "imported" in last.split(";")[1], last
    if not _onnxruntime_lacks_a_kernel(model):
        return
    # onnxruntime does not run it: the reference evaluator and the imported module are compared.
    # Without the imported module, one source: not compared, unless one source is accepted.
    only = ["check", str(path), "--inputs", str(inputs), "--runtimes", "onnxruntime,reference"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = torchscan_main(only)
    assert status == 3, out.getvalue()
    assert "NOT COMPARED" in out.getvalue().splitlines()[-1]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = torchscan_main([*only, "--allow-single-source"])
    assert status == 0, out.getvalue()


def _onnxruntime_lacks_a_kernel(model: onnx.ModelProto) -> bool:
    """Whether the model holds an operator version onnxruntime has no kernel for."""
    from torchscan.onnx._export._passes import ONNXRUNTIME_MISSING_KERNELS

    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return any(
        opset >= ONNXRUNTIME_MISSING_KERNELS.get(node.op_type, opset + 1)
        for node, _ in nodes(model.graph)
    )


__all__ = [
    "test_eager_forward_matches_oracle",
    "test_eager_gradients_match_oracle",
    "test_export_has_one_loop_node_per_call",
    "test_export_is_not_unrolled",
    "test_imported_module_matches_eager",
    "test_onnxruntime_matches_eager",
    "test_torchscan_check_passes",
]
