"""Every script in examples/ and benchmarks/ runs to the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
# Small sizes: these runs show that the scripts work, the figures come from full runs.
BENCHMARKS = {
    "autoloop.py": ["--T", "6", "--B", "2", "--H", "4", "--repeats", "1"],
    "checkpoint.py": [
        "--T",
        "30",
        "60",
        "--H",
        "4",
        "--B",
        "2",
        "--repeats",
        "1",
        "--snapshots",
        "2",
        "--rss",
    ],
    "bidirectional.py": ["--T", "5", "--B", "3", "--F", "3", "--H", "4", "--repeats", "1"],
    "copies.py": ["--T", "8", "--B", "2", "--H", "2", "--D", "4", "--repeats", "1"],
    "eager_scan.py": ["--T", "8", "--B", "2", "--H", "4", "--repeats", "3"],
    "export_time.py": ["--T", "4", "--B", "2", "--H", "4", "--repeats", "1"],
    "import_time.py": ["--repeats", "1"],
    "routes.py": [],
    "revisions.py": ["src", "src", "--quick"],  # the tree against itself
    "onnxruntime_parts.py": ["--cells", "RNN", "LSTM", "--H", "4", "--T", "3", "--repeats", "1"],
    "suite.py": ["--quick"],
    "speed.py": ["--quick", "--memory", "--cells", "RNN", "LSTM"],
    "compiled_loop.py": ["--T", "3", "--B", "2", "--H", "4", "--repeats", "1", "--calls", "1"],
    "unroll.py": [
        *("--T", "3", "18", "--B", "2", "--H", "4", "--repeats", "1", "--budget-s", "0.001"),
        *("--settings", "default options"),
    ],
    "compile_scan.py": [
        *("--T", "3", "5", "--B", "2", "--H", "4", "--repeats", "1", "--compile-repeats", "1"),
        *("--backend", "aot_eager"),
    ],
}
# suite.py prints several tables (--quick: 3 cells, 2 lengths, 1 hidden size, 2 thread settings)
ROWS = {
    "autoloop.py": 5 * 2,  # 5 models, 2 modes
    "checkpoint.py": 2 * 2 * (5 + 3),  # 2 cells, 2 lengths, 5 scans and 3 loops
    "bidirectional.py": 2 * 3 + 2,  # eager: 2 modes, 3 implementations; onnxruntime: 2 graphs
    "copies.py": 3 * 4,  # 3 modes, 2 loops with and without copies
    "eager_scan.py": 9,
    "export_time.py": 4,
    "import_time.py": 3,
    "routes.py": 5,
    "revisions.py": 9,
    "onnxruntime_parts.py": 2 * 5,
    "suite.py": 24 + 6 + 6 + 6 + 12,
    "speed.py": 2 * (2 * 2) * 2,  # 2 cells, 2 lengths, 2 modes; speed and memory
    "compiled_loop.py": 2 + 2 * 3,  # eager: 2; compiled: torchscan and torch's scan, 3 settings
    "unroll.py": 2 * 2 * 2 * 3,  # 2 cells, 2 modes, 2 lengths, 3 implementations
    "compile_scan.py": 2 * 4 + 2 + 4,  # per length 4 implementations; compile ratios; graphs
}


def run(script: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# Examples sized for a long run, here at a small size.
EXAMPLE_ARGS = {
    "long_sequence.py": ["--T", "300", "--B", "4", "--channels", "64", "--train-steps", "1"],
}


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script: Path) -> None:
    run(script, *EXAMPLE_ARGS.get(script.name, []))


def test_every_benchmark_is_exercised() -> None:
    assert sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")) == sorted(BENCHMARKS)


@pytest.mark.benchmarks
@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_benchmark_runs_and_prints_a_ratio_per_row(name: str, tmp_path: Path) -> None:
    # not over the docs' figures
    out = ["--out", str(tmp_path)] if name in ("suite.py", "compile_scan.py") else []
    output = run(ROOT / "benchmarks" / name, *BENCHMARKS[name], *out)
    lines = [line for line in output.splitlines() if line.startswith("| ")]
    # every table's first two lines are its header and the alignment row
    headers = {
        i + offset for i, line in enumerate(lines) if line.startswith("| ---") for offset in (-1, 0)
    }
    rows = [line for i, line in enumerate(lines) if i not in headers]
    assert len(rows) == ROWS[name]
    assert all(float(row.split("|")[-2]) > 0 for row in rows)
    if name == "suite.py":
        assert (tmp_path / "results.md").read_text().strip() in output
