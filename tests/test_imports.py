"""What ``import torchscan`` loads: what eager loops need, not the export, compile or check
machinery (loaded at first use), so that it costs little more than ``import torch``
(``benchmarks/import_time.py`` measures how much)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

HEAVY = (
    "torch._dynamo",
    "torch._inductor",
    "torch.onnx",
    "torch.fx.experimental.symbolic_shapes",
    "sympy",
    "onnx",
    "onnx_ir",
    "onnxscript",
    "onnxruntime",
    "rich",
)
"""Modules that ``import torch`` does not load and torchscan's eager loops do not need."""


def _loaded_after(code: str) -> list[str]:
    probe = textwrap.dedent(
        f"""
        import json, sys
        {code}
        print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        "import torchscan",
        "import torchscan.theano",
        # an eager scan, loop and until, with gradients: nothing of the rest is needed
        """
        import torch, torchscan
        w = torch.randn(3, 3, requires_grad=True)
        h, ys = torchscan.scan(lambda h, x: (torch.tanh(h @ w + x),) * 2, torch.zeros(3),
                               torch.randn(5, 3))
        c, _ = torchscan.loop(lambda i, c: (c + 1, None), torch.zeros(()), trip_count=3)
        u, _ = torchscan.scan(lambda c, x: (c + x, None, torchscan.until(c > 2)),
                              torch.zeros(()), torch.ones(6))
        ys.sum().backward()
        """,
    ],
    ids=["torchscan", "theano", "eager-loops"],
)
def test_eager_use_imports_none_of_the_export_machinery(code: str) -> None:
    assert _loaded_after(code) == []


def test_the_export_machinery_loads_at_first_use() -> None:
    """The probe sees the modules that an export needs (it is not blind)."""
    loaded = _loaded_after(
        """
        import torch, torchscan
        class M(torch.nn.Module):
            def forward(self, xs):
                return torchscan.scan(lambda h, x: (h + x, h), torch.zeros(2), xs)
        torch.onnx.export(M(), (torch.ones(3, 2),), dynamo=True, verbose=False)
        """
    )
    assert {"torch._dynamo", "torch.onnx", "onnx", "onnxscript"} <= set(loaded)


_WITHOUT = """
import importlib.abc, sys

class Uninstalled(importlib.abc.MetaPathFinder):
    # what a missing distribution looks like to the import system
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Uninstalled())
"""


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        (("onnxruntime",), "needs onnxruntime, which is not"),
        (("onnx_ir", "rich"), "needs onnx-ir and rich, which are not"),
    ],
    ids=["one", "two"],
)
def test_without_the_onnx_extra_torchscan_onnx_says_what_to_install(missing, named) -> None:
    code = _WITHOUT.format(missing=missing) + "import torchscan\nimport torchscan.onnx\n"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: torchscan.onnx (the ONNX export, import and check")
    assert named in last
    assert last.endswith('python -m pip install "torchscan-onnx[onnx]"')


def test_without_the_onnx_extra_the_check_command_says_what_to_install(tmp_path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    code = _WITHOUT.format(missing=("onnxruntime",)) + (
        "from torchscan._cli import entry\nsys.argv = ['torchscan', 'check', 'm.onnx']\nentry()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "torchscan check: error: torchscan.onnx (the ONNX export, import and check of torchscan's "
        "loops) needs onnxruntime, which is not installed. Install them with: python -m pip "
        'install "torchscan-onnx[onnx]"'
    ]
