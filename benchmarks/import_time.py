"""Time of ``import torchscan`` against ``import torch``, each in a fresh Python process.

The imports alternate (each repetition starts one process of each, in rotating order), so that
both see the same load; medians and their ratio are reported. ``torchscan --version`` is timed
the same way. Run ``python benchmarks/import_time.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

_TIMED = "import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
_WHOLE = "import time, subprocess, sys; t = time.perf_counter(); subprocess.run({argv!r}, check=True, capture_output=True); print(time.perf_counter() - t)"  # noqa: E501


def _seconds(code: str) -> float:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return float(result.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    cases = {
        "import torch": _TIMED.format(statement="import torch"),
        "import torchscan": _TIMED.format(statement="import torchscan"),
        "torchscan --version": _WHOLE.format(argv=[sys.executable, "-m", "torchscan", "--version"]),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for repeat in range(args.repeats):
        for k in range(len(names)):
            name = names[(repeat + k) % len(names)]
            times[name].append(_seconds(cases[name]))

    base = statistics.median(times["import torch"])
    print(f"{args.repeats} fresh processes each, interleaved; medians")
    print("| what | median (s) | ratio to import torch |")
    print("| --- | --- | --- |")
    for name in names:
        median = statistics.median(times[name])
        print(f"| {name} | {median:.3f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
