"""A layer or a weight the loop replaces inside the watch, after the optimizer was built
(`model[2] = nn.Linear(...)`, `layer.weight = nn.Parameter(...)`): the new weights get
gradients that no optimizer holds, from the step they arrive; the watch follows the models
as they are now (`Models.rescan`) and names the layer at that step. Replaced and added to
the optimizer, it is healthy, and the new layer is watched like the old one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loops import assert_no_errors, relu_mlp, task_batches, task_loop
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.record.boundary import RESCAN_EVERY

AT = 20
STEPS = 45


def _replace_layer(step, model, opt, add: bool = False):
    if step == AT:
        torch.manual_seed(1)
        model[2] = nn.Linear(16, 16)
        if add:
            opt.add_param_group({"params": model[2].parameters()})


def _rewrap_weight(step, model, opt):
    if step == AT:
        model[4].weight = nn.Parameter(model[4].weight.detach().clone() * 0.5)


def _run(on_step_start, steps: int = STEPS, zero=None, watched: bool = True):
    model = relu_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    zero_grad = None if zero is None else (lambda: opt.zero_grad(**zero))
    if not watched:
        return None, task_loop(model, steps, opt=opt, on_step_start=on_step_start,
                               zero=zero_grad)
    with ndbg.watch(model, report=False) as run:
        losses = task_loop(model, steps, opt=opt, on_step_start=on_step_start,
                           zero=zero_grad)
    return run, losses


@pytest.mark.parametrize("fault, layer", [(_replace_layer, "2"), (_rewrap_weight, "4")])
def test_a_layer_or_weight_replaced_after_the_optimizer_was_built_is_named_at_its_step(
        fault, layer):
    run, losses = _run(fault)
    first = run.first_failure
    assert first is not None, [str(e) for e in run.events]
    assert (first.kind, first.layer, first.step) == ("not_in_optimizer", layer, AT), str(first)
    assert "replaced after the optimizer was built" in first.message
    # the old weights' last norms are not read as an update of the new ones
    assert not [e for e in run.events if e.kind == "exploding_update"], \
        [str(e) for e in run.events]
    _, plain = _run(fault, watched=False)
    assert torch.equal(torch.stack(losses), torch.stack(plain))


def test_a_replacement_under_gradients_zeroed_in_place_is_found_by_the_next_walk():
    """`zero_grad(set_to_none=False)` leaves the old weights a gradient of zeros, so the
    count of weights with a gradient gives no sign: the models are walked every
    `RESCAN_EVERY` steps."""
    run, _ = _run(_replace_layer, steps=RESCAN_EVERY + 5, zero={"set_to_none": False})
    found = [e for e in run.events if e.kind == "not_in_optimizer"]
    assert found and found[0].layer == "2", [str(e) for e in run.events]
    assert AT <= found[0].step <= RESCAN_EVERY, str(found[0])


def test_a_layer_replaced_and_added_to_the_optimizer_is_healthy_and_watched():
    run, _ = _run(lambda s, m, o: _replace_layer(s, m, o, add=True))
    assert_no_errors(run)
    assert not [e for e in run.events if e.kind in ("not_in_optimizer", "weights_not_updated")]
    i = [info.name for info in run.trace.layers].index("2")
    acts = run.trace.col("act_absmax")[AT:, i]
    assert np.isfinite(acts).any(), "the new layer's forward is not heard"
    grads = run.trace.col("grad_norm")[AT:, i]
    assert np.isfinite(grads).all() and (grads > 0).all()


def test_a_layer_replaced_then_an_optimizer_built_anew_is_healthy(tmp_path) -> None:
    """The fix the not-in-optimizer message gives: a new head, then a new optimizer for
    the whole model. The new optimizer's `zero_grad` leaves the old head's last gradient
    in place, so the count of weights with a gradient gives no sign of the replacement:
    the new optimizer's first step does (`Membership.new_optimizer`), and the old head,
    which no optimizer holds now, is not judged."""
    model = relu_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = task_batches()
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            if step == AT:
                torch.manual_seed(1)
                model[4] = nn.Linear(16, 2)
                opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            opt.zero_grad()
            F.cross_entropy(model(x[step]), y[step]).backward()
            opt.step()
    assert_no_errors(run)
    assert not [e for e in run.events if e.kind == "not_in_optimizer"], \
        [str(e) for e in run.events]
    i = [info.name for info in run.trace.layers].index("4")
    assert np.isfinite(run.trace.col("grad_norm")[AT:, i]).all()
    # the new head is judged against its own history, from the step it arrived
    assert run.trace.layers[i].since == AT
    assert not [e for e in run.events if e.layer == "4" and e.kind == "regime_shift"], \
        [str(e) for e in run.events]
    _, whole = ndbg.detect(run.trace)
    assert [str(e) for e in whole] == [str(e) for e in run.events]
    saved = ndbg.load(run.save(tmp_path / "run.npz"))
    assert saved.trace.layers[i].since == AT
    assert [str(e) for e in saved.events] == [str(e) for e in run.events]


def _fine_tune(edit_at: int | None, steps: int = 2 * STEPS):
    """Transfer learning in one block: the body frozen at `AT`, a new head put in, and an
    optimizer over the head alone (the old one let go); with `edit_at`, the new head's
    weights multiplied by 1e4 there."""
    model = relu_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = task_batches()
    with ndbg.watch(model, report=False) as run:
        for step in range(steps):
            if step == AT:
                model[:4].requires_grad_(False)  # (their `.grad` stays from the step before)
                torch.manual_seed(1)
                model[4] = nn.Linear(16, 2)
                opt = torch.optim.SGD(model[4].parameters(), lr=0.05, momentum=0.9)
            if step == edit_at:
                with torch.no_grad():
                    model[4].weight.mul_(1e4)
            opt.zero_grad()
            F.cross_entropy(model(x[step]), y[step]).backward()
            opt.step()
    return run


def test_a_new_head_trained_alone_on_a_frozen_body_is_followed_to_the_end() -> None:
    """The new optimizer holds none of the weights the watch knew: its first step walks
    the models, finds the new head and marks the steps from there; the frozen body's
    old gradients are no weights left out of the optimizer."""
    run = _fine_tune(None)
    assert run.trace.n_steps == 2 * STEPS, "the steps after the new optimizer's first"
    assert_no_errors(run)
    assert not [e for e in run.events if e.kind in ("not_in_optimizer", "no_gradients")], \
        [str(e) for e in run.events]
    broken = _fine_tune(AT + 15)
    first = broken.first_failure
    assert first is not None and (first.layer, first.step) == ("4", AT + 15), \
        [str(e) for e in broken.events]
