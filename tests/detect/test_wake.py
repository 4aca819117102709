"""When a live run scans at once (`detect.wake`): every kind of sudden change wakes it
and ordinary moves do not; a rise or a jump is scanned for again only if it held, and a
scan skipped that way is one that would have found nothing; sampled columns wake it on a
new condition, not on a layer at the line."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from traces import build, of

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect
from neuraldbg_nb.detect.regime import GRADIENT_PATIENCE
from neuraldbg_nb.detect.wake import WIDE, SampledWake, jump_held, rise_held, wake


@pytest.mark.parametrize("width", [2, WIDE])
def test_wake_fires_on_each_sudden_change_and_not_on_ordinary_moves(width: int) -> None:
    """The live scan's trigger (`wake`), on the newest step of three as the live trace
    holds them (the weight norm after the newest update is not there yet, so weights are
    compared one step back): every kind of sudden change wakes it (at the first step,
    what is wrong in itself), a move below the half-jump line (gradients: half of
    `jump_error`) does not, nor does a falling loss.
    The same answers for a model of a few layers (compared in loops) and a wide one (in
    arrays: `WIDE`), where the change is in the last layer."""
    th = ndbg.Thresholds()  # wake_jump sqrt(10) = 3.16; gradients 10; the loss 3.16, up
    base = {"act_absmax": 2.0, "param_norm": 5.0, "grad_norm": 0.1}
    scal = {"loss": 1.0, "in_absmax": 3.0, "in_nonfinite": 0.0}

    def woke(col: str, value: float, before: float | None = None) -> frozenset[str]:
        cols = {c: np.full((3, width), v) for c, v in base.items()}
        cols["param_norm"][2] = np.nan  # set when the next step closes
        scalars = {c: np.full(3, v) for c, v in scal.items()}
        target = cols[col][..., -1] if col in cols else scalars[col]
        newest = 1 if col == "param_norm" else 2
        if before is not None:
            target[newest - 1] = before
        target[newest] = value
        layers = [(f"l{i}", "other") for i in range(width)]
        return wake(build(layers, cols, scalars, n=3), th)

    assert not wake(build([("a", "other")], {c: np.full((1, 1), v) for c, v in base.items()},
                          n=1), th), "one step: nothing to compare"
    for col, value in (("grad_norm", math.inf), ("in_absmax", 0.0), ("in_nonfinite", 3.0)):
        first = build([("a", "other")], {c: np.full((1, 1), v) for c, v in base.items()},
                      {c: np.full(1, value if c == col else v) for c, v in scal.items()}, n=1)
        if col in base:
            first.col(col)[0] = value
        assert wake(first, th) == {"sudden"}, f"the first step, {col} = {value}: wrong in itself"
    assert not woke("act_absmax", 2.0 * 3.1) and woke("act_absmax", 2.0 * 3.2)
    assert not woke("act_absmax", 2.0 / 3.1) and woke("act_absmax", 2.0 / 3.2)
    assert woke("act_absmax", 0.0) and woke("act_absmax", math.inf)
    assert not woke("act_absmax", math.nan), "NaN in the trace: not measured (non-finite is inf)"
    # moves from and to zero and inf, read as numpy divides (x / 0 = inf, 0 / 0 = NaN)
    assert woke("act_absmax", 1.0, before=0.0) and not woke("act_absmax", 0.0, before=0.0)
    assert woke("act_absmax", math.inf, before=math.nan), "a layer first measured non-finite"
    assert woke("act_absmax", 2.0, before=math.inf) and not woke("act_absmax", math.inf,
                                                                 before=math.inf)
    assert not woke("grad_norm", 0.1 * 9.0) and woke("grad_norm", 0.1 * 11.0)
    assert woke("grad_norm", 5e-7, before=2e-6), "crossing the vanish line"
    assert not woke("grad_norm", 5e-7, before=8e-7), "already below it"
    assert woke("grad_norm", 2e3, before=9e2) and not woke("grad_norm", 3e3, before=2e3)
    assert woke("param_norm", 5.0 * 3.2) and not woke("param_norm", -5.0)
    assert woke("param_norm", math.inf), "weights gone non-finite in the last update"
    assert woke("loss", 1.0 * 3.2) and not woke("loss", 1.5)
    assert not woke("loss", 1.0 / 5.0), "a falling loss is no failure"
    assert woke("loss", math.inf)
    assert woke("in_nonfinite", 7.0) and not woke("in_nonfinite", 7.0, before=3.0)
    assert woke("in_absmax", 0.0), "an all-zero batch"
    # a sudden event is scanned for at once; a slow one (reported once it has held) also
    # `patience` steps later; a gradient's jump and the loss's rise, if they held
    assert woke("act_absmax", 0.0) == woke("param_norm", math.inf) == {"sudden"}
    assert woke("grad_norm", 2e3, before=9e2) == woke("loss", math.inf) == {"sudden"}
    assert woke("grad_norm", 5e-7, before=2e-6) == {"slow"}
    assert woke("grad_norm", 0.1 * 11.0) == {"jump"} and woke("loss", 3.2) == {"rise"}


def _blips(seed: int, n: int = 70) -> tuple[np.ndarray, np.ndarray]:
    """A loss near its minimum and two layers' gradients, noisy, with jumps of 3-60x
    (up, and for gradients also down) that last 1-3 steps: what a run that has nearly
    fitted its data looks like, and now and then a jump that holds long enough to be
    reported."""
    rng = np.random.default_rng(seed)
    loss = 0.01 * np.exp(0.3 * rng.standard_normal(n))
    grad = 0.1 * np.exp(0.3 * rng.standard_normal((n, 2)))
    for _ in range(6):
        at, length, factor = int(rng.integers(25, n - 4)), int(rng.integers(1, 4)), \
            float(rng.uniform(3.0, 60.0))
        loss[at:at + length] *= factor
        col = int(rng.integers(0, 2))
        grad[at:at + length, col] *= factor if rng.random() < 0.7 else 1 / factor
    return loss, grad


def test_a_rise_or_jump_whose_scan_is_skipped_is_one_no_scan_would_report() -> None:
    """The live run scans again where the loss rose (`patience` steps later) or a gradient
    jumped (`GRADIENT_PATIENCE` - 1 steps later) only if it held (`rise_held`,
    `jump_held`). Those tests may let a scan be skipped only where it would have found
    nothing: on traces with jumps that last 1-3 steps, wherever a scan at the confirming
    step reports a loss divergence or a gradient regime shift that began at the woken
    step (or, for the loss, the step before it), the test says it held. And they do skip
    the blips."""
    th = ndbg.Thresholds()
    layers = [("a", "other"), ("b", "other")]
    said = {"rise": [], "jump": []}
    for seed in range(12):
        loss, grad = _blips(seed)
        n = len(loss)
        cols, scalars = {"grad_norm": grad, "act_absmax": np.ones((n, 2))}, {"loss": loss}
        prefix = functools.partial(build, layers, cols, scalars)  # prefix(n=k): k steps
        for s in range(th.window, n - th.patience):
            woke = wake(prefix(n=s + 1), th)
            for reason, later, held, kind, signal, starts in (
                    ("rise", th.patience, rise_held, "loss_divergence", "loss", (s - 1, s)),
                    ("jump", GRADIENT_PATIENCE - 1, jump_held, "regime_shift", "gradient",
                     (s,))):
                if reason not in woke:
                    continue
                trace = prefix(n=s + later + 1)
                _, events = detect(trace, th)
                reported = any(e.step in starts for e in of(events, kind, signal=signal))
                answer = held(trace, th, s)
                assert answer or not reported, (seed, s, reason)
                said[reason].append((answer, reported))
    for reason, answers in said.items():
        assert any(r for _, r in answers), f"{reason}: some held and were reported"
        assert sum(not a for a, _ in answers) >= len(answers) // 3, \
            f"{reason}: the blips that fell back at once are skipped"


def test_sampled_wake_fires_on_a_new_condition_not_on_a_layer_at_the_line() -> None:
    """Dead units are judged on sampled steps only, against the two samples before: a
    layer that crosses the line after two samples below it wakes the scan; one that flips
    across it from sample to sample (half-dead ReLUs in a deep stack) does not every time."""
    th = ndbg.Thresholds()  # dead 0.5
    w = SampledWake()
    flags = []
    for dead in [0.1, 0.1, 0.2, 0.7, 0.7, 0.2, 0.6, 0.3, 0.6, 0.1, 0.1, 0.8]:
        t = build([("relu", "relu")], {"dead_frac": np.full((1, 1), dead)},
                  {"sampled": np.ones(1)}, n=1)
        flags.append(bool(w(t, th)))
    assert flags == [False, False, False, True, False, False, False, False, False, False,
                     False, True]
    unsampled = build([("relu", "relu")], {"dead_frac": np.full((1, 1), 0.9)},
                      {"sampled": np.zeros(1)}, n=1)
    assert not SampledWake()(unsampled, th), "a step that was not sampled is not judged"
    first = build([("relu", "relu")], {"dead_frac": np.full((1, 1), 0.9)},
                  {"sampled": np.ones(1)}, n=1)
    assert SampledWake()(first, th), "the first sample is judged on its own"


def test_a_wide_models_jump_test_answers_as_the_loops_do() -> None:
    """`jump_held` compares a `WIDE` model's columns as arrays: on random gradient norms
    with jumps, zeros, non-finite and missing values, it answers as the per-layer loops
    do on the same columns (a narrow trace of each layer alone)."""
    th = ndbg.Thresholds()
    rng = np.random.default_rng(0)
    answers = []
    for _ in range(60):
        n, width = th.window + 8, WIDE
        grad = 10.0 ** rng.normal(-1.0, 0.3, (n, width))
        at = int(rng.integers(th.window // 2, n - 1))
        jumped = rng.random(width) < 0.1
        grad[at:, jumped] *= 10.0 ** rng.choice([-2.5, 2.5], jumped.sum())
        for bad in (0.0, math.inf, math.nan):
            grad[rng.random((n, width)) < 0.03] = bad
        wide = jump_held(build([(f"l{i}", "other") for i in range(width)],
                               {"grad_norm": grad}, n=n), th, at)
        narrow = any(jump_held(build([("a", "other")], {"grad_norm": grad[:, [j]]}, n=n),
                               th, at) for j in range(width))
        assert wide == narrow
        answers.append(wide)
    assert any(answers) and not all(answers), "both answers occur"
