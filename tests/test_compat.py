"""The private torch API torchscan uses: every symbol in ``torchscan._compat.PRIVATE_API`` exists
in the installed torch with what torchscan expects of it, and no other module reaches into torch's
private modules. A torch release that changes one of them fails here, by name."""

from __future__ import annotations

import ast
import importlib
import inspect
import traceback
from pathlib import Path

import pytest
import torch

import torchscan
from torchscan import _compat

PACKAGE = Path(torchscan.__file__).parent


@pytest.mark.parametrize("symbol", _compat.PRIVATE_API, ids=lambda s: s.qualified_name)
def test_private_symbol_holds(symbol: _compat.PrivateSymbol) -> None:
    problems = symbol.problems()
    assert not problems, (
        f"torch {torch.__version__} changed {symbol.qualified_name}, which torchscan uses to "
        f"{symbol.used_for}: " + "; ".join(problems)
    )


def test_a_missing_symbol_is_named() -> None:
    gone = _compat.PrivateSymbol("torch._higher_order_ops.utils", "no_such_helper", "test")
    assert gone.problems() == [
        "it cannot be found (AttributeError: module 'torch._higher_order_ops.utils' has no "
        "attribute 'no_such_helper')"
    ]


def test_a_changed_signature_is_named() -> None:
    changed = _compat.PrivateSymbol(
        "torch._higher_order_ops.utils", "unique_graph_id", "test", ("proxy_mode", "suffix")
    )
    assert changed.problems() == ["it has no parameter suffix (it takes ['proxy_mode', 'prefix'])"]
    reordered = _compat.PrivateSymbol(
        "torch._higher_order_ops.utils", "unique_graph_id", "test", ("prefix", "proxy_mode")
    )
    assert reordered.problems() == ["its parameters ['prefix', 'proxy_mode'] come in another order"]


def test_missing_fields_attributes_and_text_are_named() -> None:
    registration = "torch.onnx._internal.exporter._registration"
    symbol = _compat.PrivateSymbol(registration, "OnnxDecompMeta", "test", fields=("no_field",))
    (problem,) = symbol.problems()
    assert problem.startswith("it has no field no_field (it has ['onnx_function', ")
    tracer = _compat.PrivateSymbol(
        "torch.fx.experimental.proxy_tensor",
        "PythonKeyTracer",
        "test",
        instance_attributes=("no_attribute",),
    )
    assert tracer.problems() == ["its instances have no attribute 'no_attribute'"]
    text = _compat.PrivateSymbol("torch._guards", "detect_fake_mode", "t", source_text="no text!")
    assert text.problems() == ["its module no longer says 'no text!'"]


