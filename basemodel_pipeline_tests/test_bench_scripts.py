"""The benchmark scripts stay runnable where no GPU is lent: shell syntax, imports, argument parsing, maths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_gpu_script_parses_and_names_its_steps() -> None:
    script = BENCH / "gpu_benchmark.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for step in (
        "bench_foundation.py",
        "bench_budget.py",
        "bench_scaling.py",
        "DEVICE=${DEVICE:-cuda}",
        "STEPS",
    ):
        assert step in text


@pytest.mark.parametrize("script", ["bench_budget.py", "bench_scaling.py", "bench_foundation.py"])
def test_bench_script_help(script: str) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "--device" in out.stdout


def test_scaling_slope_is_the_log_log_exponent() -> None:
    sys.path.insert(0, str(BENCH))
    from bench_scaling import size_label, slope

    ev = [1e6, 5e6, 1e7, 5e7]
    assert slope(ev, [2.0 * e for e in ev]) == pytest.approx(1.0)
    assert slope(ev, [3.0 * e**2 for e in ev]) == pytest.approx(2.0)
    assert slope(ev, [7.0] * 4) == pytest.approx(0.0, abs=1e-9)
    assert slope([1e6], [1.0]) != slope([1e6], [1.0])  # one point: NaN
    assert size_label(500_000) == "0.5M" and size_label(50_000_000) == "50M"
