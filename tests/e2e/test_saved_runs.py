"""Saved runs: `Run.save` and `load`. A saved run tells the same story as the live one,
also after a long run's older steps were compacted (the numbers its first failure was
found on are gone then); the file is strict JSON beside numpy arrays, and a file that
lacks what newer ones hold (events, layer facts, a column) still loads."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from models import mlp, module, train
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb import demo

FAULT_STEP = 100
FAULT_LAYER = "2"


def _compacted_run() -> ndbg.Run:
    """600 steps with a 1000x weight fault at step 100, in a trace small enough that the
    fault's steps are compacted long before the end."""
    setup = mlp()

    def fault(step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if step == FAULT_STEP:
            with torch.no_grad():
                module(model, setup.layers["mid"]).weight.mul_(1000)

    with ndbg.watch(setup.model, report=False, trace_mb=0.02) as run:
        train(setup, 600, on_step_start=fault)
    return run


def _key(e: ndbg.Event) -> tuple:
    return (e.step, e.layer, str(e.kind), e.severity, e.message, e.end, repr(e.value),
            repr(e.previous))


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} in a saved run's JSON: strict JSON readers refuse it")


def test_a_compacted_run_saved_and_loaded_keeps_its_events_and_first_failure(tmp_path):
    run = _compacted_run()
    assert run.trace.full_from > FAULT_STEP + 100, "the fault's steps were not compacted"
    first = run.first_failure
    assert first is not None and (first.layer, first.step) == (FAULT_LAYER, FAULT_STEP)
    loaded = ndbg.load(run.save(tmp_path / "run"))
    assert [_key(e) for e in loaded.events] == [_key(e) for e in run.events]
    assert _key(loaded.first_failure) == _key(first)
    assert loaded.overhead == run.overhead and loaded.overhead is not None
    assert str(loaded) == str(run)
    assert run.inspect(first)["output"] is not None
    with pytest.raises(LookupError, match="captured tensors are not saved with a run"):
        loaded.inspect(first)
    # the panel of a loaded run: its first failure and what watching cost
    from neuraldbg_nb.notebook.panel import Panel
    panel = Panel(loaded)
    assert panel.first_failure["step"] == FAULT_STEP
    o = run.overhead
    assert panel.cost == (f"watching +{o.own_ms:.1f} ms/step (+{o.fraction:.1%}; "
                          f"the whole run +{o.whole:.1%})")
    # re-classified, the compacted steps keep their events, as for the live run
    assert [_key(e) for e in loaded.reclassify(jump=20.0).events] == \
        [_key(e) for e in run.reclassify(jump=20.0).events]


def test_a_saved_run_is_strict_json_and_its_non_finite_numbers_come_back(tmp_path):
    """A NaN batch makes events whose numbers are infinite (the loss, the activations):
    written as strings, since strict JSON has no NaN or Infinity, and read back as floats."""
    broken = demo.EXAMPLES["nan-batch"]()
    with ndbg.watch(broken.model, report=False) as run:
        broken()
    assert any(math.isinf(e.value) for e in run.events)
    path = run.save(tmp_path / "nan.npz")
    json.loads(path.with_suffix(".json").read_text(), parse_constant=_no_constant)
    loaded = ndbg.load(path)
    assert [_key(e) for e in loaded.events] == [_key(e) for e in run.events]
    assert loaded.thresholds == run.thresholds


def test_a_file_saved_without_events_is_judged_again_from_its_steps(tmp_path):
    """A file without events in its metadata: its exact steps are judged again."""
    run = _compacted_run()
    path = run.save(tmp_path / "old.npz")
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    del meta["events"], meta["overhead"]
    meta_path.write_text(json.dumps(meta))
    loaded = ndbg.load(path)
    tail = [_key(e) for e in run.events if e.step >= run.trace.full_from and e.end is None]
    assert set(tail) <= {_key(e) for e in loaded.events}
    assert loaded.overhead is None