def _private_torch_imports(path: Path) -> list[str]:
    """The private torch modules ``path`` imports: a module under ``torch`` with a component
    that starts with ``_`` (``torch._ops``, ``torch.utils._pytree``, ``torch.onnx._internal``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [
            n
            for n in names
            if n.startswith("torch.") and any(p.startswith("_") for p in n.split("."))
        ]
    return found


def test_only_compat_imports_private_torch() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): imports
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_compat.py" and (imports := _private_torch_imports(path))
    }
    assert offenders == {}, f"import these through torchscan._compat instead: {offenders}"


def test_private_module_strings_are_listed() -> None:
    """A private module named in a string (imported with importlib, a logger name) is one of the
    modules that PRIVATE_API lists."""
    listed = {symbol.module for symbol in _compat.PRIVATE_API}
    for name in (
        _compat.ONNX_EXPORTER_MODULE,
        _compat.ONNX_SIGNATURE_WARNING[0],
    ):
        assert name in listed
        importlib.import_module(name)
    assert {m.__name__ for m in (_compat.onnx_core(), _compat.onnx_registration())} <= listed
    assert _compat.onnx_program().__name__ in listed


# -- text that torch writes and torchscan reads (_compat.TEXT_DEPENDENCIES) --------------------


def _vmap_control_flow() -> None:
    """torchscan tells a loop that stops with until under vmap by the start of this message,
    which torch raises from C++."""
    with pytest.raises(RuntimeError) as info:
        torch.func.vmap(lambda x: torch.zeros(()) if bool(x.sum() > 0) else x)(torch.ones(2, 3))
    assert str(info.value).startswith(_compat.VMAP_CONTROL_FLOW_ERROR)


def test_the_distribution_check_operator_is_torchs() -> None:
    # the name torch's operator has in the nodes of an exported program
    assert str(torch.ops.aten._is_all_true.default) == _compat.DISTRIBUTION_CHECK_OPERATOR


class _Reads(torch.nn.Module):
    def forward(self, x):
        y = x * 2  # <made>
        if y.sum() > 0:  # <reads>
            return y + 1
        return y


def _line(tag: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(f"# {tag}"))


def _stack_trace_frames() -> None:
    from torchscan._traced._step_errors import _node_frames

    class Made(torch.nn.Module):
        def forward(self, x):
            return x * 2  # <made-here>

    program = torch.export.export(Made(), (torch.ones(3),))
    mul = next(n for n in program.graph.nodes if n.op == "call_function")
    assert (__file__, _line("<made-here>"), "forward") in _node_frames(mul)


def _data_dependent_frames() -> None:
    with pytest.raises(_compat.guard_on_data_dependent_error()) as info:
        torch.export.export(_Reads(), (torch.ones(3),), strict=False)
    frames = [(s.filename, s.lineno) for s in traceback.extract_tb(info.value.__traceback__)]
    outside_torch = [f for f in frames if not f[0].startswith(str(Path(torch.__file__).parent))]
    assert outside_torch[-1] == (__file__, _line("<reads>"))


def _uncaptured_hop_name() -> None:
    def prints(x):
        print("a side effect TorchDynamo cannot trace in a branch")
        return x.sin()

    with pytest.raises(_compat.uncaptured_operator_error()) as info:
        torch.cond(torch.tensor(True), prints, lambda x: x.cos(), (torch.ones(2),))
    assert "Higher Order Operator: torch.cond" in str(info.value)


def _linalg_check_api() -> None:
    class Inverts(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.inv(x)

    program = torch.export.export(Inverts(), (torch.eye(2),)).run_decompositions()
    effects = [
        n.args
        for n in program.graph.nodes
        if n.op == "call_function" and n.target is torch.ops.higher_order.with_effects
    ]
    assert [(a[1], str(a[3]).removeprefix("torch.")) for a in effects] == [
        (torch.ops.aten._linalg_check_errors.default, "linalg.inv")
    ]


def _onnx_converter_assertion() -> None:
    import onnx
    import onnx.version_converter
    from onnx import TensorProto
    from onnx import helper as oh

    argmax = oh.make_node("ArgMax", ["x"], ["y"], axis=0, select_last_index=1)
    graph = oh.make_graph(
        [argmax],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [oh.make_tensor_value_info("y", TensorProto.INT64, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 12)])
    with pytest.raises(RuntimeError) as info:
        onnx.version_converter.convert_version(model, 11)
    first = str(info.value).split("\n")[0]
    assert first.split(_compat.ONNX_CONVERTER_ASSERTION)[-1] == (
        "Attribute select_last_index must have value 0"
    )


def _in_source(dependency: _compat.TextDependency) -> None:
    """A log message: the module that logs it still says it."""
    assert dependency.text in inspect.getsource(importlib.import_module(dependency.source))


TEXT_PROBES = {
    "stack-trace-frames": _stack_trace_frames,
    "data-dependent-frames": _data_dependent_frames,
    "uncaptured-hop-name": _uncaptured_hop_name,
    "linalg-check-api": _linalg_check_api,
    "vmap-control-flow": _vmap_control_flow,
    "onnx-converter-assertion": _onnx_converter_assertion,
    "onnx-signature-warning": _in_source,
    "unfound-user-code-warning": _in_source,
}


def test_every_text_dependency_has_a_probe() -> None:
    assert sorted(TEXT_PROBES) == sorted(d.key for d in _compat.TEXT_DEPENDENCIES)


@pytest.mark.parametrize("dependency", _compat.TEXT_DEPENDENCIES, ids=lambda d: d.key)
def test_text_dependency_holds(dependency: _compat.TextDependency) -> None:
    """torch still writes what torchscan reads; where it does not, this names the entry."""
    probe = TEXT_PROBES[dependency.key]
    try:
        probe(dependency) if probe is _in_source else probe()  # type: ignore[call-arg]
    except AssertionError as error:
        raise AssertionError(
            f"torch {torch.__version__} changed {dependency.source} ({dependency.text}), which "
            f"{dependency.reader} reads to {dependency.used_for}"
        ) from error


@pytest.mark.parametrize("symbol", _compat.ONNX_REFERENCE_API, ids=lambda s: s.qualified_name)
def test_onnx_reference_internal_holds(symbol: _compat.PrivateSymbol) -> None:
    import onnx

    problems = symbol.problems()
    assert not problems, (
        f"onnx {onnx.__version__} changed {symbol.qualified_name}, which the check's reference "
        f"evaluator uses to {symbol.used_for}: " + "; ".join(problems)
    )


def test_the_mark_of_untraced_functions_is_torch_dynamos() -> None:
    """``run_untraced_by_dynamo`` sets what ``torch._dynamo.assume_constant_result`` sets, and
    nothing else (it does so without importing TorchDynamo)."""

    def ours() -> int:
        return 0

    def dynamos() -> int:
        return 0

    import torch._dynamo

    torch._dynamo.assume_constant_result(dynamos)
    assert _compat.run_untraced_by_dynamo(ours) is ours
    assert vars(ours) == vars(dynamos) == {_compat.DYNAMO_CONSTANT_MARK: True}


def test_torch_s_scan_still_needs_a_dense_gradient_of_its_final_carry() -> None:
    """torch's own ``scan`` under Inductor, with ``h.sum()`` computed in the compiled function:
    the weight's gradient is wrong, and right with ``_compat.dense_gradient`` on the final carry.
    When a torch release fixes it, this fails: the workaround can then go for that release."""
    import torch._dynamo

    torch.manual_seed(0)
    W = torch.randn(4, 4, requires_grad=True)
    h0, xs = torch.randn(3, 4), torch.randn(6, 3, 4)

    def step(h, x):
        h = torch.tanh(h @ W + x)
        return h.clone(), h.clone()

    h = h0
    for x in xs:
        h, _ = step(h, x)
    expected = torch.autograd.grad(h.sum(), W)[0]

    def gradient(final) -> torch.Tensor:
        torch._dynamo.reset()
        run = torch.compile(lambda h, xs: final(_compat.scan_operator()(step, h, xs)[0]).sum())
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            return torch.autograd.grad(run(h0, xs), W)[0]

    torch.testing.assert_close(gradient(_compat.dense_gradient), expected)
    assert (gradient(lambda h: h) - expected).abs().max() > 1.0, "torch's scan now gets it right"
