"""Differential fuzzing: random scan/loop programs run by torchscan, by a Python-loop oracle, and
exported to ONNX and run by onnxruntime and onnx's reference evaluator.

``python -m pytest tests/fuzz`` runs a fixed, derandomized slice (as CI does);
``python -m pytest tests/fuzz --fuzz 1000`` runs 1000 programs per test from random seeds.
See docs/fuzzing.md. The exported programs are in ``test_fuzz_export.py``: the longest test, in a
file of its own so that the test processes share the fuzzing.
"""

from __future__ import annotations

import collections

import hypothesis
import pytest

from torchscan import _hoist
from torchscan._hoist import _inductor as _compiled_hoist
from torchscan._hoist import _policy

from ._check import RUNS, check_checkpointed, check_compiled, check_eager, check_vmap
from ._padded import check_padded, padded_problems
from ._strategies import programs
from ._theano import check_theano, theano_problems


def test_eager_matches_the_python_loop(fuzz_settings) -> None:
    @fuzz_settings("eager")
    @hypothesis.given(program=programs())
    def run(program) -> None:
        RUNS["eager only"] += 1
        check_eager(program)

    run()


def test_hoisted_steps_match_the_python_loop(fuzz_settings, monkeypatch) -> None:
    """Every program's module called until its step is traced (at the third call of its
    signature), at every length, batched over the steps and then, on a new module called as
    often, unbatched: hoisted wherever the rules let it be, and equal to the oracle either way:
    within rounding batched (a kernel vectorized over every step may round otherwise than on
    one step, as a product over the whole sequence adds in another order), bit for bit
    unbatched."""
    monkeypatch.setattr(_policy, "BATCH_FROM", 1)  # batched over the steps at every length
    outcomes: collections.Counter[str] = collections.Counter()

    @fuzz_settings("hoisted")
    @hypothesis.given(program=programs())
    def run(program) -> None:  # the cache is kept from program to program, as a process keeps it
        _hoist.last.what = ""
        if check_eager(program, exact=False, calls=_hoist.TRACE_AT_CALL):
            RUNS["hoisted"] += 1
            if _hoist.last.what:  # it scans: what its last scan did
                outcomes[_hoist.last.reason or _hoist.last.what] += 1
                with monkeypatch.context() as patch:
                    patch.setattr(_policy, "BATCH_FROM", 10**9)  # at every step, in the loop
                    check_eager(program, calls=_hoist.TRACE_AT_CALL)

    run()
    if sum(outcomes.values()) >= 12:  # the default slice: most of its scans are hoisted
        assert outcomes["first call"] == 0, outcomes  # a module called thrice is traced
        assert outcomes["hoisted"] >= sum(outcomes.values()) // 2, outcomes
    else:
        pytest.fail(f"too few programs were traced to judge: {outcomes}")


def test_compiled_programs_match_eager(fuzz_settings) -> None:
    """Programs compiled by Inductor, whose scans it hoists where their steps allow it, against
    the same programs run eagerly. (Random steps seldom have work on ``x`` alone: the hoisting
    itself is tested on steps made to have it in tests/test_compiled_hoist.py.)"""
    outcomes: collections.Counter[str] = collections.Counter()

    @fuzz_settings("compiled")
    @hypothesis.given(program=programs())
    def run(program) -> None:
        if check_eager(program):
            _compiled_hoist.last.clear()
            if check_compiled(program):
                RUNS["compiled"] += 1
                outcomes["hoisted" if _compiled_hoist.last else "compiled"] += 1
            else:
                outcomes["torch cannot compile it"] += 1

    run()
    assert outcomes["compiled"] + outcomes["hoisted"] >= sum(outcomes.values()) // 2, outcomes


def test_checkpointed_programs_match_them_without_checkpoint(fuzz_settings) -> None:
    """Every program with each schedule of ``checkpoint=``: the same values and gradients."""

    @fuzz_settings("checkpointed")
    @hypothesis.given(program=programs())
    def run(program) -> None:
        if check_checkpointed(program):
            RUNS["checkpointed"] += 1

    run()


def test_vmap_matches_vmap_of_the_python_loop(fuzz_settings) -> None:
    @fuzz_settings("vmap")
    @hypothesis.given(program=programs())
    def run(program) -> None:
        hypothesis.assume(program.vmappable())  # vmap refuses the loop's break as torchscan does
        check_vmap(program)

    run()


def test_padded_batches_match_the_per_example_loop(fuzz_settings) -> None:
    @fuzz_settings("padded")
    @hypothesis.given(problem=padded_problems())
    def run(problem) -> None:
        RUNS["padded"] += 1
        check_padded(problem)

    run()


def test_theano_scan_exports_as_the_guide_runs_it(fuzz_settings) -> None:
    @fuzz_settings("theano")
    @hypothesis.given(problem=theano_problems())
    def run(problem) -> None:
        RUNS["theano exported"] += 1
        check_theano(problem)

    run()
