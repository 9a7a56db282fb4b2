"""How torchscan plugs into torch.onnx: the hooks on torch's private API, held by tests."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

import torchscan
import torchscan.onnx
from torchscan import _torch_onnx_hook, _traced
from torchscan.onnx._export import _hooks, _passes, _translate

from .._export import onnx_export
from ._runtimes import nodes


def run_python(code: str, **environment: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **environment},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize(
    "imports",
    ["import torch, torchscan", "import torch.onnx, torchscan", "import torchscan, torch.onnx"],
)
def test_import_wraps_torch_onnx_export_without_importing_onnx(imports: str) -> None:
    """torch.onnx imported before torchscan, after it, or first read as ``torch.onnx``: its
    ``export`` is torchscan's wrapper, and onnx is not imported."""
    out = run_python(
        f"""
        import sys
        {imports}
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


KEPT_REFERENCE = """
import logging, sys
logging.getLogger("torch.onnx").setLevel(logging.ERROR)
import torch
from torch.onnx import export
if sys.argv[1:] == ["torchscan"]:
    import torchscan

class M(torch.nn.Module):
    def forward(self, x, y):
        return torch.tanh(x * y + 1)

model = export(M(), (torch.ones(3), torch.ones(3)), dynamo=True, opset_version=13, verbose=False)
print(model.model_proto.SerializeToString().hex())
"""


def test_export_kept_from_before_the_import_leaves_a_model_without_a_scan_as_torch_makes_it():
    """A model without loops, exported through a reference kept from before the import and
    below opset 18, is byte for byte what torch.onnx alone makes of it."""
    run = [sys.executable, "-c", KEPT_REFERENCE]
    alone = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    hooked = subprocess.run([*run, "torchscan"], capture_output=True, text=True, check=True).stdout
    assert alone.strip()
    assert hooked == alone


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


# --- switching the hooks off -------------------------------------------------------------------

TORCH_ONNX_STATE = """
import logging, sys
import torch

def torch_onnx_state():
    \"\"\"What torchscan's hooks replace, and whether each is torch's own.\"\"\"
    from torch.onnx._internal.exporter import _core, _dispatching, _onnx_program, _registration
    get_decomps = _registration.ONNXRegistry.get_decomps
    loggers = [f"torch.onnx._internal.exporter.{name}" for name in ("_compat", "_registration")]
    return {
        "export": torch.onnx.export,
        "meta_path": list(sys.meta_path),
        "get_decomps": get_decomps,
        "dispatch": _dispatching.dispatch,
        "core apis": _core.onnxscript_apis,
        "program apis": _onnx_program.onnxscript_apis,
        "filters": [list(logging.getLogger(name).filters) for name in loggers],
    }

def torchs_own(state):
    functions = [state["export"], state["get_decomps"], state["dispatch"]]
    return (
        [(f.__module__, hasattr(f, "__wrapped__")) for f in functions] == [
            ("torch.onnx", False),
            ("torch.onnx._internal.exporter._registration", False),
            ("torch.onnx._internal.exporter._dispatching", False),
        ]
        and state["core apis"] is state["program apis"]
        and type(state["core apis"]).__name__ == "_LazyModule"
        and state["filters"] == [[], []]
        and not any(type(f).__module__.startswith("torchscan") for f in state["meta_path"])
    )

class M(torch.nn.Module):
    def forward(self, xs, h):
        return torchscan.scan(lambda c, x: (c + x, c), h, xs)

ARGS = (torch.ones(3, 2), torch.zeros(2))
logging.getLogger("torch.onnx").setLevel(logging.ERROR)
"""


def test_with_the_variable_at_0_import_leaves_torch_onnx_alone_exporter_loaded_first() -> None:
    out = run_python(
        TORCH_ONNX_STATE
        + """
import torch.onnx._internal.exporter._core
before = torch_onnx_state()
assert torchs_own(before)
import torchscan, torchscan.onnx
after = torch_onnx_state()
print(all(after[key] is before[key] or after[key] == before[key] for key in before))
print(torch.onnx.export is before["export"], torchscan.onnx.export_hooks_installed())
""",
        TORCHSCAN_PATCH_TORCH_ONNX="0",
    )
    assert out.split("\n")[:2] == ["True", "True False"]


def test_with_the_variable_at_0_import_leaves_torch_onnx_alone_and_export_still_works() -> None:
    """Imported before torch.onnx's exporter: no finder waits for it, and torchscan.onnx.export
    installs the hooks for its call only."""
    out = run_python(
        """
import sys, torch
export, finders = torch.onnx.export, list(sys.meta_path)
import torchscan, torchscan.onnx
print(torch.onnx.export is export, sys.meta_path == finders)
"""
        + TORCH_ONNX_STATE
        + """
print(torchs_own(torch_onnx_state()))
program = torchscan.onnx.export(M().eval(), ARGS, opset_version=13, verbose=False)
print([n.op_type for n in program.model_proto.graph.node], torchs_own(torch_onnx_state()))
""",
        TORCHSCAN_PATCH_TORCH_ONNX="off",
    )
    assert out.split("\n")[:3] == ["True True", "True", "['Scan'] True"]


@pytest.mark.parametrize(
    ("value", "patch"),
    [("", True), ("1", True), ("true", True), (" On ", True), ("0", False), ("False", False)],
)
def test_the_variable_says_whether_import_installs_the_hooks(monkeypatch, value, patch) -> None:
    monkeypatch.setenv(_torch_onnx_hook.ENVIRONMENT_VARIABLE, value)
    assert _torch_onnx_hook.patch_at_import() is patch


def test_a_value_of_the_variable_torchscan_does_not_know_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("TORCHSCAN_PATCH_TORCH_ONNX", "disabled")
    with pytest.raises(
        torchscan.TorchscanValueError, match=r"TORCHSCAN_PATCH_TORCH_ONNX='disabled'"
    ):
        _torch_onnx_hook.patch_at_import()


def _refusal_of(error: BaseException) -> torchscan.ExportError:
    cause = _torch_onnx_hook._torchscan_cause(error)
    assert isinstance(cause, torchscan.ExportError), error
    assert "TORCHSCAN_PATCH_TORCH_ONNX=0" in str(cause)
    assert "torchscan.onnx.export(model, args, ...)" in str(cause)
    assert "torchscan.onnx.install_export_hooks()" in str(cause)
    assert str(cause) in str(error)  # torch.onnx's error shows it
    return cause


@pytest.fixture
def hooks_off():
    """The hooks uninstalled for the test, and installed again after it."""
    torchscan.onnx.uninstall_export_hooks()
    try:
        yield
    finally:
        torchscan.onnx.install_export_hooks()


def _state() -> dict:
    from torch.onnx._internal.exporter import _core, _dispatching, _onnx_program, _registration

    return {
        "export": torch.onnx.export,
        "get_decomps": _registration.ONNXRegistry.get_decomps,
        "dispatch": _dispatching.dispatch,
        "apis": (_core.onnxscript_apis, _onnx_program.onnxscript_apis),
        "filters": [list(logging.getLogger(name).filters) for name, _ in _hooks._log_filters()],
        "finders": [f for f in sys.meta_path if type(f).__module__.startswith("torchscan")],
    }


def test_the_hooks_are_uninstalled_and_installed_again_at_run_time() -> None:
    _hooks.install()
    on = _state()
    assert torchscan.onnx.export_hooks_installed()
    assert on["export"].__torchscan_wrapped__
    torchs = {
        "export": on["export"].__wrapped__,
        "get_decomps": on["get_decomps"].__wrapped__,
        "dispatch": on["dispatch"].__wrapped__,
        "apis": (on["apis"][0]._apis, on["apis"][0]._apis),
        "filters": [[f for f in fs if f.__module__ != _hooks.__name__] for fs in on["filters"]],
        "finders": [],
    }
    torchscan.onnx.uninstall_export_hooks()
    try:
        off = _state()
        assert not torchscan.onnx.export_hooks_installed()
        assert all(off[key] == torchs[key] for key in torchs), (off, torchs)
        assert off["export"] is torchs["export"]
        torchscan.onnx.uninstall_export_hooks()  # again: nothing
        assert _state() == off
    finally:
        torchscan.onnx.install_export_hooks()
    again = _state()
    assert torchscan.onnx.export_hooks_installed()
    assert again["export"].__torchscan_wrapped__
    assert again["export"].__wrapped__ is torchs["export"]
    assert again["get_decomps"].__wrapped__ is torchs["get_decomps"]
    assert again["dispatch"].__wrapped__ is torchs["dispatch"]
    assert again["apis"][0]._apis is torchs["apis"][0]
    assert again["filters"] == on["filters"]
    torchscan.onnx.install_export_hooks()  # again: nothing
    assert _state() == again


@pytest.mark.usefixtures("hooks_off")
def test_without_the_hooks_torch_onnx_export_refuses_a_loop_and_torchscan_onnx_exports_it() -> None:
    with pytest.raises(Exception) as refused:  # noqa: PT011 (torch.onnx's own error class)
        onnx_export(Doubles(), ARGS, opset_version=18)
    assert str(_refusal_of(refused.value)).startswith("torchscan.scan: torch.onnx.export is ")
    program = torchscan.onnx.export(Doubles().eval(), ARGS, opset_version=13, verbose=False)
    assert [n.op_type for n in program.model_proto.graph.node] == ["Sin", "Scan"]
    assert [o.version for o in program.model_proto.opset_import if o.domain == ""] == [13]
    assert not _hooks.installed()  # for that call only


@pytest.mark.usefixtures("hooks_off")
def test_without_the_hooks_an_exported_program_is_refused_too() -> None:
    """torch.onnx decomposes the program, which traces the loop again: the refusal is made
    there, not left to torch.onnx's lookup, which finds no translation."""
    program = torch.export.export(Doubles().eval(), ARGS)
    with pytest.raises(Exception) as refused:  # noqa: PT011 (torch.onnx's own error class)
        onnx_export(program, (), opset_version=18)
    _refusal_of(refused.value)
    exported = torchscan.onnx.export(program, opset_version=18, verbose=False)
    assert "Scan" in [n.op_type for n in exported.model_proto.graph.node]


@pytest.mark.usefixtures("hooks_off")
def test_without_the_hooks_torch_onnx_exports_a_model_without_a_loop_as_torch_does() -> None:
    class Plain(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x) + 1

    program = onnx_export(Plain(), (torch.ones(3),), opset_version=18)
    assert [n.op_type for n in program.model_proto.graph.node] == ["Tanh", "Add"]


def test_with_the_hooks_on_both_exports_make_a_scan() -> None:
    assert torchscan.onnx.export_hooks_installed()
    for export in (torch.onnx.export, torchscan.onnx.export):
        program = export(Doubles().eval(), ARGS, opset_version=18, verbose=False)
        assert [n.op_type for n in program.model_proto.graph.node] == ["Sin", "Scan"]


def test_a_wrapper_wrapped_since_passes_through_once_uninstalled() -> None:
    """Something else wrapped torch.onnx.export after torchscan did: uninstalling leaves that
    wrapper in place, and torchscan's inside it passes every call through."""
    ours = torch.onnx.export
    torchs = ours.__wrapped__

    def theirs(*args, **kwargs):
        return ours(*args, **kwargs)

    torch.onnx.export = theirs
    try:
        torchscan.onnx.uninstall_export_hooks()
        assert torch.onnx.export is theirs
        with pytest.raises(Exception) as refused:  # noqa: PT011 (torch.onnx's own error class)
            onnx_export(Doubles(), ARGS, opset_version=18)
        _refusal_of(refused.value)
    finally:
        torch.onnx.export = torchs
        torchscan.onnx.install_export_hooks()
    assert torch.onnx.export.__wrapped__ is torchs


def test_the_docs_name_everything_the_hooks_change_in_torch() -> None:
    """docs/export.md lists every attribute the hooks replace and every logger they filter: a new
    hook that is not documented fails here. torchscan.onnx's docstring points there."""
    _hooks.install()
    changed = ["torch.onnx.export", "sys.meta_path"]
    for owner, name, *_ in _hooks._installation.replaced:
        prefix = (
            f"{owner.__module__}.{owner.__qualname__}"
            if isinstance(owner, type)
            else owner.__name__
        )
        changed.append(f"{prefix}.{name}")
    changed += [logger for logger, _ in _hooks._log_filters()]
    page = (Path(__file__).parents[2] / "docs" / "export.md").read_text()
    section = page.split("## What importing torchscan changes in torch", 1)[1].split("\n## ")[0]
    docstring = " ".join(torchscan.onnx.__doc__.split())
    for name in changed:
        assert f"`{name}`" in section, name
    assert "`TORCHSCAN_PATCH_TORCH_ONNX=0`" in section
    assert '"What importing torchscan changes in torch"' in docstring


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


@pytest.mark.parametrize("op", sorted(_passes.ONNXRUNTIME_MISSING_KERNELS))
def test_onnxruntime_has_no_kernel_from_the_version_in_the_table_on(op: str) -> None:
    import onnxruntime as ort

    since = _passes.ONNXRUNTIME_MISSING_KERNELS[op]
    assert ort.__version__.startswith(_passes.ONNXRUNTIME_CHECKED + ".")
    feeds = {} if op in ("RandomNormal", "RandomUniform") else {"x": np.full((1, 2), 0.5, "f")}

    def run(opset: int) -> list:
        data = _one_random_node(op, opset).SerializeToString()
        return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)

    assert run(since - 1)[0].shape == (1, 2)
    with pytest.raises(Exception, match=r"^\[ONNXRuntimeError\] : 9 : NOT_IMPLEMENTED : ") as e:
        run(since)
    assert type(e.value).__name__ == "NotImplemented"


