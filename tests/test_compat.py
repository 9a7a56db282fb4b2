"""The private torch API torchscan uses: every symbol in ``torchscan._compat.PRIVATE_API`` exists
in the installed torch with what torchscan expects of it, and no other module reaches into torch's
private modules. A torch release that changes one of them fails here, by name."""

from __future__ import annotations

import ast
import importlib
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
        _compat.ONNX_OPSET_WARNING[0],
        _compat.ONNX_SIGNATURE_WARNING[0],
    ):
        assert name in listed
        importlib.import_module(name)
    assert {m.__name__ for m in (_compat.onnx_core(), _compat.onnx_registration())} <= listed
    assert _compat.onnx_program().__name__ in listed


def test_vmap_s_refusal_of_control_flow_starts_with_the_text_torchscan_reads() -> None:
    """torchscan tells a loop that stops with until under vmap by the start of this message,
    which torch raises from C++."""
    with pytest.raises(RuntimeError) as info:
        torch.func.vmap(lambda x: torch.zeros(()) if bool(x.sum() > 0) else x)(torch.ones(2, 3))
    assert str(info.value).startswith(_compat.VMAP_CONTROL_FLOW_ERROR)
