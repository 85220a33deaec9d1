"""Whole-process time of `rocm-dspark recipe --model V4.1-Flash` against `python -c "import yaml, click"`.

Both are measured in the same run, interleaved, and the median ratio is printed. Target: <= 1.5x.
Usage: python benchmarks/recipe_latency.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time


# Measure as an installed tool runs: with bytecode caches. PYTHONDONTWRITEBYTECODE (set on some dev
# machines) would make our modules compile from source on every run while yaml and click, installed
# by pip, load from their .pyc files: an unfair comparison.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _time(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    cli = shutil.which("rocm-dspark") or None
    recipe = [cli] if cli else [sys.executable, "-m", "rocm_dspark"]
    recipe += ["recipe", "--model", "V4.1-Flash"]  # exactly the operator's command, GPU detection included
    baseline = [sys.executable, "-c", "import yaml, click"]
    _time(recipe), _time(baseline)  # warm the page cache and .pyc files
    base, rec = [], []
    for _ in range(args.runs):
        base.append(_time(baseline))
        rec.append(_time(recipe))
    b, r = statistics.median(base), statistics.median(rec)
    print(f"baseline  python -c 'import yaml, click'     median {b * 1000:7.1f} ms over {args.runs} runs")
    print(f"recipe    rocm-dspark recipe --model V4.1-Flash median {r * 1000:7.1f} ms over {args.runs} runs")
    print(f"ratio     {r / b:.2f}x (target <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
