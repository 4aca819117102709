"""The command line: `neuraldbg demo` and `neuraldbg show`, and `neuraldbg run`, which
runs a real training script (in a subprocess and in process) and names the fault
injected into it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import neuraldbg_nb as ndbg
from neuraldbg_nb import cli


@pytest.mark.slow
def test_demo_saves_a_run_that_show_tells_again(tmp_path, capsys):
    path = tmp_path / "demo.npz"
    assert cli.main(["demo", "weight-blowup", "--save", str(path)]) == 0
    live = capsys.readouterr()
    assert "first failure:" in live.err and path.exists()
    assert cli.main(["show", str(path), "--events"]) == 0
    shown = capsys.readouterr().out
    headline = next(line for line in live.err.splitlines() if "first failure:" in line)
    assert headline in shown
    assert "neuraldbg's own time:" in shown
    # under other thresholds: a jump of 1000x no longer counts, so the story changes
    assert cli.main(["show", str(path), "--jump", "1000", "--jump-error", "10000"]) == 0
    assert headline not in capsys.readouterr().out


SCRIPT = """
import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                      nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(0)
steps = int(sys.argv[sys.argv.index("--steps") + 1])  # the script's own argument
for step in range(steps):
    x = torch.randn(32, 8, generator=g)
    if step == 70:
        x[3, 2] = float("nan")  # a bad row in the data
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
print("script done")
"""


@pytest.mark.slow
def test_run_watches_a_training_script_and_saves_what_it_found(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    saved = tmp_path / "out.npz"
    # neuraldbg's options before the script, the script's own after it
    done = subprocess.run([sys.executable, "-m", "neuraldbg_nb.cli", "run", "--save",
                           str(saved), str(script), "--steps", "120"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "script done" in done.stdout
    assert "first failure: input batch has 1 non-finite value at step 70" in done.stderr
    assert f"run saved to {saved}" in done.stderr
    run = ndbg.load(saved)
    assert run.first_failure is not None
    assert (run.first_failure.kind, run.first_failure.step) == ("data_anomaly", 70)
    assert run.trace.n_steps == 120


def test_run_in_process_gives_the_script_its_argv_and_the_caller_back_its_own(
        tmp_path, capsys, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).replace(
        'print("script done")', 'print("script argv", sys.argv)'))
    monkeypatch.setattr(sys, "argv", ["the-caller", "--its-own"])
    saved = tmp_path / "out.npz"
    assert cli.main(["run", "--save", str(saved), str(script), "--steps", "80"]) == 0
    assert f"script argv {[str(script), '--steps', '80']}" in capsys.readouterr().out
    assert sys.argv == ["the-caller", "--its-own"]
    assert ndbg.load(saved).first_failure.step == 70


@pytest.mark.parametrize("argv, message", [
    (["show", "nowhere.npz"], "no saved run at nowhere.npz"),
    (["run", "missing.py"], "no such script: missing.py"),
    (["show", "cut.npz"], "cut.npz is not a run saved by neuraldbg_nb, or was cut short"),
    (["show", "other.npz"], "other.npz is not a run saved by neuraldbg_nb"),
    (["compare", "other.npz", "nowhere"], "other.npz is not a run saved by neuraldbg_nb"),
    (["run", "--capture-mb", "-3", "train.py"], "capture_mb must be >= 0"),
])
def test_bad_paths_get_a_clear_error(argv, message, capsys, tmp_path, monkeypatch):
    """Also files that are not saved runs (one cut short, another tool's arrays) and an
    option's value out of its range: a usage error that says which and why, no
    traceback."""
    monkeypatch.chdir(tmp_path)
    Path("cut.npz").write_bytes(b"PK\x03\x04 cut short")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    Path("train.py").write_text("print('never run')\n")
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not Path("neuraldbg-run.npz").exists()
