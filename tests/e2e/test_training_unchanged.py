"""Watching must not change training: the same losses bit for bit, the same final weights,
buffers and optimizer state, and the same use of the global RNG (dropout)."""

from __future__ import annotations

import pytest
import torch
from models import cnn, mlp, train

import neuraldbg_nb as ndbg

STEPS = 80


def _train(make, watch_kw: dict | None):
    torch.manual_seed(1234)  # the RNG that dropout draws from
    setup = make()
    torch.manual_seed(1234)
    opt = setup.make_opt(setup.model)
    if watch_kw is None:
        losses = train(setup, STEPS, opt=opt)
        run = None
    else:
        with ndbg.watch(setup.model, report=False, **watch_kw) as run:
            losses = train(setup, STEPS, opt=opt)
    return losses, setup.model.state_dict(), opt.state_dict(), torch.get_rng_state(), run


CASES = {
    "mlp-dropout-adam": lambda: mlp(dropout=0.3, adam=True),
    "cnn-batchnorm-adam": lambda: cnn(adam=True),
}
WATCH_KW = {
    "default": {},
    "every-step-stats": {"sample_every": 1},
    "no-capture": {"capture_mb": 0},
}


@pytest.mark.parametrize("watch_kind", list(WATCH_KW))
@pytest.mark.parametrize("case", list(CASES))
def test_watch_does_not_change_training(case, watch_kind):
    make = CASES[case]
    base_losses, base_state, base_opt, base_rng, _ = _train(make, None)
    losses, state, opt_state, rng, run = _train(make, WATCH_KW[watch_kind])

    assert run.trace.n_steps == STEPS
    assert len(losses) == len(base_losses)
    for i, (a, b) in enumerate(zip(base_losses, losses)):
        assert torch.equal(a, b), f"loss of step {i} differs: {a.item()!r} vs {b.item()!r}"
    assert base_state.keys() == state.keys()
    for k in base_state:
        assert torch.equal(base_state[k], state[k]), f"{k} differs after training"
    for pid, st in base_opt["state"].items():
        for k, v in st.items():
            assert torch.equal(v, opt_state["state"][pid][k]), f"optimizer state {pid}.{k}"
    assert torch.equal(base_rng, rng), "the global RNG was used differently"
    # and the watch did see the training it did not change
    recorded = torch.tensor(run.trace.scalar("loss"), dtype=torch.float64)
    expected = torch.stack(base_losses).double()
    assert torch.allclose(recorded, expected, rtol=1e-6, atol=0)


def test_dropout_really_draws_from_the_rng():
    """Guard for the test above: with dropout, different seeds do give different losses."""
    first, second = mlp(dropout=0.3, adam=True), mlp(dropout=0.3, adam=True)
    torch.manual_seed(1)
    a = train(first, 5)
    torch.manual_seed(2)
    b = train(second, 5)
    assert not all(torch.equal(x, y) for x, y in zip(a, b))