@pytest.mark.parametrize("columns", [4, 5, 6, 7, 8])
def test_a_file_saved_with_fewer_columns_of_layer_facts_still_loads(tmp_path, columns):
    """A file whose table of layer facts stops before `LayerInfo.primary_lr` (4 columns),
    `LayerInfo.params` (5), `LayerInfo.outputs` (6) or `LayerInfo.since` (7): every
    layer's learning rate is the step's, what the file does not hold is not known (-1),
    and every layer's module is the one it had from the first step (`since` 0)."""
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 5)
    path = run.save(tmp_path / "old.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    assert arrays["layers"].shape[1] == 8
    arrays["layers"] = arrays["layers"][:, :columns]
    np.savez_compressed(path, **arrays)
    loaded = ndbg.load(path)
    assert [i.name for i in loaded.trace.layers] == run.trace.layer_names
    assert all(i.primary_lr for i in loaded.trace.layers)
    sizes = [i.params for i in loaded.trace.layers]
    assert sizes == ([i.params for i in run.trace.layers] if columns >= 6 else [-1] * len(sizes))
    outputs = [i.outputs for i in loaded.trace.layers]
    assert outputs == ([i.outputs for i in run.trace.layers] if columns >= 7 else [-1] * len(sizes))
    assert columns < 7 or min(outputs) > 0
    assert all(i.since == 0 for i in loaded.trace.layers)
    assert sizes[0] == (-1 if columns < 6 else
                        sum(p.numel() for p in setup.model.get_submodule(
                            run.trace.layer_names[0]).parameters()))


def test_a_file_saved_before_the_eval_mode_column_still_loads(tmp_path):
    """A file without the `eval_layers` column: it is not measured there (NaN), and no
    event of it is made up."""
    run = _compacted_run()
    path = run.save(tmp_path / "old.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if not k.endswith("__eval_layers")}
    assert "h_steps" in arrays, "a compacted run: its history columns are read too"
    np.savez_compressed(path, **arrays)
    loaded = ndbg.load(path)
    assert np.isnan(loaded.trace.history("eval_layers")[1]).all()
    assert loaded.trace.n_steps == run.trace.n_steps
    assert not [e for e in loaded.reclassify().events if e.kind == "eval_mode"]


def test_runs_named_with_dots_are_two_runs_and_bad_files_say_what_they_are(tmp_path):
    """`run_lr0.01` and `run_lr0.001` are two files (a name's own dots are kept, .npz is
    added); a path that holds no saved run, or a file that is not one, gets an error that
    says which and what to do."""
    setup = mlp()
    runs = {}
    for lr in ("0.01", "0.001"):
        with ndbg.watch(setup.model, report=False) as run:
            train(setup, 3 if lr == "0.01" else 5)
        runs[lr] = run.save(tmp_path / f"run_lr{lr}")
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["run_lr0.001.npz",
                                                              "run_lr0.01.npz"]
    assert ndbg.load(tmp_path / "run_lr0.01").trace.n_steps == 3
    assert ndbg.load(runs["0.001"]).trace.n_steps == 5
    assert ndbg.load(tmp_path / "run_lr0.001.json").trace.n_steps == 5  # its other file
    with pytest.raises(FileNotFoundError, match="no saved run at .*nowhere.npz: save one"):
        ndbg.load(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("not a run")  # a file, but no run's name
    with pytest.raises(ValueError, match="notes.txt is not a run saved by neuraldbg_nb"):
        ndbg.load(tmp_path / "notes.txt")
    (tmp_path / "adir.npz").mkdir()
    with pytest.raises(FileNotFoundError, match="is a directory"):
        ndbg.load(tmp_path / "adir.npz")
    (tmp_path / "cut.npz").write_bytes(runs["0.01"].read_bytes()[:200])
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    (tmp_path / "bytes.npz").write_bytes(b"\x80\x04 not a zip at all")
    for name in ("cut", "other", "bytes"):
        with pytest.raises(ValueError, match=f"{name}.npz is not a run saved by neuraldbg_nb"):
            ndbg.load(tmp_path / name)
