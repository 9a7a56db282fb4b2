"""How torchscan plugs into torch.onnx: the hooks on torch's private API, held by tests."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

import torchscan
from torchscan import _traced
from torchscan.onnx import _hooks, _translate

from .._export import onnx_export
from ._runtimes import nodes


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_import_wraps_torch_onnx_export_without_importing_onnx() -> None:
    out = run_python(
        """
        import sys
        import torch, torchscan
        print(torch.onnx.export.__torchscan_wrapped__, torch.onnx.export.__name__)
        print(sorted(m for m in ("onnx", "onnxruntime", "onnxscript") if m in sys.modules))
        """
    )
    assert out.split("\n")[:2] == ["True export", "[]"]


def test_export_installs_the_translation_and_the_converter(exported) -> None:
    exported("elman", 18)
    from torch.onnx._internal.exporter import _core, _registration

    registry = _registration.ONNXRegistry.from_torchlib()
    (meta,) = registry.get_decomps(_traced.torchscan_scan)
    assert meta.onnx_function is _translate.scan_to_onnx
    assert registry.get_decomps(torch.ops.aten.add.Tensor)  # torch's own still answer
    assert isinstance(_core.onnxscript_apis, _hooks._ConvertingAPIs)
    lookup = _registration.ONNXRegistry.get_decomps
    _hooks.install()  # a second install changes nothing
    assert _registration.ONNXRegistry.get_decomps is lookup


def test_export_kept_from_before_the_import_still_gets_a_scan() -> None:
    out = run_python(
        """
        import logging
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        import torch
        from torch.onnx import export  # the original function, kept before torchscan exists
        import torchscan

        class M(torch.nn.Module):
            def forward(self, xs, h):
                return torchscan.scan(lambda c, x: (c + x, c), h, xs)

        model = export(M(), (torch.ones(3, 2), torch.zeros(2)), dynamo=True, verbose=False)
        print([n.op_type for n in model.model_proto.graph.node])
        """
    )
    assert out.strip() == "['Scan']"


def test_export_kept_from_before_the_import_converts_a_model_without_a_scan() -> None:
    """torch.onnx alone returns opset 18 for opset 13 here; with torchscan imported, the asked
    opset, also through a reference kept from before the import and before any scan."""
    out = run_python(
        """
        import logging
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        import torch
        from torch.onnx import export
        import torchscan

        class M(torch.nn.Module):
            def forward(self, x, y):
                return torch.tanh(x * y + 1)

        model = export(
            M(), (torch.ones(3), torch.ones(3)), dynamo=True, opset_version=13, verbose=False
        )
        print([o.version for o in model.model_proto.opset_import if o.domain == ""])
        """
    )
    assert out.strip() == "[13]"


def test_the_first_export_installs_the_hooks_once() -> None:
    """The wrapper installs the hooks, whose first step imports torch.onnx's exporter, which runs
    torchscan's import hook, which installs them too: once only, not wrapped in themselves."""
    out = run_python(
        """
        import logging
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        import torch, torchscan

        class M(torch.nn.Module):
            def forward(self, xs, h):
                return torchscan.scan(lambda c, x: (c + x, c), h, xs)

        torch.onnx.export(M(), (torch.ones(3, 2), torch.zeros(2)), dynamo=True, verbose=False)
        import torch.onnx._internal.exporter._core as core
        from torch.onnx._internal.exporter import _registration
        print(type(core.onnxscript_apis._apis).__name__)
        print(hasattr(_registration.ONNXRegistry.get_decomps.__wrapped__, "__wrapped__"))
        """
    )
    assert out.split("\n")[:2] == ["_LazyModule", "False"]


def test_the_hooks_are_installed_at_import_when_torch_onnx_exporter_is_loaded() -> None:
    out = run_python(
        """
        import torch.onnx._internal.exporter._core as core
        import torchscan
        print(type(core.onnxscript_apis).__name__)
        """
    )
    assert out.strip() == "_ConvertingAPIs"


def test_wrapper_keeps_the_signature_of_torch_onnx_export() -> None:
    import inspect

    assert "dynamo" in inspect.signature(torch.onnx.export).parameters
    assert torch.onnx.export.__doc__.startswith("Exports a model into ONNX format.")


class Doubles(torch.nn.Module):
    def forward(self, xs, h):
        return torchscan.scan(lambda c, x: (c + torch.sin(x), c), h, xs)


ARGS = (torch.ones(3, 2), torch.zeros(2))


def test_the_wrapper_passes_the_translations_in_custom_translation_table(monkeypatch) -> None:
    """With the private lookup undone, an export through the wrapper still finds them."""
    from torch.onnx._internal.exporter import _registration

    _hooks.install()
    lookup = _registration.ONNXRegistry.get_decomps
    monkeypatch.setattr(_registration.ONNXRegistry, "get_decomps", lookup.__wrapped__)
    model = onnx_export(Doubles(), ARGS, opset_version=18).model_proto
    assert [n.op_type for n in model.graph.node] == ["Sin", "Scan"]  # sin(x) hoisted


def test_the_users_translation_table_is_kept() -> None:
    from onnxscript import opset18 as op

    def cos(x):
        return op.Cos(x)

    table = {torch.ops.aten.sin.default: cos}
    model = onnx_export(Doubles(), ARGS, opset_version=18, custom_translation_table=table)
    op_types = {node.op_type for node, _ in nodes(model.model_proto.graph)}
    assert "Cos" in op_types
    assert "Sin" not in op_types
    assert table == {torch.ops.aten.sin.default: cos}  # the user's dict is not changed


