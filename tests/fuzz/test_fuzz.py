"""Differential fuzzing: random scan/loop programs run by torchscan, by a Python-loop oracle, and
exported to ONNX and run by onnxruntime and onnx's reference evaluator.

``python -m pytest tests/fuzz`` runs a fixed, derandomized slice (as CI does);
``python -m pytest tests/fuzz --fuzz 1000`` runs 1000 programs of each test with random seeds.
See docs/fuzzing.md.
"""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st

from ._check import check, check_eager
from ._strategies import programs


@hypothesis.given(program=programs())
def test_eager_matches_the_python_loop(program) -> None:
    check_eager(program)


@hypothesis.given(program=programs(), opset=st.integers(8, 25))
def test_export_matches_eager(program, opset) -> None:
    check(program, opset)
