"""Differential fuzzing of exports: random scan/loop programs exported to ONNX at a random opset
and run by onnxruntime (at its default and disabled optimizations) and onnx's reference
evaluator, against torchscan eagerly and a Python-loop oracle. See ``test_fuzz.py`` and
docs/fuzzing.md.
"""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st

from ._check import check
from ._strategies import programs


def test_export_matches_eager(fuzz_settings) -> None:
    @fuzz_settings("export")
    @hypothesis.given(program=programs(), opset=st.integers(8, 25))
    def run(program, opset) -> None:
        check(program, opset)

    run()
