"""The %%neuraldbg cell magic, through IPython's test shell, on real trainings."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.testing.globalipapp import get_ipython
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import neuraldbg_nb as ndbg

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(0)
X = torch.randn(4096, 16, generator=g); Y = (X[:, :4]).argmax(1)
"""

TRAIN = """
for step in range({steps}):
    i = step * 32 % 4000
    if step == {fault}:
        with torch.no_grad():
            model[2].weight.mul_(1000)
    opt.zero_grad()
    nn.functional.cross_entropy(model(X[i:i + 32]), Y[i:i + 32]).backward()
    opt.step()
"""


@pytest.fixture
def ip():
    import IPython

    shell = IPython.get_ipython() or get_ipython()  # the test shell starts once per process
    shell.run_line_magic("load_ext", "neuraldbg_nb")
    shell.run_cell(SETUP)
    return shell


def no_hooks_left() -> bool:
    return not (nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
                or optim_module._global_optimizer_pre_hooks
                or optim_module._global_optimizer_post_hooks)


def test_magic_finds_the_fault_and_binds_the_run(ip, capsys) -> None:
    ip.run_cell_magic("neuraldbg", "--no-panel -o myrun", TRAIN.format(steps=80, fault=50))
    run = ip.user_ns["myrun"]
    assert run is ndbg.last_run()
    assert run.status == "finished"
    assert (run.first_failure.layer, run.first_failure.step) == ("2", 50)
    assert "first failure" in capsys.readouterr().out
    assert no_hooks_left()


def test_stop_on_error_stops_quietly_at_the_failure(ip) -> None:
    ip.run_cell_magic("neuraldbg", "--no-panel --stop-on error", TRAIN.format(steps=80, fault=50))
    run = ndbg.last_run()
    assert run.status == "stopped"
    assert run.trace.n_steps == 51  # stopped in the optimizer step of step 50
    assert run.first_failure.step == 50
    assert no_hooks_left()


def test_thresholds_options_reach_detection(ip) -> None:
    ip.run_cell_magic("neuraldbg", "--no-panel --jump 5000 --jump-error 5000 --max-update 1e9 "
                                   "--explode 1e12 --loss-rise 1e9",
                      TRAIN.format(steps=70, fault=50))
    run = ndbg.last_run()
    assert run.thresholds.jump == 5000 and run.thresholds.explode == 1e12
    assert all(e.kind != "regime_shift" for e in run.events)


def test_watch_options_reach_the_watch(ip) -> None:
    """The options made from `WatchOptions` and `Thresholds` (`live.options`) set the
    watch: activations off, a setting the magic writes nowhere by hand."""
    import numpy as np

    ip.run_cell_magic("neuraldbg", "--no-panel --no-activations --sample-every 5 "
                                   "--lookback 4 --trend 50", TRAIN.format(steps=20, fault=-1))
    run = ndbg.last_run()
    assert (run.thresholds.lookback, run.thresholds.trend) == (4, 50)
    _, act = run.trace.history("act_absmax")
    _, grad = run.trace.history("grad_norm")
    assert np.isnan(act).all() and np.isfinite(grad).any()


def test_cell_exception_reaches_the_user_and_hooks_are_gone(ip) -> None:
    with pytest.raises(ZeroDivisionError):
        ip.run_cell_magic("neuraldbg", "--no-panel",
                          TRAIN.format(steps=10, fault=-1) + "\n1 / 0\n")
    run = ndbg.last_run()
    assert run.status == "raised" and isinstance(run.exception, ZeroDivisionError)
    assert run.trace.n_steps == 10
    assert no_hooks_left()
    assert torch.autograd.backward.__module__ == "torch.autograd"


def test_interrupt_leaves_no_hook(ip) -> None:
    cell = TRAIN.format(steps=5, fault=-1) + "\nraise KeyboardInterrupt\n"
    with pytest.raises(KeyboardInterrupt):
        ip.run_cell_magic("neuraldbg", "--no-panel", cell)
    assert ndbg.last_run().status == "interrupted"
    assert no_hooks_left()


def test_unknown_option_gets_a_spelling_hint(ip) -> None:
    with pytest.raises(UsageError, match="did you mean --vanish"):
        ip.run_cell_magic("neuraldbg", "--vansih 1e-7", "pass")


@pytest.mark.parametrize("line, says", [
    ("--capture-mb -1", "capture_mb must be >= 0"),
    ("--sample-every 0", "sample_every must be >= 1"),
    ("--jump -5", "Thresholds.jump must be > 0"),
])
def test_an_option_out_of_its_range_is_a_usage_error(ip, line, says) -> None:
    with pytest.raises(UsageError, match=f"%%neuraldbg: {says}"):
        ip.run_cell_magic("neuraldbg", line, "pass")
    assert no_hooks_left()


def test_save_keeps_the_run_for_after_a_restart(ip, capsys, tmp_path) -> None:
    """`--save`: the run is on disk when the cell ends, its first failure with it, for
    `ndbg.show(path)` in a kernel that did not train it; a path it cannot write is said,
    not raised over the cell's own result."""
    path = tmp_path / "run_lr0.05"
    ip.run_cell_magic("neuraldbg", f"--no-panel --save {path}",
                      TRAIN.format(steps=60, fault=40))
    assert f"run saved to {path}.npz" in capsys.readouterr().err
    saved = ndbg.load(path)
    assert (saved.first_failure.layer, saved.first_failure.step) == ("2", 40)
    ip.run_cell_magic("neuraldbg", f"--no-panel --save {tmp_path / 'no' / 'such' / 'dir'}",
                      TRAIN.format(steps=3, fault=-1))
    assert "the run was not saved" in capsys.readouterr().err


def test_help_prints_the_options(ip, capsys) -> None:
    ip.run_cell_magic("neuraldbg", "--help", "pass")
    out = capsys.readouterr().out
    assert "--stop-on" in out and "--capture-mb" in out and "--vanish" in out


def test_panel_is_shown_and_follows_the_run(ip) -> None:
    ip.run_cell_magic("neuraldbg", "", TRAIN.format(steps=60, fault=40))
    run = ndbg.last_run()
    panels = [w for w in _widgets() if getattr(w, "run", None) is run]
    assert panels, "no panel was created for the run"
    panel = panels[-1]
    assert panel.status == "finished"
    assert panel.step == 60
    assert panel.first_failure["layer"] == "2" and panel.first_failure["step"] == 40


def _widgets() -> list:
    from ipywidgets.widgets.widget import _instances

    return list(_instances.values())


def test_a_note_is_said_once_under_the_panel_not_as_a_warning_too(ip, capsys) -> None:
    """An optimizer made for an earlier copy of the model (the model's cell run again):
    the run's note says so once, printed when the cell ends, and not again as a warning
    pointing at the magic's own code."""
    import warnings

    stale = "model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ip.run_cell_magic("neuraldbg", "", stale + TRAIN.format(steps=5, fault=-1))
    run = ndbg.last_run()
    (note,) = run.notes
    assert "an earlier copy of this model" in note
    assert capsys.readouterr().err.count("an earlier copy of this model") == 1
    assert not [w for w in caught if "neuraldbg" in str(w.message)], caught
