"""What README.md and docs/ say of torch's own loop tools, held against the installed torch.

The docs compare torchscan with ``torch._higher_order_ops.scan`` and with torch.onnx's export of
``torch.nn.LSTM``/``GRU``, and say which torch release each claim is about. Each claim here is
checked on the torch under test, so that a release that changes one fails this module until the
docs (and the benchmark suite's anchors) say what the new release does.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch._higher_order_ops.scan import scan as torch_scan

from ._export import onnx_export

TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def _runs(fn) -> bool:
    try:
        fn()
    except Exception:
        return False
    return True


H0 = torch.zeros(2, 3)
XS = torch.randn(4, 2, 3)


def _return_h_h(h, x):
    h = h + x
    return h, h


def _none_output(h, x):
    return h + x, None


def _add(h, x):
    h = h + x
    return h, h.clone()


# (claim, what it runs, the first release where it runs or None if none does yet)
CLAIMS = [
    ("a body that returns h, h", lambda: torch_scan(_return_h_h, H0, XS), None),
    (
        "a body that returns the carry unchanged",
        lambda: torch_scan(lambda h, x: (h, x + 1), H0, XS),
        None,
    ),
    ("None outputs", lambda: torch_scan(_none_output, H0, XS), (2, 14)),
    ("a zero-length sequence", lambda: torch_scan(_add, H0, XS[:0]), (2, 14)),
    (
        "length= without xs",
        lambda: torch_scan(lambda h, x: (h + 1, (h + 1).clone()), H0, None, length=3),
        (2, 14),
    ),
]


@pytest.mark.parametrize(("claim", "run", "since"), CLAIMS, ids=[c[0] for c in CLAIMS])
def test_torch_scan_eagerly(claim: str, run, since: tuple[int, int] | None) -> None:
    expected = since is not None and since <= TORCH
    assert _runs(run) == expected, (
        f"torch {torch.__version__}'s own scan {'now runs' if not expected else 'fails on'} "
        f"{claim}: update README.md, docs/index.md and docs/benchmarks.md"
    )


# Only torch runs here (torch.onnx on torch's own modules), and what it warns about on the way
# is its own affair: a deprecation in its internals, how nn.LSTM keeps its weights, and a
# strategy it tries and drops reading .grad of a non-leaf tensor.
@pytest.mark.filterwarnings("ignore:_check_is_size will be removed:FutureWarning")
@pytest.mark.filterwarnings("ignore:The tensor attributes self.rnn._flat_weights:UserWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
@pytest.mark.parametrize(
    ("cell", "since"),
    [(torch.nn.LSTM, (2, 15)), (torch.nn.GRU, (2, 15)), (torch.nn.RNN, None)],
    ids=["LSTM", "GRU", "RNN"],
)
def test_torch_onnx_exports_rnn_modules_with_a_dynamic_length(
    cell: type, since: tuple[int, int] | None
) -> None:
    """torch 2.13 and 2.14 fix a Reshape in the export of nn.LSTM/GRU to the example's length,
    so the model fails at other lengths (or, at some, silently gives wrong values); torch 2.15
    exports them right. nn.RNN's export still fails at other lengths in torch 2.15."""
    torch.manual_seed(0)
    rnn = cell(3, 5)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = rnn

        def forward(self, x):
            return self.rnn(x)[0]

    model = Model().eval()
    program = onnx_export(
        model,
        (torch.randn(6, 2, 3),),
        dynamo=True,
        dynamic_shapes=({0: torch.export.Dim("T")},),
        opset_version=18,
    )
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(program.model_proto.SerializeToString(), options)
    x = torch.randn(9, 2, 3)
    with torch.no_grad():
        expected = model(x).numpy()

    def at_another_length() -> None:
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)

    assert _runs(at_another_length) == (since is not None and since <= TORCH), (
        f"torch {torch.__version__} changed how torch.onnx exports {cell.__name__} with a dynamic "
        "length: update docs/export.md and the benchmark suite's anchors"
    )
