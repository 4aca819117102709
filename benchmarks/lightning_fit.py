"""What `NeuralDbgCallback` costs a Lightning fit: `Trainer.fit` of the notebook models with
and without the callback, interleaved in one process, wall clock, torch's default threads.

    python benchmarks/lightning_fit.py --rounds 5 --markdown

Lightning's automatic optimization gives every step a closure (`optimizer.step(closure)`):
the forward and backward run inside the optimizer's step. Two training steps are timed:
one that calls the module (`self(x)`, whose forward calls the network) and one that calls
the network, a part of the module (`self.net(x)`). Both are recorded as a loop without a
closure (layer hooks at sampled steps, a step that went wrong replayed: through the
module's calls, or through the part's, heard from the second step on). A round fits plain, watched
(through the module), watched (through the part), plain, each for `--steps` optimizer
steps of a fresh model; a ratio is a watched fit over the round's two plain ones (whole
fits: the trainer's start and end included), the table gives the median over the rounds,
with the plain step time and what watching adds a step and a layer call.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import notebook_path  # (the notebook models, as the kernel makes them)

MODELS = {"cnn": "CNN on digits", "mlp121": "MLP 121 layers"}
LAYER_CALLS = {"cnn": 10, "mlp121": 120}
"""Layer calls of one forward (as `notebook_path.py` counts them)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="cnn,mlp121", help=f"of {', '.join(MODELS)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps of each fit")
    ap.add_argument("--quick", action="store_true", help="1 round of 8 steps (a check)")
    ap.add_argument("--markdown", action="store_true", help="a markdown table")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    rounds, steps = (1, 8) if args.quick else (args.rounds, args.steps)

    warnings.simplefilter("ignore")  # Lightning's advice on workers and loggers
    for name in ("lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import lightning.pytorch as pl

    from neuraldbg_nb.integrations.lightning import NeuralDbgCallback

    space: dict = {}
    exec(notebook_path.MODELS_SOURCE, space)  # noqa: S102  (the models' own source)
    xs = torch.cat([b[0] for b in space["BATCHES"]])
    ys = torch.cat([b[1] for b in space["BATCHES"]])

    class Module(pl.LightningModule):
        def __init__(self, key: str, via_forward: bool) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = space["MAKE"][key]()
            self.via_forward = via_forward

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            x, y = batch
            out = self(x) if self.via_forward else self.net(x)
            return torch.nn.functional.cross_entropy(out, y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), 1e-3)

    folder = tempfile.mkdtemp(prefix="lightning_fit_")

    def fit(key: str, watched: bool, via_forward: bool = True) -> float:
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys),
                                             batch_size=64)
        trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             accelerator="cpu", num_sanity_val_steps=0,
                             default_root_dir=folder,  # (where the callback saves its run)
                             callbacks=[NeuralDbgCallback(report=False)] if watched else [])
        module = Module(key, via_forward)
        t0 = time.perf_counter()
        trainer.fit(module, loader)
        return time.perf_counter() - t0

    variants = {"forward": "watched, the step calls `self(x)`",
                "part": "watched, the step calls `self.net(x)`"}
    table: dict[str, dict[str, float]] = {}
    for key in models:
        fit(key, False)
        fit(key, True)  # (first fits: imports, allocations)
        ratios: dict[str, list[float]] = {v: [] for v in variants}
        plain_steps: list[float] = []
        for r in range(rounds):
            print(f"  {key}: round {r + 1}/{rounds}", file=sys.stderr)
            p0 = fit(key, False)
            w = {"forward": fit(key, True, True), "part": fit(key, True, False)}
            p1 = fit(key, False)
            plain = (p0 + p1) / 2
            plain_steps.append(plain / steps)
            for v in variants:
                ratios[v].append(w[v] / plain)
        step = statistics.median(plain_steps)
        row = {"step_ms": step * 1e3}
        for v in variants:
            ratio = statistics.median(ratios[v])
            row[v] = ratio
            row[v + "_ms"] = (ratio - 1) * step * 1e3
            row[v + "_us"] = (ratio - 1) * step * 1e6 / LAYER_CALLS[key]
        table[key] = row

    print(f"# Lightning fit with NeuralDbgCallback ({time.strftime('%Y-%m-%d %H:%M')}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {rounds} rounds "
          f"of {steps}-step fits)")
    head = "| ratio to a plain fit (median) | " + " | ".join(MODELS[k] for k in models) + " |"
    rows = [head, "|---|" + "---:|" * len(models),
            "| plain step time (ms) | " + " | ".join(f"{table[k]['step_ms']:.2f}"
                                                   for k in models) + " |"]
    for v, label in variants.items():
        rows.append(f"| {label} | " + " | ".join(f"{table[k][v]:.2f}" for k in models) + " |")
        rows.append(f"| {label}: per step (ms) / per layer call (us) | " + " | ".join(
            f"{table[k][v + '_ms']:+.2f} / {table[k][v + '_us']:+.0f}" for k in models) + " |")
    if args.markdown:
        print("\n".join(rows))
    else:
        for line in rows[2:]:
            print(line.strip("|").replace(" | ", ": ", 1))
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
