"""The commands docs/benchmarks.md shows, run at a tiny size: a benchmark whose documented
command no longer runs fails here, not in a reader's hands. Each run checks the exit status and
the table it prints, never a figure (durations belong to the benchmarks themselves)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Enough calls to fill each table row once; the documented sizes take minutes.
TINY_DESCRIBE = ["--vms", "2", "--warmup", "0", "--calls-c1", "5", "--calls-c32", "32"]
TINY_DESCRIBE += ["--rounds", "1"]


def test_the_describe_benchmark_runs_and_prints_its_table() -> None:
    ran = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "describe_bench.py"), *TINY_DESCRIBE],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert "| target | phase | concurrency | calls | errors |" in ran.stdout
    assert "pyrigaud errors at c=32: 0" in ran.stdout
