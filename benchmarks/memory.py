"""Memory: the capture budget under a training that keeps firing, and the trace bound.

    python benchmarks/memory.py          # 300 steps, 4 MB activations; 50 x 1,000,000 steps
    python benchmarks/memory.py --quick  # CI: 40 steps, 1 MB activations; small traces

1. Capture budget. A real training (SGD, a 7-layer MLP of width 256 on a batch of 4096:
   every activation is 4 MB, the weights are small; --quick: width 128, batch 2048) whose
   first layer's weights are blown up 1000x for one step every 30 steps (then restored
   from a copy, and that step's update skipped), so activation jumps fire in every later
   layer again and again and each one copies that layer's input, output, weights and
   gradients into the capture store. Each configuration runs in its own subprocess:
   plain (no watch), `capture_mb=0`, 64 and (full mode) 16 and 256, plus a control pair
   (0 and 256) run with glibc's MALLOC_MMAP_THRESHOLD_ fixed at 128 KiB, which separates
   what the store holds from what the allocator keeps; each baseline (capture_mb=0) runs
   in three children and the median one is used (`BASELINE_RUNS`; --quick: one). The child reports its
   peak RSS (`ru_maxrss` / VmHWM, the kernel's high-water mark of resident memory, which
   includes the interpreter, torch and the training itself) and, from a wrapper around its
   `CaptureStore.add`, the store's accounted bytes after every add, the bytes its tensors
   really hold (distinct storages) and the largest copy one add made. The claim checked: the store's bytes never exceed the budget, and peak RSS
   grows beyond the `capture_mb=0` run by at most the budget plus a slack: the largest
   copy one add made (kept in the slack, although the store makes room before it
   copies), one step's layer outputs (watch() holds them to the end of sampled,
   reference and unusual steps when capture_mb > 0) and `SLACK_FIXED`.

2. Trace bound. Synthetic traces recorded the way `benchmarks/panel_scale.py` makes
   them (healthy log-normal noise per layer, one 1000x activation jump in the later
   layers at 70% of the run), one `Trace.append` per step through the same detection and
   compaction as a live run: after every step, when the exact tail outgrows `trace_mb`
   (default 64), detection reads it and `Trace.fit` compacts it, as `watch()` does.
   Reported: the trace's accounted bytes (`Trace.nbytes`, exact tail + compacted history,
   its maximum after any step) against the stated bound 1.5 x `trace_mb`; the bytes its
   arrays really allocate (spare row capacity of the tail included); the bytes per
   layer-step of the exact tail; and the growth of the child's peak RSS over its RSS
   before the first step. Each size runs in its own subprocess. Appending row by row is
   fast enough (about 30-45 s for 50 layers x 1,000,000 steps on 2 cores), so no shortcut
   around the Trace API is taken. --quick uses trace_mb=16 and just enough steps for one
   compaction.

Children run one at a time (--quick: two, with one torch thread each); `--jobs N` changes
that. The script exits 0 whatever it finds: its last line says whether the claims held.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 2**20
SLACK_FIXED = 16 * MB
"""Allowance for run-to-run noise of peak RSS, on top of the largest single copy (an add
copies the tensors before it evicts) and one step's layer outputs (held to the end of
sampled, reference and unusual steps for captures)."""


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _peak_rss() -> int:
    """Peak resident memory of this process in bytes (ru_maxrss is KiB on Linux)."""
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, _status_kb("VmHWM")) * 1024


# -- 1. capture budget (child) -------------------------------------------------------------
def _copy_size(store, tensors: dict) -> int:
    """Bytes `CaptureStore.add` will copy for `tensors` (its strided sampling included)."""
    per_tensor = max(store.budget // 4, 1)
    total = 0
    for t in tensors.values():
        if t is None:
            continue
        size = t.numel() * t.element_size()
        if size > per_tensor:
            stride = math.ceil(size / per_tensor)
            size = math.ceil(t.numel() / stride) * t.element_size()
        total += size
    return total


def _held_bytes(store) -> int:
    """Bytes of the distinct storages behind the kept captures."""
    seen: dict[int, int] = {}
    for cap in store:
        for t in cap.tensors.values():
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def train_child(config: str, steps: int, width: int, batch: int, every: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import neuraldbg_nb
    from neuraldbg_nb.report.captures import REFERENCE

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(64, 10, generator=g)
    data = []
    for _ in range(4):
        x = torch.randn(batch, 64, generator=g)
        data.append((x, (x @ teacher).argmax(1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = model[0]
    blowups = set(range(every, steps, every))
    stats = {"adds": 0, "copies": 0, "max_store": 0, "max_held": 0, "max_copy": 0}

    def watched_add(store, add):
        def wrapper(step, layer, reason, tensors, shared=None):
            copies = not (store.budget == 0 or store.has(step, layer)
                          or (reason == REFERENCE and store.nbytes >= store.budget))
            if copies:
                stats["copies"] += 1
                stats["max_copy"] = max(stats["max_copy"], _copy_size(store, tensors))
            out = add(step, layer, reason, tensors, shared)
            stats["adds"] += 1
            stats["max_store"] = max(stats["max_store"], store.nbytes)
            stats["max_held"] = max(stats["max_held"], _held_bytes(store))
            return out
        return wrapper

    # bytes of one step's layer outputs: what watch() (capture_mb > 0) holds to the step end
    outputs: list = []
    hooks = [m.register_forward_hook(lambda m, i, o: outputs.append(o)) for m in model]
    with torch.no_grad():
        model(data[0][0])
    for h in hooks:
        h.remove()
    step_outputs = sum({o.untyped_storage().data_ptr(): o.untyped_storage().nbytes()
                        for o in outputs}.values())
    outputs.clear()
    rss_before = _status_kb("VmRSS") * 1024
    if config == "plain":
        ctx: contextlib.AbstractContextManager = contextlib.nullcontext(None)
        mb = None
    else:
        mb = float(config)
        ctx = neuraldbg_nb.watch(model, capture_mb=mb, report=False)
    started = time.perf_counter()
    with ctx as run:
        if run is not None:
            run.captures.add = watched_add(run.captures, run.captures.add)
        for step in range(steps):
            x, y = data[step % len(data)]
            saved = None
            if step in blowups:
                saved = first.weight.detach().clone()
                with torch.no_grad():
                    first.weight.mul_(1000)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            if saved is not None:
                opt.zero_grad(set_to_none=True)  # skip the corrupted step's update
            opt.step()
            if saved is not None:
                with torch.no_grad():
                    first.weight.copy_(saved)
            if run is not None:  # between steps too (the wrapper sees every add already)
                stats["max_store"] = max(stats["max_store"], run.captures.nbytes)
    out = {"config": config, "capture_mb": mb, "steps": steps, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "blowups": len(blowups),
           "seconds": time.perf_counter() - started, "rss_before": rss_before,
           "step_outputs": step_outputs,
           "peak_rss": _peak_rss(), "rss_end": _status_kb("VmRSS") * 1024}
    if run is not None:
        store = run.captures
        out.update(stats, budget=store.budget, store_end=store.nbytes, kept=len(store),
                   dropped=store.dropped, held_end=_held_bytes(store),
                   events=sum(e.severity != "info" for e in run.events))
    return out


# -- 2. trace bound (child) ----------------------------------------------------------------
def trace_child(layers: int, steps: int, trace_mb: float) -> dict:
    import numpy as np

    from neuraldbg_nb import Thresholds
    from neuraldbg_nb.detect import Detection, history_rows
    from neuraldbg_nb.trace import Trace

    rng = np.random.default_rng(0)
    budget = int(trace_mb * MB)
    trace = Trace(max_tail_bytes=budget)  # as watch() makes it
    for j in range(layers):
        relu = j % 2 == 1
        trace.add_layer(f"blocks.{j // 2}.{'act' if relu else 'fc'}",
                        "ReLU" if relu else "Linear", "relu" if relu else "other", not relu)
    th = Thresholds()
    detection = Detection(th)
    lookback = history_rows(th)
    if steps == 0:  # enough steps for the tail to fill and be compacted once
        steps = int(1.2 * budget / trace.row_nbytes) + 1000
    fault = int(steps * 0.7)
    max_nbytes = max_alloc = fits = 0
    rss_before = _status_kb("VmRSS") * 1024
    started = time.perf_counter()
    chunk = 1000
    for s0 in range(0, steps, chunk):
        n = min(chunk, steps - s0)
        grads = (10 ** rng.normal(-1, 0.1, (n, layers))).astype(np.float32)
        acts = (10 ** rng.normal(0, 0.05, (n, layers))).astype(np.float32)
        acts[np.arange(s0, s0 + n) >= fault, layers // 2:] *= 1000
        weights = np.full(layers, 3.0, np.float32)
        for i in range(n):
            trace.append({"grad_norm": grads[i], "act_absmax": acts[i], "param_norm": weights},
                         {"loss": 1.0, "lr": 1e-3, "in_absmax": 3.0, "in_nonfinite": 0.0})
            if trace.over(budget):  # as watch()'s _bound_trace, after every step
                detection.advance(trace)
                trace.fit(budget, detection.steps_done - lookback)
                fits += 1
                max_alloc = max(max_alloc, trace.allocated_nbytes)
            max_nbytes = max(max_nbytes, trace.nbytes)
        detection.advance(trace)
        # the tail's capacity only grows, so a growth is still there at the chunk's end
        max_alloc = max(max_alloc, trace.allocated_nbytes)
    max_alloc = max(max_alloc, trace.allocated_nbytes)
    return {"layers": layers, "steps": steps, "trace_mb": trace_mb, "seconds":
            time.perf_counter() - started, "max_nbytes": max_nbytes, "end_nbytes": trace.nbytes,
            "tail_nbytes": trace.tail_nbytes, "tail_rows": trace.n_steps - trace.full_from,
            "history_rows": len(trace.history("loss")[0]) - (trace.n_steps - trace.full_from),
            "row_nbytes": trace.row_nbytes, "compacted": trace.full_from, "fits": fits,
            "max_alloc": max_alloc, "rss_before": rss_before, "peak_rss": _peak_rss(),
            "events": len(detection.events)}


# -- parent --------------------------------------------------------------------------------
def _child(*args: str, env: dict | None = None) -> dict:
    env = {**os.environ, **CHILD_ENV, **(env or {})}
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                          text=True, check=False, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


POOL = ThreadPoolExecutor(max_workers=1)
"""Runs the children; `--jobs N` runs N at a time (each measures its own peak RSS, so only
the times are affected; each child then gets cpu_count / N torch threads)."""
CHILD_ENV: dict[str, str] = {}


def _mb(x: float) -> str:
    return f"{x / MB:.1f}"


FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "131072"}
"""glibc setting for the control rows: every allocation of 128 KiB or more is its own
mmap, given back to the system when freed (the default threshold rises to the size of
the largest block freed, up to 32 MiB, after which such blocks come from the heap, where
freed ones can stay with the process)."""


BASELINES = ("0", "0+mmap")
BASELINE_RUNS = 3
"""Children run for each baseline row. With glibc's default settings the peak RSS of the
same `capture_mb=0` child varied from 384 to 436 MB in six runs (and the 256 MB child
from 687 to 729 MB), so one baseline child could turn the growth column's verdict either
way; the row uses the median of three, and prints all three. With a fixed mmap threshold
both vary by less than 1 MB."""


def capture_table(configs: list[str], steps: int, width: int, batch: int, every: int,
                  baseline_runs: int = BASELINE_RUNS) -> dict[str, bool]:
    """`configs`: "plain", or a capture_mb, with "+mmap" for the fixed-threshold control
    (compared with the "0+mmap" row rather than "0"); `baseline_runs`: children per
    baseline row (`BASELINE_RUNS`; one in the quick mode, which checks that the script
    runs, not its verdict). Returns whether each claim held:
    "store" (its bytes within the budget), "rss" and "rss+mmap" (peak RSS growth within
    budget + slack with glibc's default settings, and with the fixed threshold)."""
    def one(c: str) -> dict:
        mb, _, env = c.partition("+")
        r = _child("train", mb, str(steps), str(width), str(batch), str(every),
                   env=FIXED_MMAP if env else None)
        return {**r, "label": c}

    runs = [c for c in configs for _ in range(baseline_runs if c in BASELINES else 1)]
    by_label: dict[str, list[dict]] = {}
    for r in POOL.map(one, runs):
        by_label.setdefault(r["label"], []).append(r)
    spread = {c: sorted(r["peak_rss"] for r in rs) for c, rs in by_label.items()}
    # a baseline is its median child (the others only show how far it varies)
    rows = [sorted(by_label[c], key=lambda r: r["peak_rss"])[len(by_label[c]) // 2]
            for c in configs]
    base = {r["label"]: r for r in rows}
    act = batch * width * 4
    print(f"Training: MLP 64-{width}x3-10, batch {batch} (each activation {_mb(act)} MB), "
          f"SGD (torch {rows[0]['torch']}, {rows[0]['threads']} threads), {steps} steps, "
          f"first layer's weights x1000 for one step every {every} "
          f"steps ({rows[0]['blowups']} blow-ups); one subprocess per row. MB = 2^20 bytes.\n")
    print("| run | events (warn+err) | captures kept / dropped | store bytes: end / max | "
          "tensor bytes held: max | largest copy | peak RSS | peak RSS - capture_mb=0 | "
          "budget + slack | within |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    ok = {"store": True, "rss": True, "rss+mmap": True}
    for r in rows:
        label = r["label"]
        mmap = label.endswith("+mmap")
        ref = base["0+mmap" if mmap else "0"]
        growth = r["peak_rss"] - ref["peak_rss"]
        name = ("plain (no watch)" if label == "plain" else
                f"capture_mb={label.split('+')[0]}" + (", fixed mmap threshold" if mmap else ""))
        if label == "plain":
            print(f"| {name} | | | | | | {_mb(r['peak_rss'])} MB | {_mb(growth)} MB | | |")
            continue
        budget = r["budget"]
        allowed = budget + r["max_copy"] + r["step_outputs"] + SLACK_FIXED
        held_ok = r["max_store"] <= budget and r["max_held"] <= budget
        within = held_ok and growth <= allowed
        if r is ref:
            runs_mb = ", ".join(_mb(x) for x in spread[label])
            verdict = (f"(baseline: median of {len(spread[label])} children, {runs_mb} MB)"
                       if len(spread[label]) > 1 else "(baseline)")
        else:
            ok["store"] &= held_ok
            ok["rss+mmap" if mmap else "rss"] &= growth <= allowed
            verdict = "yes" if within else ("NO: store over budget" if not held_ok
                                            else f"NO: RSS {growth / budget:.2f} x budget")
        print(f"| {name} | {r['events']} | {r['kept']} / {r['dropped']} | "
              f"{_mb(r['store_end'])} / {_mb(r['max_store'])} MB | {_mb(r['max_held'])} MB | "
              f"{_mb(r['max_copy'])} MB | {_mb(r['peak_rss'])} MB | {_mb(growth)} MB | "
              f"{_mb(allowed) + ' MB' if r is not ref else ''} | {verdict} |")
    print(f"\nslack = the largest copy one add made (kept although the store makes room before it copies) + one "
          f"step's layer outputs ({_mb(rows[0]['step_outputs'])} MB: with capture_mb > 0 they "
          f"are held to the end of sampled, reference and unusual steps) + "
          f"{SLACK_FIXED // MB} MB."
          + (" Rows marked 'fixed mmap threshold' ran with MALLOC_MMAP_THRESHOLD_=131072 "
             "and are compared with the capture_mb=0 row run so."
             if any(c.endswith("+mmap") for c in configs) else "")
          + " Seconds per run: " + ", ".join(f"{r['label']} {r['seconds']:.0f}" for r in rows)
          + ".\n")
    return ok


def trace_table(sizes: list[tuple[int, int]], trace_mb: float) -> bool:
    bound = 1.5 * trace_mb * MB
    print(f"Trace (synthetic, trace_mb={trace_mb:g}; bound 1.5 x trace_mb = {_mb(bound)} MB; "
          f"one subprocess per row):\n")
    print("| layers x steps | bytes per layer-step (exact tail) | trace bytes: max / end "
          "(tail + history) | within 1.5 x trace_mb | allocated (spare capacity incl.) | "
          "peak RSS growth | steps compacted | build time |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    ok = True
    runs = list(POOL.map(lambda size: _child("trace", str(size[0]), str(size[1]),
                                              str(trace_mb)), sizes))
    for (layers, _), r in zip(sizes, runs):
        steps = r["steps"]
        within = r["max_nbytes"] <= bound
        ok &= within
        print(f"| {layers} x {steps:,} | {r['row_nbytes'] / layers:.1f} B | "
              f"{_mb(r['max_nbytes'])} / {_mb(r['end_nbytes'])} MB | "
              f"{'yes' if within else 'NO'} | {_mb(r['max_alloc'])} MB | "
              f"{_mb(r['peak_rss'] - r['rss_before'])} MB | {r['compacted']:,} "
              f"({r['fits']} compactions) | {r['seconds']:.0f} s |")
    print()
    return ok


def _said(held: bool) -> str:
    return "yes" if held else "NO"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, *args = sys.argv[2:]
        if kind == "train":
            out = train_child(args[0], *map(int, args[1:]))
        else:
            out = trace_child(int(args[0]), int(args[1]), float(args[2]))
        print(json.dumps(out))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (CI)")
    ap.add_argument("--trace-mb", type=float, default=None,
                    help="trace_mb of the trace rows (default: 64, the watch() default; "
                         "16 with --quick)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="children run at once (default: 2 with --quick, else 1)")
    args = ap.parse_args()
    jobs = args.jobs or (2 if args.quick else 1)
    trace_mb = args.trace_mb or (16 if args.quick else 64)
    global POOL
    POOL = ThreadPoolExecutor(max_workers=jobs)
    if jobs > 1:
        CHILD_ENV["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    if args.quick:
        configs = ["plain", "0", "64"]
        train = (40, 128, 2048, 15)
        sizes = [(50, 0), (100, 0)]  # 0: 1.2 x the steps that fill the exact tail
    else:
        configs = ["plain", "0", "16", "64", "256", "0+mmap", "256+mmap"]
        train = (300, 256, 4096, 30)
        sizes = [(50, 1_000_000), (100, 200_000)]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# memory ({now}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()})")
    print(f"command: python benchmarks/memory.py{' --quick' if args.quick else ''} "
          f"(children {jobs} at a time"
          + (f", {CHILD_ENV['OMP_NUM_THREADS']} torch threads each" if jobs > 1 else "")
          + ")\n")
    print("## Capture budget: peak RSS\n")
    cap = capture_table(configs, *train, baseline_runs=1 if args.quick else BASELINE_RUNS)
    print("## Trace bound\n")
    trace_ok = trace_table(sizes, trace_mb)
    print(f"capture store within its budget: {_said(cap['store'])}; peak RSS growth within "
          f"budget + slack: {_said(cap['rss'])} with glibc's defaults"
          + (f", {_said(cap['rss+mmap'])} with a fixed mmap threshold"
             if any(c.endswith("+mmap") for c in configs) else "")
          + f"; trace within 1.5 x trace_mb: {_said(trace_ok)}")


if __name__ == "__main__":
    main()
