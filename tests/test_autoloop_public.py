"""torchscan.autoloop on loops as the authors of public code write them
(tests/_autoloop_public.py): converted or kept, each computes what it computed, at lengths 0, 1
and several, at the first call and once hoisted; the report says which loops convert and why the
others stay Python; those that convert export with a dynamic length (one loop operator per time
loop, onnxruntime at both optimization levels equal to eager at another length), or are refused
with torchscan's own error."""

from __future__ import annotations

import copy
import random

import onnx
import pytest
import torch

import torchscan
from torchscan import _hoist

from ._autoloop_public import PUBLIC
from ._export import onnx_export
from .onnx._runtimes import run_onnxruntime

# torch's own warnings while it exports nn.GRU and nn.LSTM modules (a deprecation in its
# internals, how they keep their weights, a strategy it tries and drops)
pytestmark = [
    # (the short loops of these tests scanned, as a trace has them: the path under test)
    pytest.mark.usefixtures("every_loop_scanned"),
    pytest.mark.filterwarnings("ignore:_check_is_size will be removed:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The tensor attributes .* were assigned during export"),
    pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf"),
]

NAMES = list(PUBLIC)
CONVERTING = [n for n in NAMES if PUBLIC[n].converts]
EXPORTING = [n for n in CONVERTING if not PUBLIC[n].export_error]


def pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    original = PUBLIC[name].make()
    return original, torchscan.autoloop(copy.deepcopy(original))


def call(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> object:
    """The module's outputs, or the error it raises; the random draws of torch and Python
    seeded alike for every call."""
    torch.manual_seed(1)
    random.seed(1)
    try:
        return module(*inputs)
    except (RuntimeError, ValueError, IndexError, UnboundLocalError) as error:
        return error


@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("name", NAMES)
def test_the_converted_module_computes_as_the_original(name: str, n: int) -> None:
    program = PUBLIC[name]
    original, converted = pair(name)
    inputs = program.inputs(n)
    theirs = tuple(i.clone() for i in inputs)
    want = call(original, theirs)
    for k in range(_hoist.TRACE_AT_CALL):
        got = call(converted, tuple(i.clone() for i in inputs))
        if isinstance(want, Exception):
            assert type(got) is type(want), got
            assert str(got) == str(want)
            assert program.empty_raises
            assert n == 0
            continue
        exact = {"rtol": 0, "atol": 0} if k == 0 else {}  # hoisted: within rounding
        if any(isinstance(v, str) for v in torch.utils._pytree.tree_leaves(want)):
            assert got == want  # words: Python values
        else:
            torch.testing.assert_close(got, want, **exact)
    if isinstance(want, Exception):
        return  # the loops that did not run say nothing
    report = torchscan.autoloop_report(converted)
    if program.converts:
        assert any(r.converted for r in report) or n == 0, report
    else:
        assert not any(r.converted for r in report), report
        assert any(program.reason in r.reason for r in report), report


_EXPORTS: dict[str, onnx.ModelProto] = {}


def exported(name: str) -> onnx.ModelProto:
    if name not in _EXPORTS:
        program = PUBLIC[name]
        _, converted = pair(name)
        inputs = program.inputs(3)
        dims = [  # every axis that grows with the number of steps, its relations found by torch
            {a: torch.export.Dim.AUTO for a in range(t.dim()) if t.shape[a] != later.shape[a]}
            for t, later in zip(inputs, program.inputs(4), strict=True)
        ]
        _EXPORTS[name] = onnx_export(
            converted.eval(), inputs, dynamo=True, dynamic_shapes=tuple(dims)
        ).model_proto
    return _EXPORTS[name]


@pytest.mark.parametrize("name", EXPORTING)
def test_a_converted_model_exports_with_a_dynamic_length(name: str) -> None:
    program = PUBLIC[name]
    model = exported(name)
    loops = [n.op_type for n in model.graph.node if n.op_type in ("Scan", "Loop")]
    assert len(loops) == program.loops, loops
    original, _ = pair(name)
    inputs = program.inputs(7)
    runs = run_onnxruntime(model, inputs)
    want = torch.utils._pytree.tree_leaves(call(original, inputs))
    assert len(runs) == 2
    for got in runs.values():
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(torch.as_tensor(g), torch.as_tensor(w).detach())


# what torch.onnx cannot export in any model, with a loop or without
TORCH_ONNX_LIMITS = {"soft-dtw-rows": "aten._cdist_forward"}


@pytest.mark.parametrize("name", [n for n in CONVERTING if n not in EXPORTING])
def test_a_converted_model_that_cannot_export_is_refused_by_torchscan(name: str) -> None:
    with pytest.raises(Exception) as info:  # noqa: PT011 (the type checked below)
        exported(name)
    assert PUBLIC[name].export_error in str(info.value)
    if name not in TORCH_ONNX_LIMITS:
        assert isinstance(info.value, (torchscan.ExportError, TypeError))
        assert str(info.value).startswith("torchscan.")
