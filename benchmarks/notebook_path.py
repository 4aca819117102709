"""What watching costs on the path users run: a notebook cell under `%%neuraldbg`, and
`watch()` in a script; wall clock, torch's default threads.

    python benchmarks/notebook_path.py                    # 5 rounds, cells of 30 and 200 steps
    python benchmarks/notebook_path.py --quick            # 1 round of short cells, under a minute
    python benchmarks/notebook_path.py --parts notebook --rounds 7 --markdown

Notebook: one notebook, executed with nbclient in one real kernel, trains each model in
cells run plain, plain again (the control: the noise of the run), under
`%%neuraldbg --no-panel` and under `%%neuraldbg` with the live panel (its widget messages
really sent to the client), with the floors beside them (`--no-activations`; and the
cell's own least every-step reads, `Reads`, which no design that reads every step goes
under), interleaved: per round every variant once, in an order rotated
from round to round. Each cell makes the model afresh (the same seed: every cell trains
the same steps, and the final losses must be bit-identical) and its optimizer, and trains
it; the cell's time is the kernel's, from IPython's `pre_run_cell` to its `post_run_cell`,
the magic's setup, the panel and the summary included. The models are the notebook's:
`cnn`, a small CNN on sklearn's digits (Conv(1,16)+BN+ReLU, Conv(16,32)+BN+ReLU,
Linear(2048,64)+ReLU, Linear(64,10)); `mlp121`, 121 layers (Flatten, Linear(64,128)+ReLU,
58 x (Linear(128,128)+ReLU), Linear(128,10)), He init; both Adam lr 1e-3, batch 64.

Script: the models of `overhead.py` (`mlp`, `cnn`, `transformer`), each block a fresh copy
trained plain, plain again, or inside a fresh `with watch(model):` (entering and leaving
it timed), interleaved the same way.

Modes: `short` times whole cells (blocks) of `--short` steps (30: the first steps, the
watch's start and end included, what a short experiment pays); `steady` cells of
`--steps` steps, timed per step after the first `--short` (and whole). A ratio is the
variant's time over the plain one of the same round, the median over rounds (the range
beside it); the cost per step is the median difference, and per layer call that over the
layer calls of one forward (every leaf module called).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import overhead  # the script models, the header and the table format

NOTEBOOK_MODELS = {"cnn": "CNN on digits", "mlp121": "MLP 121 layers"}
SCRIPT_MODELS = ("mlp", "cnn", "transformer")
CELL_VARIANTS = {"plain": "plain", "control": "plain vs plain (control)",
                 "no_panel": "%%neuraldbg --no-panel", "panel": "%%neuraldbg (live panel)",
                 "floor": "floor: %%neuraldbg --no-panel --no-activations",
                 "reads": "least reads: the cell's own every-step reads, one transfer"}
MAGIC = {"plain": "", "control": "", "no_panel": "%%neuraldbg --no-panel\n",
         "panel": "%%neuraldbg\n", "floor": "%%neuraldbg --no-panel --no-activations\n",
         "reads": ""}
READS = ("_reads = Reads(model)\n", "    _reads.before(x, loss)\n", "    _reads.after()\n")
"""The `reads` cell: the least that any recorder reading every step does, written in the
cell itself (`Reads`): what no design that reads every step can go under."""
SCRIPT_VARIANTS = {"plain": "plain", "control": "plain vs plain (control)",
                   "watch": "watch(model), default",
                   "floor": "floor: watch(model, activations=False)"}
"""The floor variants do the every-step work alone (gradients, weights, the loss, the
input, detection), no layer hook at any step: what no sampling of the layer hooks can go
under."""

MODELS_SOURCE = r'''
import json, time
import torch
from torch import nn
from sklearn.datasets import load_digits

torch.manual_seed(0)
_digits = load_digits()
_x = torch.tensor(_digits.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
_y = torch.tensor(_digits.target)
BATCHES = [(_x[i:i + 64], _y[i:i + 64]) for i in range(0, len(_x) - 63, 64)]


def make_cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10))


def make_mlp121():
    torch.manual_seed(0)
    layers = [nn.Flatten(), nn.Linear(64, 128), nn.ReLU()]
    for _ in range(58):
        layers += [nn.Linear(128, 128), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(128, 10))
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return model


MAKE = {"cnn": make_cnn, "mlp121": make_mlp121}
'''
"""The notebook models and their batches (`MAKE`, `BATCHES`), as the kernel runs them; also
`compare.py`'s `nb-cnn` and `nb-mlp121`."""

