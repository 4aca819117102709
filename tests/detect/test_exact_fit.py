"""An exact fit is not a failure (`detect.gradients.converged`) on hand-made traces: a
loss of exactly 0 whose gradients are exactly 0 is neither a cut-off nor a vanishing
gradient, and once the loss is back above 0 the same gradients are judged as usual."""

from __future__ import annotations

from traces import N, build, noisy, of

from neuraldbg_nb.detect import detect


def test_a_loss_of_exactly_0_exempts_its_steps_only():
    loss = noisy(0.5)[:, 0]
    g = noisy(0.1, cols=2)
    loss[10:] = 0.0
    g[10:] = 0.0
    fit = build([("a", "other"), ("b", "other")], {"grad_norm": g}, {"loss": loss})
    assert not of(detect(fit)[1], "vanishing_gradient")
    later = loss.copy()
    later[30:] = 0.4  # the loss is back, the gradients stay exactly 0: cut off from there
    _, events = detect(build([("a", "other"), ("b", "other")], {"grad_norm": g},
                             {"loss": later}, n=N))
    cut = of(events, "vanishing_gradient", signal="cut")
    assert sorted((e.layer, e.step) for e in cut) == [("a", 30), ("b", 30)], events


def test_a_fit_at_0_with_a_few_steps_at_the_float_floor_is_not_vanishing():
    """A classifier fitted exactly reads a loss of 0 at most steps and 1e-9 at a few,
    where its gradients read 1e-7: those steps' own loss is 1e9x below the first one,
    a fit, not gradients that stopped reaching the layers. The same gradients at a loss
    that stayed where it began are vanishing."""
    loss = noisy(0.5)[:, 0]
    g = noisy(0.1, cols=2)
    loss[10:] = 0.0
    loss[10::7] = 1e-9
    g[10:] = 0.0
    g[10::7] = 1e-7
    layers = [("a", "other"), ("b", "other")]
    assert not of(detect(build(layers, {"grad_norm": g}, {"loss": loss}))[1],
                  "vanishing_gradient", signal="gradient")
    stuck = noisy(0.5)[:, 0]
    vanished = of(detect(build(layers, {"grad_norm": g}, {"loss": stuck}))[1],
                  "vanishing_gradient")
    assert vanished and min(e.step for e in vanished) <= 17, vanished
