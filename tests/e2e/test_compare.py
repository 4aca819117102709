"""`compare(a, b)` and `neuraldbg compare`: where two real trainings part.

A healthy run and a run of the same recipe with a fault injected at a known layer and step
part at that step and layer; two healthy runs of other seeds stay within their own noise and
do not part; the events only the broken run has are listed.
"""

from __future__ import annotations

import pytest
from faults import STEPS, S, lr_x1e4, nan_weight, weight_x1000
from models import cnn, mlp, train

import neuraldbg_nb as ndbg
from neuraldbg_nb.cli import main

FACTORIES = {"mlp": mlp, "cnn": cnn}


def _run(arch: str, seed: int = 0, fault=None, role: str | None = None) -> ndbg.Run:
    setup = FACTORIES[arch](seed)
    kw = fault(setup, setup.layers[role] if role else None) if fault else {}
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, **kw)
    return run


@pytest.mark.parametrize("arch", sorted(FACTORIES))
@pytest.mark.parametrize("fault", [weight_x1000, nan_weight], ids=lambda f: f.__name__)
def test_a_fault_parts_the_runs_at_its_step_and_layer(arch: str, fault) -> None:
    layer = FACTORIES[arch]().layers["mid"]
    healthy, broken = _run(arch), _run(arch, fault=fault, role="mid")
    c = ndbg.compare(healthy, broken)
    assert c.part and c.parting is not None
    assert (c.parting.step, c.parting.layer) == (S, layer), str(c)
    assert f"part at step {S}, layer {layer}" in str(c)
    assert c.only_b and not c.only_a, str(c)  # the healthy run has no error of its own
    assert any(e.step >= S for e in c.only_b)


def test_a_learning_rate_fault_parts_them_at_its_step() -> None:
    c = ndbg.compare(_run("mlp"), _run("mlp", fault=lr_x1e4))
    assert c.parting is not None and c.parting.step == S, str(c)
    assert c.parting.quantity == "param_norm"  # the forward and backward of step S agree


@pytest.mark.parametrize("arch", sorted(FACTORIES))
def test_healthy_runs_of_other_seeds_do_not_part(arch: str) -> None:
    c = ndbg.compare(_run(arch, seed=0), _run(arch, seed=1))
    assert not c.part, str(c)
    assert "do not part" in str(c)
    assert c.steps == STEPS and c.layers


def test_the_command_compares_saved_runs(tmp_path, capsys) -> None:
    a = _run("mlp").save(tmp_path / "yesterday.npz")
    b = _run("mlp", fault=weight_x1000, role="mid").save(tmp_path / "today.npz")
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    layer = mlp().layers["mid"]
    assert f"part at step {S}, layer {layer}" in out
    assert "only in today.npz" in out and "only in yesterday.npz" not in out
    assert str(ndbg.compare(a, b)) == out.strip()
    with pytest.raises(SystemExit):
        main(["compare", str(a), str(tmp_path / "missing.npz")])