def test_torch_onnx_logs_nothing_about_the_translations(caplog) -> None:
    """torch.onnx warns that a custom translation without an ONNX signature gets every node of
    its operator; for torchscan's that is the point, and the warning is dropped."""
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torch.onnx").setLevel(logging.WARNING)
        torch.onnx.export(Doubles().eval(), ARGS, opset_version=18, verbose=False)
    assert not [r for r in caplog.records if "signature" in r.getMessage()]


# --- operators onnxruntime has no kernel for ----------------------------------------------------


def _one_random_node(op: str, opset: int, name: str = "draw") -> onnx.ModelProto:
    """A model of one ``op`` node (float32 in, float32 or int32 out) at ``opset``."""
    takes_input = op not in ("RandomNormal", "RandomUniform")
    attributes = {"shape": [1, 2]} if not takes_input else {}
    if op == "Multinomial":
        attributes = {"sample_size": 2}
    node = oh.make_node(op, ["x"] if takes_input else [], ["y"], name=name, **attributes)
    out = TensorProto.INT32 if op == "Multinomial" else TensorProto.FLOAT
    graph = oh.make_graph(
        [node],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])] if takes_input else [],
        [oh.make_tensor_value_info("y", out, None)],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


@pytest.mark.parametrize("op", sorted(_hooks.ONNXRUNTIME_MISSING_KERNELS))
def test_onnxruntime_has_no_kernel_from_the_version_in_the_table_on(op: str) -> None:
    import onnxruntime as ort

    since = _hooks.ONNXRUNTIME_MISSING_KERNELS[op]
    assert ort.__version__.startswith(_hooks.ONNXRUNTIME_CHECKED + ".")
    feeds = {} if op in ("RandomNormal", "RandomUniform") else {"x": np.full((1, 2), 0.5, "f")}

    def run(opset: int) -> list:
        data = _one_random_node(op, opset).SerializeToString()
        return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)

    assert run(since - 1)[0].shape == (1, 2)
    with pytest.raises(Exception, match=r"^\[ONNXRuntimeError\] : 9 : NOT_IMPLEMENTED : ") as e:
        run(since)
    assert type(e.value).__name__ == "NotImplemented"


@pytest.mark.parametrize("op", sorted(_hooks.ONNXRUNTIME_MISSING_KERNELS))
def test_a_model_with_an_operator_onnxruntime_lacks_warns(op: str) -> None:
    _hooks.warn_onnxruntime_gaps(ir.from_proto(_one_random_node(op, 21)))  # no warning
    model = ir.from_proto(_one_random_node(op, 25))
    with pytest.warns(torchscan.TorchscanWarning) as warned:
        _hooks.warn_onnxruntime_gaps(model)
    assert [str(w.message) for w in warned] == [
        f"torchscan: the model holds {op}-22 (node 'draw') at opset 25, and onnxruntime 1.32 has "
        f"no kernel for it: it refuses to run the model (NOT_IMPLEMENTED). To run it in "
        f"onnxruntime 1.32, export with opset_version=21 or lower."
    ]


def test_one_warning_names_every_operator_and_node_at_any_depth() -> None:
    body = oh.make_graph(
        [
            oh.make_node("RandomNormalLike", ["h"], ["n"], name="a"),
            oh.make_node("RandomNormalLike", ["h"], ["m"]),
            oh.make_node("Bernoulli", ["h"], ["b"], name="coin"),
            oh.make_node("Sum", ["h", "n", "m", "b"], ["h2"]),
        ],
        "body",
        [oh.make_tensor_value_info("h", TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("h2", TensorProto.FLOAT, [2])],
    )
    graph = oh.make_graph(
        [oh.make_node("Scan", ["h0"], ["hT"], body=body, num_scan_inputs=0, name="scan")],
        "main",
        [oh.make_tensor_value_info("h0", TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("hT", TensorProto.FLOAT, [2])],
    )
    model = ir.from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 22)]))
    with pytest.warns(torchscan.TorchscanWarning) as warned:
        _hooks.warn_onnxruntime_gaps(model)
    assert [str(w.message) for w in warned] == [
        "torchscan: the model holds RandomNormalLike-22 (nodes 'a', without a name) and "
        "Bernoulli-22 (node 'coin') at opset 22, and onnxruntime 1.32 has no kernel for them: it "
        "refuses to run the model (NOT_IMPLEMENTED). To run it in onnxruntime 1.32, export with "
        "opset_version=21 or lower."
    ]


class Noisy(torch.nn.Module):
    def forward(self, xs, h):
        return torchscan.scan(lambda c, x: (c + x * torch.randn_like(c), c), h, xs)


def test_an_export_that_onnxruntime_cannot_run_warns_where_the_export_was_called() -> None:
    onnx_export(Noisy(), ARGS, opset_version=21)  # no warning: filterwarnings is "error"
    with pytest.warns(torchscan.TorchscanWarning) as warned:
        onnx_export(Noisy(), ARGS, opset_version=22)
    ours = [w for w in warned if w.category is torchscan.TorchscanWarning]
    assert [str(w.message) for w in ours] == [
        "torchscan: the model holds RandomNormalLike-22 (node 'node_randn_like') at opset 22, and "
        "onnxruntime 1.32 has no kernel for it: it refuses to run the model (NOT_IMPLEMENTED). To "
        "run it in onnxruntime 1.32, export with opset_version=21 or lower."
    ]
    assert ours[0].filename.endswith("_export.py")  # tests/_export.py calls the export
