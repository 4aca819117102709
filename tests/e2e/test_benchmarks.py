"""The benchmark scripts still run (short mode); their numbers are not judged here (timing
belongs in benchmarks/RESULTS.md, measured by hand, not in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmarks

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: int = 300, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False,
                          env=None if env is None else {**os.environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_overhead_benchmark_runs_in_quick_mode() -> None:
    """Each kind of row runs: the engine's, a floor and a reference (every configuration
    is a row of the same loop; `--configs` keeps the run short)."""
    out = _run("benchmarks/overhead.py", "--quick", "--models", "mlp", "--configs",
               "default,floor,anomaly")
    assert "neuraldbg default" in out and "plain vs plain" in out
    assert "floor: one fused gradient read" in out and "detect_anomaly" in out
    out = _run("benchmarks/overhead.py", "--quick", "--models", "cnn", "--threads", "1",
               "--clock", "cpu", "--configs", "default")
    assert "cpu clock" in out and "neuraldbg default" in out


def test_overhead_benchmark_times_only_the_configurations_asked_for() -> None:
    """`--configs` keeps the control beside the chosen rows (the noise they are read
    against) and drops the rest; an unknown key is refused with the known ones."""
    out = _run("benchmarks/overhead.py", "--quick", "--models", "mlp", "--configs",
               "floor_reduce")
    assert "floor: gradient read + one min/max per layer output" in out
    assert "plain vs plain" in out and "neuraldbg default" not in out
    done = subprocess.run([sys.executable, "benchmarks/overhead.py", "--quick", "--configs",
                           "nosuch"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode != 0 and "unknown config(s) nosuch" in done.stderr
    assert "floor_reduce" in done.stderr


def test_self_time_benchmark_runs_in_quick_mode_and_charges_every_part() -> None:
    out = _run("benchmarks/self_time.py", "--quick")
    assert "neuraldbg default" in out and "gradients only" in out
    total = next(line for line in out.splitlines() if line.startswith("total "))
    quiet, mean = total.split()[1], total.split()[5]  # "total  quiet / sampled / mean"
    assert float(quiet) > 0 and float(mean) > 0  # the wrappers saw the engine's code run


def test_compare_benchmark_runs_a_checkout_beside_this_one() -> None:
    """Compared with itself (the same sources imported under two names), both versions
    are timed and the difference row is there, for a script model and a notebook one, and
    with a watch of its own per block (`--fresh`); a path without a package is refused."""
    out = _run("benchmarks/compare.py", "--base", str(ROOT), "--models", "mlp,nb-cnn",
               "--rounds", "2", "--steps", "1", "--warmup", "1")
    assert out.count(" base ") >= 2 and out.count("this - base") == 2
    assert "CNN on digits" in out
    out = _run("benchmarks/compare.py", "--base", str(ROOT), "--models", "nb-cnn", "--fresh",
               "--rounds", "1", "--steps", "2", "--warmup", "1")
    assert "a watch of its own per block" in out and out.count("this - base") == 1
    done = subprocess.run([sys.executable, "benchmarks/compare.py", "--base", "/nonexistent"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "no neuraldbg_nb/__init__.py" in done.stderr


def test_panel_scale_benchmark_runs_in_quick_mode() -> None:
    out = _run("benchmarks/panel_scale.py", "--quick")
    assert "re-classify" in out and "live message size" in out


def test_memory_benchmark_runs_in_quick_mode() -> None:
    out = _run("benchmarks/memory.py", "--quick")
    assert "Capture budget: peak RSS" in out and "peak RSS - capture_mb=0" in out
    assert "capture_mb=64" in out and "Trace bound" in out


def test_notebook_path_benchmark_runs_in_quick_mode() -> None:
    """A real kernel runs the cells plain, under `%%neuraldbg --no-panel` and with the live
    panel, beside the floors (the cell's own least reads among them); `watch()` runs in
    the script; every variant trains to the same loss. One torch thread: the numbers are
    not judged here, and torch's default threads beside another test's ran five times as
    long."""
    out = _run("benchmarks/notebook_path.py", "--quick", timeout=600,  # a kernel starts
               env={"OMP_NUM_THREADS": "1"})
    for row in ("plain vs plain (control)", "%%neuraldbg --no-panel: ratio",
                "%%neuraldbg (live panel): cost per step (ms)", "per layer call (us",
                "live panel: its updates' measured cost", "watch(model), default: ratio",
                "least reads: the cell's own every-step reads, one transfer: ratio"):
        assert row in out, row
    assert "notebook cell (whole cells" in out and "watch() in a script (per step)" in out
    same = [line for line in out.splitlines() if line.startswith("final loss bit-identical")]
    assert len(same) == 4 and all(" no (" not in line for line in same), same


def test_lightning_benchmark_runs_in_quick_mode() -> None:
    out = _run("benchmarks/lightning_fit.py", "--quick", "--models", "cnn", "--markdown")
    assert "plain step time" in out and "calls `self(x)`" in out and "`self.net(x)`" in out
