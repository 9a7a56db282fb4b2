"""Selective state-space and diagonal linear recurrences: mamba's ``selective_scan_ref`` (einsum
discretisation, a loop over the steps) and the LRU's complex diagonal recurrence, written with
its real and imaginary parts; the oracle is the Python loop (complex, for the LRU)."""

import pytest
import torch

from ._cases import CASES
from ._harness import *  # noqa: F403
from ._harness import assert_close, exported, module_of, run, tensors

NAMES = ["mamba-selective-scan", "lru-real"]


# The LRU as its PyTorch ports write it, with complex tensors: eager PyTorch runs it, but
# torch.onnx translates few operators of complex tensors (torch.exp of the complex Lambda, outside
# the loop, is refused by torch.onnx itself); lru-real above is the form that exports.


def test_complex_lru_runs_eagerly() -> None:
    case, module = CASES["lru-complex"], module_of("lru-complex")
    for length in case.run_lengths:
        inputs = case.inputs(length)
        with torch.no_grad():
            port, oracle = run(case, module, inputs), run(case, module, inputs, oracle=True)
        assert_close(tensors(port), tensors(oracle), case, f"lru-complex at length {length}")


def test_complex_lru_export_is_refused_by_torch_onnx_for_the_complex_exp() -> None:
    with pytest.raises(
        torch.onnx.OnnxExporterError, match=r"No ONNX function found for <OpOverload\(op='aten.exp'"
    ):
        exported("lru-complex", 18)