SETUP = MODELS_SOURCE + r'''


class Reads:
    """The least an every-step recorder reads: each weight's gradient norm (one
    `_foreach_norm`), the loss, the input's extremes and sum, how far the first 256
    elements of each weight moved since the last update (a copy of them after it), all
    to the host in one transfer."""

    def __init__(self, model):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.heads = [p.detach().view(-1)[:256] for p in self.params]
        self.kept = torch.cat(self.heads)

    def before(self, x, loss):
        norms = torch._foreach_norm([p.grad for p in self.params])
        lo, hi = torch.aminmax(x)
        moved = torch.linalg.vector_norm(torch.cat(self.heads) - self.kept)
        return torch.cat([torch.stack(norms), torch.stack([loss.detach(), lo, hi, x.sum(),
                                                           moved])]).tolist()

    def after(self):
        torch.cat(self.heads, out=self.kept)


def layer_calls(model):
    """Leaf-module calls in one forward."""
    calls = []
    hooks = [m.register_forward_hook(lambda *a: calls.append(1)) for m in model.modules()
             if next(m.children(), None) is None]
    with torch.no_grad():
        model(BATCHES[0][0])
    for h in hooks:
        h.remove()
    return len(calls)


LAYER_CALLS = {k: layer_calls(f()) for k, f in MAKE.items()}
CELLS, MARKS, LOSSES, PANELS, SAID, SELF = [], [], [], [], {}, []
_started = []


def _pre(*args):
    _started.append(time.perf_counter())


def _post(*args):
    if not _started:  # the cell that registered the hooks
        return
    CELLS.append(time.perf_counter() - _started.pop())
    import neuraldbg_nb
    run = neuraldbg_nb.last_run()
    if run is not None and id(run) not in SAID.values():  # the cell's own run: its self-report
        said = run.overhead
        SAID[len(CELLS) - 1] = id(run)
        if said is not None:
            SELF.append([len(CELLS) - 1, [said.fraction, said.whole]])
    from ipywidgets.widgets.widget import _instances
    from neuraldbg_nb.notebook.panel import Panel
    panels = [w for w in list(_instances.values()) if isinstance(w, Panel)]
    for p in panels:  # the cell's panel: what its updates cost; then let it go
        b = p.budget
        PANELS.append([len(CELLS) - 1, b.updates, b.full, b.header, b.seconds])
        p.close()


get_ipython().events.register("pre_run_cell", _pre)
get_ipython().events.register("post_run_cell", _post)
'''

CELL = '''{magic}# {tag}
model = MAKE[{key!r}]()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
{reads[0]}_marks = []
for _i in range({steps}):
    x, y = BATCHES[_i % len(BATCHES)]
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
{reads[1]}    opt.step()
{reads[2]}    _marks.append(time.perf_counter())
MARKS.append(_marks)
LOSSES.append(loss.item())
'''

REPORT = '''print("RESULTS " + json.dumps({"cells": CELLS, "marks": MARKS, "losses": LOSSES,
                                  "panels": PANELS, "layer_calls": LAYER_CALLS,
                                  "said": SELF}))'''


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def rotated(items: list[str], r: int) -> list[str]:
    return items[r % len(items):] + items[: r % len(items)]


def plan(models: list[str], modes: dict[str, int], rounds: int, variants: list[str]
         ) -> list[tuple[int, str, str, str]]:
    """(round, model, mode, variant) in the order they run."""
    return [(r, m, mode, v) for r in range(rounds) for m in models for mode in modes
            for v in rotated(variants, r)]


# -- measuring -------------------------------------------------------------------------


