"""The lessons' sources are percent scripts, and each committed notebook is its script.

A lesson is a jupytext pair in notebooks/: `NN_name.py`, the percent script that is edited
and linted, and `NN_name.ipynb`, the notebook written from it without outputs (`make
lessons`). A notebook edited alone, or a script changed without its notebook written
again, fails here: the two hold the same cells, of the same types, with the same sources.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jupytext
import nbformat
import pytest
from jupytext.config import load_jupytext_config, load_jupytext_configuration_file

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
LESSONS = "[0-9][0-9]_*"
FORMAT = "py:percent"


def _stems(ext: str) -> list[str]:
    return sorted(p.stem for p in NOTEBOOKS.glob(f"{LESSONS}.{ext}"))


def _cells(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def test_every_source_has_its_notebook_and_every_notebook_its_source() -> None:
    scripts, notebooks = _stems("py"), _stems("ipynb")
    assert scripts, f"no lesson scripts ({LESSONS}.py) in {NOTEBOOKS}"
    assert scripts == notebooks, (
        f"scripts without a notebook: {sorted(set(scripts) - set(notebooks))} (run `make "
        f"lessons`); notebooks without a script: {sorted(set(notebooks) - set(scripts))} "
        f"(`jupytext --to {FORMAT}` writes one from a notebook)")


def test_the_folder_pairs_notebooks_with_percent_scripts() -> None:
    """Jupyter (with jupytext) saves an edit made in a notebook into its script too."""
    config = load_jupytext_configuration_file(str(NOTEBOOKS / "jupytext.toml"))
    assert config.formats == [f"ipynb,{FORMAT}"], config.formats


@pytest.mark.parametrize("stem", _stems("py"))
def test_source_is_python(stem: str) -> None:
    """Magics are comments in a percent script, so the whole lesson parses (and ruff reads
    it)."""
    path = NOTEBOOKS / f"{stem}.py"
    try:
        ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as err:
        pytest.fail(f"{path.name} is not valid Python ({err}); write a magic as jupytext "
                    f"does, commented: `# %%neuraldbg ...`")


@pytest.mark.parametrize("stem", _stems("py"))
def test_notebook_is_its_source(stem: str) -> None:
    script = NOTEBOOKS / f"{stem}.py"
    source = jupytext.read(script, fmt=FORMAT, config=load_jupytext_config(str(script)))
    notebook = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    want, got = _cells(source), _cells(notebook)
    fix = (f"write the notebook from its script with `make lessons` (an edit made in the "
           f"notebook belongs in {script.name})")
    for i, (w, g) in enumerate(zip(want, got)):
        assert g == w, f"{stem}.ipynb cell {i} differs from {script.name}: {g!r} vs {w!r}; {fix}"
    assert len(got) == len(want), (
        f"{stem}.ipynb has {len(got)} cells, {script.name} {len(want)}; {fix}")
