"""The teaching notebooks run headless and still teach what they say.

Each notebook in notebooks/ is executed top to bottom with nbclient, in a kernel of this
very Python (a kernelspec written to a temporary folder, so no `python3` kernelspec installed
elsewhere on the machine can be picked up instead). A cell that errors fails the test; the
last cell of every notebook asserts the lesson's claim and prints one `LESSON OK: ...` line,
which is checked here against the first failure the lesson teaches (kind, layer, step).

The notebooks are committed without outputs; executing them here does not write them back.
Each is written from the percent script beside it (`make lessons`), which
test_lesson_sources.py holds it equal to.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("sklearn")
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
KERNEL = "python3"
TIMEOUT = 180
"""Seconds one cell may take; a whole notebook takes 15-40 s on two loaded CPU cores."""

# What each lesson teaches, as its last cell prints it: the first failure (kind, layer, step).
CLAIMS = {
    "01_vanishing_gradients.ipynb":
        r"LESSON OK: vanishing_gradient fc5 step 0; fixed run healthy",
    "02_exploding_gradients.ipynb":
        r"LESSON OK: exploding_update out step 5; exploding gradients from step \d+ are "
        r"symptoms; fixed run healthy",
    "03_dead_relus.ipynb":
        r"LESSON OK: dead_units relu1 step \d+; they stay dead; fixed run healthy",
    "04_nan_hunting.ipynb":
        r"LESSON OK: data_anomaly \(no layer\) step \d+; nonfinite_activation standardize "
        r"step \d+; fixed run healthy",
    "05_thresholds_and_regime_shifts.ipynb":
        r"LESSON OK: data_anomaly \(input_scale\) step 60; with jump=100 the first failure "
        r"becomes a symptom \(loss_divergence step \d+\); healthy run quiet",
    "06_end_to_end.ipynb":
        r"LESSON OK: data_anomaly step 0; then lr_change (conv1|conv2|fc1|fc2) step \d+; "
        r"fixed run healthy",
    "07_bugs_of_the_loop.ipynb":
        r"LESSON OK: eval_mode step 23; not_in_optimizer fc1 step 0, weights_not_updated "
        r"step 10; an optimizer of an earlier model named; grads_not_zeroed step 1; fixed "
        r"run quiet",
    "08_half_precision.ipynb":
        r"LESSON OK: weights_not_updated out step 70 \(rounding\), fc1 and fc2 by step 140, "
        r"the whole model at step \d+; the loss stopped falling; float32 weights with "
        r"autocast quiet",
}


def test_every_notebook_has_a_claim() -> None:
    found = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert found == sorted(CLAIMS), f"notebooks {found} vs claims {sorted(CLAIMS)}"


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_notebook_is_committed_without_outputs(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{name}: cells {dirty} have outputs; `make lessons` writes it without"
    assert "widgets" not in nb.metadata, f"{name}: widget state saved in the metadata"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A `python3` kernelspec for this interpreter, first on the Jupyter path."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (neuraldbg_nb tests)",
        "language": "python",
    }))
    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "PYTHONPATH")}
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(root)] + ([saved["JUPYTER_PATH"]] if saved["JUPYTER_PATH"] else []))
    # the kernel imports the package from this checkout, installed or not
    project = str(NOTEBOOKS.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [project] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


@pytest.mark.lessons
@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_notebook_runs_and_its_lesson_holds(name: str, kernel_env: None) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # appended in memory only: proves the kernel is this interpreter
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('EXECUTABLE=' + sys.executable)"))
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=TIMEOUT,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    started = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as err:
        pytest.fail(f"{name}: a cell raised:\n{str(err)[-3000:]}")
    took = time.perf_counter() - started

    assert _text(nb.cells[-1]).strip() == f"EXECUTABLE={sys.executable}", \
        f"{name} ran in another Python: {_text(nb.cells[-1])!r}"
    lesson = _text(nb.cells[-2])
    assert re.fullmatch(CLAIMS[name], lesson.strip()), \
        f"{name}: the lesson's claim changed or failed:\n{lesson}"
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    print(f"{name}: {took:.1f} s")
    assert took < 120, f"{name} took {took:.0f} s; a lesson should run in under a minute"
