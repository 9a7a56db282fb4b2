"""Differential fuzzing: random scan/loop programs run by torchscan, by a Python-loop oracle, and
exported to ONNX and run by onnxruntime and onnx's reference evaluator.

``python -m pytest tests/fuzz`` runs a fixed, derandomized slice (as CI does);
``python -m pytest tests/fuzz --fuzz 1000`` runs 1000 programs per test from random seeds.
See docs/fuzzing.md.
"""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st

from ._check import RUNS, check, check_eager
from ._strategies import programs


def test_eager_matches_the_python_loop(fuzz_settings) -> None:
    @fuzz_settings("eager")
    @hypothesis.given(program=programs())
    def run(program) -> None:
        RUNS["eager only"] += 1
        check_eager(program)

    run()


def test_export_matches_eager(fuzz_settings) -> None:
    @fuzz_settings("export")
    @hypothesis.given(program=programs(), opset=st.integers(8, 25))
    def run(program, opset) -> None:
        check(program, opset)

    run()