def run_notebook(models: list[str], modes: dict[str, int], rounds: int, warmup: int,
                 timeout: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Execute the benchmark notebook; one record per timed training cell."""
    import nbformat
    from nbclient import NotebookClient

    order = plan(models, modes, rounds, list(CELL_VARIANTS))
    warm = [(-1, m, "warmup", v) for _ in range(warmup) for m in models for v in CELL_VARIANTS]
    cells = [nbformat.v4.new_code_cell("%load_ext neuraldbg_nb\n" + SETUP)]
    for r, m, mode, v in warm + order:
        steps = modes.get(mode, 10)
        cells.append(nbformat.v4.new_code_cell(CELL.format(
            magic=MAGIC[v], tag=f"{m} {mode} {v} round {r}", key=m, steps=steps,
            reads=READS if v == "reads" else ("", "", ""))))
    cells.append(nbformat.v4.new_code_cell(REPORT))
    nb = nbformat.v4.new_notebook(cells=cells)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    line = next(x for x in text.splitlines() if x.startswith("RESULTS "))
    got = json.loads(line[len("RESULTS "):])
    n_warm = len(warm)  # the first cells timed; the setup cell is not
    panels = {cell: (updates, full, header, secs) for cell, updates, full, header, secs
              in got["panels"]}
    said = dict(got["said"])  # cell -> the run's own estimate of its cost (`run.overhead`)
    records = []
    for i, (r, m, mode, v) in enumerate(order):
        k = n_warm + i
        records.append({"round": r, "model": m, "mode": mode, "variant": v,
                        "cell": got["cells"][k], "marks": got["marks"][k],
                        "loss": got["losses"][k], "panel": panels.get(k),
                        "said": said.get(k)})
    return records, got["layer_calls"]


def leaf_calls(model: Any, x: Any) -> int:
    import torch

    calls: list[int] = []
    hooks = [m.register_forward_hook(lambda *a: calls.append(1)) for m in model.modules()
             if next(m.children(), None) is None]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return len(calls)


def run_script(models: list[str], modes: dict[str, int], rounds: int, warmup: int
               ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """`watch()` in this process, as a script uses it; one record per timed block."""
    import neuraldbg_nb

    calls = {m: leaf_calls(overhead.fresh(m).model, overhead.fresh(m).batches[0][0])
             for m in models}

    def block(key: str, variant: str, steps: int
              ) -> tuple[float, list[float], float, float | None]:
        b = overhead.fresh(key)
        marks: list[float] = []
        t0 = time.perf_counter()
        with (neuraldbg_nb.watch(b.model, report=False) if variant == "watch" else
              neuraldbg_nb.watch(b.model, report=False, activations=False)
              if variant == "floor" else contextlib.nullcontext()) as run:
            for _ in range(steps):
                loss = overhead.step(b)
                marks.append(time.perf_counter())
        took = time.perf_counter() - t0
        said = run.overhead if run is not None else None
        return took, marks, loss.item(), [said.fraction, said.whole] if said is not None \
            else None

    for m in models:
        for v in SCRIPT_VARIANTS:
            for _ in range(warmup):
                block(m, v, 10)
    records = []
    for r, m, mode, v in plan(models, modes, rounds, list(SCRIPT_VARIANTS)):
        cell, marks, loss, said = block(m, v, modes[mode])
        records.append({"round": r, "model": m, "mode": mode, "variant": v, "cell": cell,
                        "marks": marks, "loss": loss, "panel": None, "said": said})
    return records, calls


# -- reporting -------------------------------------------------------------------------


def timed(rec: dict[str, Any], mode: str, short: int) -> float:
    """Seconds per step: the whole cell over its steps (short), or the steps after the
    first `short` (steady)."""
    marks = rec["marks"]
    if mode == "short":
        return rec["cell"] / len(marks)
    return (marks[-1] - marks[short - 1]) / (len(marks) - short)


def table(records: list[dict[str, Any]], titles: dict[str, str], variants: dict[str, str],
          mode: str, short: int, calls: dict[str, int], markdown: bool) -> str:
    models = [m for m in titles if any(r["model"] == m for r in records)]
    rows: list[list[str]] = []

    def per_round(m: str, v: str, fn: Callable[[dict[str, Any]], float]) -> dict[int, float]:
        return {r["round"]: fn(r) for r in records
                if r["model"] == m and r["variant"] == v and r["mode"] == mode}

    step = lambda r: timed(r, mode, short)
    plain = {m: per_round(m, "plain", step) for m in models}
    rows.append(["plain step time (ms, median)"] +
                [f"{1e3 * statistics.median(plain[m].values()):.2f}" for m in models])
    watched = [v for v in variants if v != "plain"]
    for v in watched:
        cells = []
        for m in models:
            got = per_round(m, v, step)
            ratios = [got[r] / plain[m][r] for r in got]
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        rows.append([f"{variants[v]}: ratio (range)"] + cells)
    for v in watched:
        if v == "control":
            continue
        ms, us = [], []
        for m in models:
            got = per_round(m, v, step)
            extra = statistics.median(got[r] - plain[m][r] for r in got)
            ms.append(f"{1e3 * extra:+.2f}")
            us.append(f"{1e6 * extra / calls[m]:+.1f}")
        rows.append([f"{variants[v]}: cost per step (ms)"] + ms)
        rows.append([f"{variants[v]}: per layer call (us, {'/'.join(str(calls[m]) for m in models)} calls)"] + us)
    if mode == "steady":
        for v in watched:
            cells = []
            for m in models:
                got = per_round(m, v, lambda r: r["cell"])
                base = per_round(m, "plain", lambda r: r["cell"])
                cells.append(f"{statistics.median(got[r] / base[r] for r in got):.2f}")
            rows.append([f"{variants[v]}: whole cell, ratio"] + cells)
    # what the run says it cost, beside what it cost: per step where steps are timed,
    # over the whole run where whole cells are
    which, what = (0, "run.overhead") if mode == "steady" else (1, "run.overhead.whole")
    for v in watched:
        said = {m: [r["said"][which] for r in records if r["model"] == m and r["variant"] == v
                    and r["mode"] == mode and r.get("said") is not None
                    and r["said"][which] is not None] for m in models}
        if any(said.values()):
            rows.append([f"{variants[v]}: its self-report ({what}), median"] +
                        [f"+{statistics.median(said[m]):.1%}" if said[m] else "n/a"
                         for m in models])
    panel = [r for r in records if r["panel"] is not None and r["mode"] == mode]
    if panel:
        cells = []
        for m in models:
            mine = [r for r in panel if r["model"] == m]
            if not mine:
                cells.append("n/a")
                continue
            share = statistics.median(r["panel"][3] / r["cell"] for r in mine)
            ups = statistics.median(r["panel"][0] for r in mine)
            cells.append(f"{ups:g} updates, {share:.1%} of the cell")
        rows.append(["live panel: its updates' measured cost"] + cells)
    same = []
    for m in models:
        losses = {r["loss"] for r in records if r["model"] == m and r["mode"] == mode}
        same.append("yes" if len(losses) == 1 else f"no ({len(losses)} values)")
    rows.append(["final loss bit-identical in every variant"] + same)
    return overhead.fmt_table([f"{mode}: ratio to plain (median)"] +
                              [titles[m] for m in models], rows, markdown)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="1 round, cells of 10 and 20 steps, no warm-up, the script's MLP "
                         "only (CI: that it runs, not what it measures)")
    ap.add_argument("--parts", default="notebook,script", help="notebook,script (default both)")
    ap.add_argument("--modes", default="short,steady", help="short,steady (default both)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 1)")
    ap.add_argument("--short", type=int, help="steps of a short cell (default 30, quick 10)")
    ap.add_argument("--steps", type=int, help="steps of a steady cell (default 200, quick 20)")
    ap.add_argument("--warmup", type=int, help="untimed cells of 10 steps per model and "
                                               "variant first (default 1, quick 0)")
    ap.add_argument("--notebook-models", default=",".join(NOTEBOOK_MODELS))
    ap.add_argument("--script-models", help=f"default {','.join(SCRIPT_MODELS)} (quick: mlp)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds a cell may take")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    q = args.quick
    rounds = args.rounds or (1 if q else 5)
    short = args.short or (10 if q else 30)
    steady = args.steps or (20 if q else 200)
    warmup = args.warmup if args.warmup is not None else (0 if q else 1)
    if steady <= short:
        ap.error(f"--steps ({steady}) must exceed --short ({short}): a steady cell is timed "
                 f"after its first {short} steps")
    modes = {m: {"short": short, "steady": steady}[m] for m in args.modes.split(",") if m}
    parts = [p for p in args.parts.split(",") if p]
    bad = [p for p in parts if p not in ("notebook", "script")] + \
          [m for m in modes if m not in ("short", "steady")]
    if bad:
        ap.error(f"unknown part or mode {', '.join(bad)}")
    nb_models = [m for m in args.notebook_models.split(",") if m]
    sc_models = [m for m in (args.script_models or ("mlp" if q else ",".join(SCRIPT_MODELS))
                             ).split(",") if m]
    unknown = [m for m in nb_models if m not in NOTEBOOK_MODELS] + \
              [m for m in sc_models if m not in overhead.MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}")

    overhead.print_header("benchmarks/notebook_path.py", argv)
    print(f"{rounds} round(s); short: whole cells of {short} steps; steady: cells of "
          f"{steady} steps, per step after the first {short}; wall clock, default threads\n",
          flush=True)
    started = time.perf_counter()
    if "notebook" in parts:
        records, calls = run_notebook(nb_models, modes, rounds, warmup, args.timeout)
        for mode in modes:
            print(f"notebook cell ({'whole cells' if mode == 'short' else 'per step'}, "
                  f"one kernel)")
            print(table(records, NOTEBOOK_MODELS, CELL_VARIANTS, mode, short, calls,
                        args.markdown))
            print(flush=True)
    if "script" in parts:
        titles = {m: overhead.MODELS[m]().title for m in sc_models}
        with _quiet_warnings():
            records, calls = run_script(sc_models, modes, rounds, warmup)
        for mode in modes:
            print(f"watch() in a script ({'whole blocks' if mode == 'short' else 'per step'})")
            print(table(records, titles, SCRIPT_VARIANTS, mode, short, calls, args.markdown))
            print(flush=True)
    print(f"total {time.perf_counter() - started:.0f} s; load average at end: "
          f"{overhead.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
