"""Panel at scale: how long the Python side takes to prepare an update and to re-classify,
and how large a message is, on long synthetic runs (no training needed).

    python benchmarks/panel_scale.py            # 1000 layers x 100,000 steps, 100 x 10,000
    python benchmarks/panel_scale.py --quick    # small sizes, for CI

The traces are made by hand: healthy log-normal noise per layer and one 1000x activation
jump in the later layers, recorded through the same Trace, detection and compaction as
a live run (trace_mb bounds the exact tail).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time

import numpy as np

from neuraldbg_nb import Thresholds
from neuraldbg_nb.detect import Detection, history_rows
from neuraldbg_nb.live.captures import CaptureStore
from neuraldbg_nb.notebook import panel_state
from neuraldbg_nb.report.run import Run
from neuraldbg_nb.trace import Trace

LOOKBACK = history_rows(Thresholds())


def synthetic_run(layers: int, steps: int, trace_mb: float, seed: int = 0) -> Run:
    rng = np.random.default_rng(seed)
    trace = Trace(max_tail_bytes=int(trace_mb * 2**20))  # as watch() makes it
    for j in range(layers):
        relu = j % 2 == 1
        trace.add_layer(f"blocks.{j // 2}.{'act' if relu else 'fc'}", "ReLU" if relu else "Linear",
                        "relu" if relu else "other", not relu)
    th = Thresholds()
    run = Run(trace, th, CaptureStore(0), Detection(th))
    budget = int(trace_mb * 2**20)
    chunk = 1000
    fault = int(steps * 0.7)
    for s0 in range(0, steps, chunk):
        n = min(chunk, steps - s0)
        grads = (10 ** rng.normal(-1, 0.1, (n, layers))).astype(np.float32)
        acts = (10 ** rng.normal(0, 0.05, (n, layers))).astype(np.float32)
        rows = np.arange(s0, s0 + n)
        acts[rows >= fault, layers // 2:] *= 1000
        for i in range(n):
            trace.append({"grad_norm": grads[i], "act_absmax": acts[i],
                          "param_norm": np.full(layers, 3.0, np.float32)},
                         {"loss": 1.0, "lr": 1e-3, "in_absmax": 3.0, "in_nonfinite": 0.0})
        run.detection.advance(trace)
        if trace.over(budget):
            trace.fit(budget, run.detection.steps_done - LOOKBACK)
    run.status = "finished"
    return run


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def message_bytes(state: dict, skip: tuple[str, ...] = ()) -> int:
    return sum(len(v) if isinstance(v, bytes) else len(json.dumps(v))
               for k, v in state.items() if k not in skip)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (CI)")
    ap.add_argument("--trace-mb", type=float, default=64)
    args = ap.parse_args()
    big = (100, 2000) if args.quick else (1000, 100_000)
    mid = (20, 2000) if args.quick else (100, 10_000)
    print(f"# panel at scale ({time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()})")
    print(f"command: python benchmarks/panel_scale.py{' --quick' if args.quick else ''}\n")
    print("| measure | size | result | target |")
    print("|---|---|---|---|")
    t0 = time.perf_counter()
    run = synthetic_run(*big, trace_mb=args.trace_mb)
    build = time.perf_counter() - t0
    run.status = "training"
    live = timed(lambda: panel_state.panel_state(run, with_values=False), 5)
    # the layer names go once, with the first message; a live update re-sends the rest
    size_live = message_bytes(panel_state.panel_state(run, with_values=False), skip=("layers",))
    run.status = "finished"
    size_done = message_bytes(panel_state.panel_state(run, with_values=True))
    label = f"{big[0]} layers x {big[1]:,} steps"
    print(f"| prepare a live update | {label} | {live:.1f} ms | < 50 ms |")
    print(f"| live message size | {label} | {size_live / 1000:.1f} KB | < 64 KB |")
    print(f"| final message (with tooltip numbers) | {label} | {size_done / 1000:.1f} KB | |")
    print(f"| trace memory | {label} | {run.trace.nbytes / 2**20:.1f} MB "
          f"({run.trace.full_from:,} steps compacted) | 1.5 x trace_mb={args.trace_mb:g} |")
    mrun = synthetic_run(*mid, trace_mb=args.trace_mb)
    mlabel = f"{mid[0]} layers x {mid[1]:,} steps"
    # the first move after training computes the trailing baselines (a fresh Run keeps
    # none); later moves re-grade them, each under other thresholds than the last
    fresh = lambda: Run(mrun.trace, mrun.thresholds, mrun.captures, mrun.detection)
    first = timed(lambda: fresh().reclassify(jump=50.0), 3)
    prepare = timed(lambda: fresh().prepare_reclassify(), 3)  # what the panel does at the end
    mrun.prepare_reclassify()
    moves = itertools.cycle([20.0, 30.0, 70.0, 100.0, 5.0])
    recl = timed(lambda: mrun.reclassify(jump=next(moves)), 5)
    print(f"| re-classify (slider) | {mlabel} | {recl:.0f} ms | < 200 ms |")
    print(f"| re-classify (first move, nothing prepared) | {mlabel} | {first:.0f} ms | |")
    print(f"| prepare the sliders (the panel, when training ends) | {mlabel} | "
          f"{prepare:.0f} ms | |")
    print(f"| baselines kept for the sliders | {mlabel} | "
          f"{mrun._baselines.nbytes / 2**20:.1f} MB | |")
    per_cell = mrun.trace.nbytes / (mid[0] * mid[1])
    print(f"| trace bytes per layer-step (exact) | {mid[0]} layers | {per_cell:.1f} B | |")
    print(f"\n(building the {label} trace took {build:.1f} s)")


if __name__ == "__main__":
    main()
