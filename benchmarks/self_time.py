"""Where a watched step's time goes: the debugger's own CPU time, part by part.

    python benchmarks/self_time.py              # all models, default and gradients only
    python benchmarks/self_time.py --models mlp,deep --steps 100 --markdown
    python benchmarks/self_time.py --models nb-cnn,nb-mlp121   # the notebook's models
    python benchmarks/self_time.py --quick      # CI: one model, a few steps

`overhead.py` times whole steps, watched against plain; on a shared machine its ratios
move by 0.1 from one run to the next, so a change of a few percent does not show there.
This script times the debugger's own code from inside instead: every entry point the
engine runs during training (layer hooks, the optimizer-step hooks, the loss tap, the
step boundary's parts, detection scans, captures) is wrapped in `time.thread_time`, so
the time other processes take the core away is left out, and each part is charged only
its own time (a part called inside another is subtracted from it). The wrappers' own
cost is measured and taken off, call by call. Not in it: PyTorch's own cost of calling
the hooks (a module with hooks leaves its fast path), and what the debugger's reads do
to the caches for the training's own code; `overhead.py`'s ratios include both.

Per model and mode it prints, for each part, milliseconds per step: the median over
quiet steps (not sampled for the rich statistics), the median over sampled steps, and
the mean over all steps of the window (which also pays reference captures and detection
scans); then the total as a share of the plain step's CPU time, measured in the same
process. One thread (`--threads 1`) by default, so that CPU time is the step's time.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # the notebook models too
import overhead as ob  # the same models and training step

import neuraldbg_nb
from neuraldbg_nb.detect import detection
from neuraldbg_nb.live import watcher
from neuraldbg_nb.record import forward, optimizer, probe, reductions, replay

# part -> the functions charged to it: (owner, attribute name)
PARTS: dict[str, list[tuple[Any, str]]] = {
    "layer hooks (one reduction each)": [(forward.Forward, "post")],
    "rich statistics (sampled steps)": [(reductions, "rich_activation"),
                                        (forward.Forward, "reduce_rows")],
    "input batch and loss": [(probe.Probe, "_root_pre"), (probe.Probe, "_root_post"),
                             (probe.Probe, "_on_backward")],
    "gradient norms": [(reductions, "grouped_norms")],
    "layer hooks on and off (sampled steps)": [(probe.Probe, "_set_hooks")],
    "replay (anomalous steps)": [(replay.Replay, "run")],
    "transfer to the host": [(reductions.Scalars, "to_host")],
    "step row (trace, host-side)": [(probe.Probe, "_opt_pre"), (probe.Probe, "_opt_post")],
    "weight probe (after the update)": [(optimizer.Optimizers, "after_update")],
    "wake test and scan schedule": [(watcher.ScanSchedule, "due")],
    "detection scans": [(detection.Detection, "advance")],
    "captures": [(watcher.Watch, "_capture")],
    "rest of the step callback": [(watcher.Watch, "_on_step")],
}
TOTAL = "total"


@dataclass
class Meter:
    """Exclusive CPU time per part, for the current step."""

    now: dict[str, float] = field(default_factory=dict)
    stack: list[list[float]] = field(default_factory=list)  # [inner time] per open call
    cost: float = 0.0  # the wrapper's own time inside a measured interval

    def wrap(self, label: str, f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def timed(*a: Any, **k: Any) -> Any:
            self.stack.append([0.0])
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                spent = time.thread_time() - t - self.cost
                inner = self.stack.pop()[0]
                self.now[label] = self.now.get(label, 0.0) + spent - inner
                if self.stack:
                    self.stack[-1][0] += spent + self.cost
        return timed

    def calibrate(self) -> None:
        """The time a wrapped empty call reports: taken off every call."""
        empty = self.wrap("calibration", lambda: None)
        for _ in range(1000):
            empty()
        runs = []
        for _ in range(5):
            self.now.clear()
            for _ in range(2000):
                empty()
            runs.append(self.now["calibration"] / 2000)
        self.cost = max(0.0, statistics.median(runs))
        self.now.clear()

    def take(self) -> dict[str, float]:
        out, self.now = self.now, {}
        return out


def install(meter: Meter) -> Callable[[], None]:
    """Wrap every part's functions (before the watch is made, so its hooks bind the
    wrappers); returns the undo."""
    saved = []
    for label, targets in PARTS.items():
        for owner, name in targets:
            f = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            saved.append((owner, name, f))
            setattr(owner, name, meter.wrap(label, f))

    def undo() -> None:
        for owner, name, f in saved:
            setattr(owner, name, f)
    return undo


@dataclass
class Result:
    title: str
    plain_ms: float
    quiet: dict[str, float]
    sampled: dict[str, float]
    mean: dict[str, float]
    n_sampled: int
    n_steps: int


def plain_steps(b: ob.Bench, n: int, into: list[float]) -> None:
    """CPU time of `n` unwatched steps, appended to `into`."""
    for _ in range(n):
        t = time.thread_time()
        ob.step(b)
        into.append(time.thread_time() - t)


CHOICES = [*ob.MODELS, *compare.NOTEBOOK_MODELS]
"""`overhead.py`'s models and the notebook's (`compare.NOTEBOOK_MODELS`)."""


def measure(key: str, mode: dict[str, Any], steps: int, warmup: int, meter: Meter) -> Result:
    b = compare.fresh(key)
    for _ in range(3):
        ob.step(b)
    plain: list[float] = []
    plain_steps(b, max(5, steps // 8), plain)
    w = neuraldbg_nb.watch(b.model, report=False, **mode)
    with w:
        for _ in range(warmup):
            ob.step(b)
    meter.take()
    per: list[dict[str, float]] = []
    with w as run:
        for _ in range(steps):
            ob.step(b)
            part = meter.take()
            part[TOTAL] = sum(part.values())
            per.append(part)
    plain_steps(b, max(5, steps // 8), plain)  # before and after: the same model, later
    sampled_col = run.trace.scalar("sampled", run.trace.n_steps - steps, run.trace.n_steps)
    flags = [bool(s > 0) for s in sampled_col]

    def median(rows: list[dict[str, float]]) -> dict[str, float]:
        return {p: statistics.median(r.get(p, 0.0) for r in rows) * 1e3
                for p in [*PARTS, TOTAL]} if rows else {}

    return Result(title=b.title, plain_ms=statistics.median(plain) * 1e3,
                  quiet=median([r for r, s in zip(per, flags) if not s]),
                  sampled=median([r for r, s in zip(per, flags) if s]),
                  mean={p: statistics.mean(r.get(p, 0.0) for r in per) * 1e3
                        for p in [*PARTS, TOTAL]},
                  n_sampled=sum(flags), n_steps=steps)


def share(ms: dict[str, float], plain_ms: float) -> str:
    """The total as a share of the plain step; "-" where no step of the kind ran."""
    return f"{ms[TOTAL] / plain_ms:.1%}" if TOTAL in ms else "-"


def cell(r: Result, part: str) -> str:
    s = f"{r.sampled[part]:.2f}" if r.sampled else "-"
    return f"{r.quiet.get(part, 0.0):.2f} / {s} / {r.mean[part]:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run for CI (MLP, 12 steps)")
    ap.add_argument("--models", help=f"comma-separated, from {','.join(CHOICES)} "
                                     f"(default: {','.join(ob.DEFAULT_MODELS)}; quick: mlp)")
    ap.add_argument("--steps", type=int, help="measured steps (default 140, quick 12)")
    ap.add_argument("--warmup", type=int,
                    help="watched steps before them (default 10, quick 2): with the "
                         "defaults the window is steps 10-150, as in overhead.py")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = ap.parse_args(argv)
    keys = [k.strip() for k in (args.models or ("mlp" if args.quick else ",".join(ob.DEFAULT_MODELS)))
            .split(",") if k.strip()]
    unknown = [k for k in keys if k not in CHOICES]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(CHOICES)}")
    steps = args.steps or (12 if args.quick else 140)
    warmup = args.warmup if args.warmup is not None else (2 if args.quick else 10)
    if steps < 1 or warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ob.print_header("benchmarks/self_time.py", argv)
    print(f"steps {warmup}-{warmup + steps} of each run; AdamW lr 1e-3; thread CPU time")

    meter = Meter()
    meter.calibrate()
    print(f"wrapper cost taken off each call: {meter.cost * 1e6:.2f} us")
    print(flush=True)
    modes = {"neuraldbg default": {}, "gradients only": {"activations": False}}
    undo = install(meter)
    t0 = time.perf_counter()
    try:
        for title, mode in modes.items():
            results = {}
            for k in keys:
                results[k] = measure(k, mode, steps, warmup, meter)
                print(f"  {title}, {k}: done ({time.perf_counter() - t0:.0f} s so far)",
                      file=sys.stderr, flush=True)
            header = [f"{title}: ms/step, quiet / sampled / mean"] + [
                results[k].title for k in keys]
            rows = [[p] + [cell(results[k], p) for k in keys] for p in [*PARTS, TOTAL]]
            rows.append(["plain step (ms, median)"] + [f"{results[k].plain_ms:.1f}" for k in keys])
            rows.append(["total / plain step (quiet / mean)"] + [
                f"{share(results[k].quiet, results[k].plain_ms)} / "
                f"{share(results[k].mean, results[k].plain_ms)}" for k in keys])
            rows.append(["steps sampled / measured"] + [
                f"{results[k].n_sampled} / {results[k].n_steps}" for k in keys])
            print(ob.fmt_table(header, rows, args.markdown))
            print()
    finally:
        undo()
    print("quiet: median over steps without the rich statistics; sampled: median over "
          "steps with them; mean: over every step of the window, reference captures and "
          "detection scans included.")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; load average at end: {ob.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
