"""The event state machine (`detect.scan`) on hand-made traces: a condition is reported
once it has held `patience` steps, at the step it started; a value hovering at a line gives
one event (hysteresis); non-finite values never recover; NaN means "not measured" and
holds the state; and the last healthy row of each layer is found as a search would."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, noisy, of

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect
from neuraldbg_nb.detect import scan as scan_module
from neuraldbg_nb.detect.scan import HOLD, OK, WARNING, Carry, Finding, last_ok_rows, scan, scan_all


def test_vanishing_needs_patience_and_is_reported_at_its_first_step():
    g = noisy(1e-2, cols=2)
    g[25, 0] = 1e-8                 # one-step dip: not vanishing
    g[40:42, 0] = 1e-8              # two steps: still not (patience 3)
    g[30:33, 1] = 1e-8              # three steps: vanishing, from step 30
    trace = build([("a", "other"), ("b", "other")], {"grad_norm": g})
    _, events = detect(trace)
    assert of(events, "vanishing_gradient", "a") == []
    van = of(events, "vanishing_gradient", "b")
    assert len(van) == 1
    assert van[0].step == 30 and van[0].severity == "error"
    assert van[0].value == pytest.approx(1e-8, rel=1e-3)
    assert van[0].end == 33          # back to healthy at step 33
    rec = of(events, "recovery", "b")
    assert [e.step for e in rec] == [33]


def test_patience_is_a_threshold_setting():
    g = noisy(1e-2, cols=1)
    g[30:32, 0] = 1e-8
    trace = build([("a", "other")], {"grad_norm": g})
    assert of(detect(trace)[1], "vanishing_gradient") == []
    found = of(detect(trace, ndbg.Thresholds(patience=2))[1], "vanishing_gradient")
    assert [e.step for e in found] == [30]


def test_nonfinite_is_never_a_recovery():
    a = noisy(1.0, cols=2)
    g = noisy(0.1, cols=2, seed=3)
    loss = noisy(1.0)[:, 0]
    a[30, 0] = np.inf               # one non-finite step, then finite again
    g[35, 1] = np.inf
    loss[40] = np.inf
    trace = build([("a", "other"), ("b", "other")], {"act_absmax": a, "grad_norm": g},
                  {"loss": loss})
    states, events = detect(trace)
    act = of(events, "nonfinite_activation")
    assert [(e.step, e.layer, e.severity, e.end) for e in act] == [(30, "a", "error", None)]
    grad = of(events, "nonfinite_gradient")
    assert [(e.step, e.layer, e.end) for e in grad] == [(35, "b", None)]
    lossev = of(events, "loss_nonfinite")
    assert [(e.step, e.layer, e.end) for e in lossev] == [(40, None, None)]
    assert of(events, "recovery") == []
    dense = states.dense()
    assert (dense[30:, 0] == 3).all() and (dense[:30, 0] == 1).all()
    assert (dense[35:, 1] == 3).all()


def test_nan_in_the_trace_means_not_measured_not_healthy():
    """Unmeasured steps hold the state: a sampled column that is NaN between samples
    neither ends a condition nor starts one."""
    d = np.full((N, 1), np.nan)
    d[::5, 0] = 0.1
    d[30::5, 0] = 0.95              # from step 30 on, every sample is dead
    trace = build([("r", "relu")], {"dead_frac": d})
    _, events = detect(trace)
    dead = of(events, "dead_units")
    assert [(e.step, e.severity) for e in dead] == [(30, "error")]
    assert dead[0].end is None
    assert of(events, "recovery") == []


def test_value_hovering_at_the_threshold_gives_one_event():
    g = noisy(1.0, cols=1)
    g[20:41, 0] = [1010.0, 990.0] * 10 + [1010.0]   # hovering around explode=1e3
    trace = build([("a", "other")], {"grad_norm": g})
    _, events = detect(trace)
    exp = of(events, "exploding_gradient")
    assert [(e.step, e.end) for e in exp] == [(20, 41)]
    assert [e.step for e in of(events, "recovery", "a", "gradient")] == [41]


def test_dead_units_hovering_at_the_threshold_give_one_event():
    d = np.full((N, 1), 0.1)
    d[20:48, 0] = [0.55, 0.55, 0.55, 0.3] * 7        # held 3 steps, then one healthy dip
    trace = build([("r", "relu")], {"dead_frac": d})  # healthy (0.1) again from step 48
    _, events = detect(trace)
    dead = of(events, "dead_units")
    # one event; it ends where the lasting health began (the dip at 47 that went on)
    assert [(e.step, e.severity, e.end) for e in dead] == [(20, "warning", 47)]


def test_last_healthy_rows_match_a_brute_force_search():
    rng = np.random.default_rng(3)
    for n in (1, 5, 70, 300):
        codes = rng.choice(np.array([HOLD, OK, OK, WARNING], np.int8), (n, 9))
        codes[:, 0] = HOLD                                 # never observed
        codes[:, 1] = OK                                   # healthy to the end
        codes[: n // 2, 2], codes[n // 2:, 2] = OK, WARNING  # healthy long ago
        values = rng.normal(size=(n, 9))
        values[rng.random((n, 9)) < 0.2] = np.nan
        values[-1, 1] = np.nan                             # the last healthy row: NaN
        for cols in (np.arange(9), np.array([1, 2, 5]), np.array([0])):
            want = [max([r for r in range(n) if codes[r, j] == OK
                         and not np.isnan(values[r, j])], default=-1) for j in cols]
            assert last_ok_rows(codes, values, cols).tolist() == want


def test_a_healthy_chunk_leaves_the_machine_as_the_general_walk_does(monkeypatch):
    """A live chunk whose codes are all OK or HOLD, with nothing reported or pending, takes
    a shortcut (`SHORTCUT_ROWS`): each column's run and last healthy value come out as
    from the general walk, chunk after chunk, and a chunk that fires after them gives the
    same events."""
    rng = np.random.default_rng(5)
    chunks = []
    for n in (1, 7, 30, 64):
        codes = rng.choice(np.array([HOLD, OK], np.int8), (n, 6))
        values = rng.normal(size=(n, 6))
        values[rng.random((n, 6)) < 0.3] = np.nan
        chunks.append((codes, values))
    fires = np.zeros((3, 6), np.int8)
    fires[:, 4] = WARNING
    chunks.append((fires, rng.normal(size=(3, 6))))
    names = [(f"l{j}", f"l{j}") for j in range(6)]

    def scanned() -> tuple[list, Carry]:
        carry, events, step = Carry(), [], 0
        for codes, values in chunks:
            f = Finding("k", "s", codes, values, lambda *a: "m", patience=2)
            scan(f, carry, step, names, 2, events)
            step += len(codes)
        return events, carry

    shortcut_events, shortcut = scanned()
    monkeypatch.setattr(scan_module, "SHORTCUT_ROWS", 0)  # the general walk only
    events, general = scanned()
    assert [(e.layer, e.step) for e in shortcut_events] == [("l4", 102)]
    assert shortcut_events == events
    for name in vars(general):
        np.testing.assert_array_equal(getattr(shortcut, name), getattr(general, name), name)
    none: list = []  # a finding of no column (a run that watched no layer): nothing to walk
    empty = np.zeros((4, 0), np.int8)
    scan(Finding("k", "s", empty, empty.astype(float), lambda *a: "m"), Carry(), 0, [], 2, none)
    assert none == []


def test_findings_scanned_together_leave_each_machine_as_one_by_one():
    """`scan_all` reads the healthy findings of a chunk side by side: every carry, and the
    events of the findings that fire or wait among them, come out as from `scan` of each
    finding in turn, chunk after chunk (findings of several widths and dtypes, with rows
    of history before the chunk, one of another length)."""
    widths, history = [3, 1, 5, 2], [0, 2, 0, 1]
    names = [(f"l{j}", f"l{j}") for j in range(5)]

    def chunk(n: int, fire: int | None, seed: int) -> list[tuple[Finding, int]]:
        g = np.random.default_rng(seed)
        found = []
        for i, (w, h) in enumerate(zip(widths, history)):
            codes = g.choice(np.array([HOLD, OK, OK], np.int8), (n + h, w))
            if i == fire:
                codes[h:, w - 1] = WARNING
            values = g.normal(size=(n + h, w)).astype(np.float32 if i % 2 else np.float64)
            values[g.random((n + h, w)) < 0.3] = np.nan
            found.append((Finding(f"k{i}", "s", codes, values, lambda *a: "m", patience=2), h))
        odd = g.choice(np.array([OK, HOLD], np.int8), (n + 3, 2))  # three more rows
        found.insert(0, (Finding("odd", "s", odd, g.normal(size=(n + 3, 2)), lambda *a: "m"), 0))
        return found

    chunks = [chunk(1, None, 1), chunk(7, None, 2), chunk(3, 2, 3), chunk(5, None, 4),
              chunk(30, None, 5), chunk(2, 0, 6), chunk(64, None, 7), chunk(80, None, 8)]

    def scanned(together: bool) -> tuple[list, list[Carry]]:
        carries = [Carry() for _ in range(len(widths) + 1)]
        events: list = []
        step = 0
        for found in chunks:
            items = [(f, c, h) for (f, h), c in zip(found, carries)]
            if together:
                scan_all(items, step, names, 2, events)
            else:
                for f, c, h in items:
                    scan(f, c, step, names, 2, events, h)
            step += found[1][0].codes.shape[0] - found[1][1]
        return events, carries

    events, carries = scanned(True)
    one_by_one, alone = scanned(False)
    assert [(e.kind, e.layer, e.step) for e in events] == [("k2", "l4", 8), ("k0", "l2", 46)]
    assert events == one_by_one
    for a, b in zip(carries, alone):
        for name in vars(b):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), name)
