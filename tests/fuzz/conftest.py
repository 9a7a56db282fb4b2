"""The number of programs the fuzz tests run, and their report at the end of the session.

Without ``--fuzz`` each test runs a fixed, derandomized slice (the same programs on every run,
as CI needs); ``--fuzz N`` runs ``N`` programs per test from a random seed, printed on failure.
"""

from __future__ import annotations

from pathlib import Path

import hypothesis
import pytest

from ._check import REFUSALS, RUNS, SKIPS

DEFAULT_EXAMPLES = {
    "eager": 100,
    "hoisted": 40,
    "compiled": 3,
    "export": 14,
    "vmap": 50,
    "checkpointed": 30,
    "padded": 6,
    "theano": 5,
    "autoloop": 30,
}
"""Programs per test in the default slice: every one run eagerly against the oracle, 14 of
them also exported and run in onnxruntime; about two minutes on one core, export dominating."""


@pytest.fixture
def fuzz_settings(request: pytest.FixtureRequest):
    """``fuzz_settings(kind)``: the hypothesis settings of a fuzz test of kind ``eager`` or
    ``export``."""
    n = request.config.getoption("--fuzz")

    def settings(kind: str) -> hypothesis.settings:
        return hypothesis.settings(
            max_examples=n or DEFAULT_EXAMPLES[kind],
            derandomize=n is None,
            deadline=None,
            print_blob=True,
            suppress_health_check=[
                hypothesis.HealthCheck.too_slow,
                hypothesis.HealthCheck.data_too_large,
            ],
        )

    return settings


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--fuzz N`` runs as long as its N programs take: no per-test time limit."""
    if config.getoption("--fuzz") is not None:
        here = Path(__file__).parent
        for item in items:
            if here in item.path.parents:
                item.add_marker(pytest.mark.timeout(0))


def pytest_terminal_summary(terminalreporter) -> None:
    if not RUNS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("torchscan fuzzing")
    write("programs: " + ", ".join(f"{k} {v}" for k, v in RUNS.items()))
    for kind, count in REFUSALS.most_common():
        write(f"refused {count}x: {kind}")
    for kind, count in SKIPS.most_common():
        write(f"left out {count}x: {kind}")