@pytest.mark.parametrize("op", sorted(_passes.ONNXRUNTIME_MISSING_KERNELS))
def test_a_model_with_an_operator_onnxruntime_lacks_warns(op: str) -> None:
    _passes.warn_onnxruntime_gaps(ir.from_proto(_one_random_node(op, 21)))  # no warning
    model = ir.from_proto(_one_random_node(op, 25))
    with pytest.warns(torchscan.TorchscanWarning) as warned:
        _passes.warn_onnxruntime_gaps(model)
    assert [str(w.message) for w in warned] == [
        f"torch.onnx.export: the model holds {op}-22 (node 'draw') at opset 25, and onnxruntime "
        f"1.32 has "
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
        _passes.warn_onnxruntime_gaps(model)
    assert [str(w.message) for w in warned] == [
        "torch.onnx.export: the model holds RandomNormalLike-22 (nodes 'a', without a name) and "
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
        "torch.onnx.export: the model holds RandomNormalLike-22 (node 'node_randn_like') at opset "
        "22, and "
        "onnxruntime 1.32 has no kernel for it: it refuses to run the model (NOT_IMPLEMENTED). To "
        "run it in onnxruntime 1.32, export with opset_version=21 or lower."
    ]
    assert ours[0].filename.endswith("_export.py")  # tests/_export.py calls the export
