"""Overhead of watching a training: step time watched / step time plain.

    python benchmarks/overhead.py                 # full: 12 rounds, quads of 5-step blocks
    python benchmarks/overhead.py --quick         # CI: 2 rounds of 2-step blocks, under a minute
    python benchmarks/overhead.py --models mlp,cnn --rounds 20 --steps 5 --markdown
    python benchmarks/overhead.py --threads 1 --clock cpu   # steadier on a shared machine

Everything runs in one process. Every configuration trains a copy of its own of the
model (the same weights, batches and AdamW optimizer), so that no run sees another
loop's updates and every copy stays in the same early, healthy stretch of training (one
model shared by all the loops would train for all of them, and the MLP's middle layers
die after about 1,200 such steps: the default watch would then time its own error events
and captures). Its plain blocks train that same copy (see `main`: two copies made alike
train at speeds up to 3% apart). Each round times every configuration once, in an order
rotated from round to round, as a quad of `--steps`-step blocks: plain, configuration,
configuration, plain. The round's ratio for that configuration is its two blocks' time
over the two plain blocks around them
(paired: a slow minute of the shared machine hits both sides of the ratio, where an
unpaired ratio of medians takes it whole), and the ratio printed is the median over
rounds. The `plain vs plain (control)` row times the plain loop against itself the same
way: how far it is from 1.00, and the spread of its rounds, is the noise floor of the
run.

Watched configurations keep one `watch()` object for the whole benchmark and re-enter it
for each block (a Watch is re-enterable and continues its run), so the run goes on
across rounds as one training: reference captures stay sparse (steps 0, 1, 2, 4, 8, 16,
...) and the warm-up covers the first ones. Only the training steps are timed, not
entering or leaving the block.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import hashlib
import inspect
import math
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import neuraldbg_nb
from neuraldbg_nb.live import selfcost
from neuraldbg_nb.record import reductions
from neuraldbg_nb.record.layers import is_nonnegative

# -- models --------------------------------------------------------------------------


@dataclass
class Bench:
    key: str
    title: str
    model: nn.Module
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    opt: torch.optim.Optimizer = field(init=False)
    _i: int = 0

    def __post_init__(self) -> None:
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._i = (self._i + 1) % len(self.batches)
        return self.batches[self._i]


def _teacher(shape: tuple[int, ...], classes: int, n: int = 16
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable task: labels from a fixed random linear teacher, n distinct batches."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(math.prod(shape[1:]), classes, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(*shape, generator=g)
        out.append((x, (x.reshape(shape[0], -1) @ w).argmax(1)))
    return out


def _relu_mlp() -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(512, 10))


def make_mlp() -> Bench:
    """He-initialised, as a deep ReLU stack is meant to be: with PyTorch's default
    `nn.Linear` init (`make_mlp_dying`) 41-49% of the last layers' units are dead at step 0
    and up to 73% by step 130, and the default watch spends the run reporting it (11
    warnings in 200 steps, their captures and detection scans), which is the cost of a
    failing run, not of leaving the debugger on."""
    model = _relu_mlp()
    for m in model:
        if isinstance(m, nn.Linear) and m.out_features == 512:
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return Bench("mlp", "MLP 8x512", model, _teacher((128, 512), 10),
                 nn.functional.cross_entropy)


def make_mlp_dying() -> Bench:
    """The same MLP with PyTorch's default init, whose ReLU units die (see `make_mlp`):
    what watching a run that keeps warning costs."""
    return Bench("mlp-dying", "MLP 8x512 dying", _relu_mlp(), _teacher((128, 512), 10),
                 nn.functional.cross_entropy)


def make_cnn() -> Bench:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(
        *block(3, 32), *block(32, 32), nn.MaxPool2d(2),
        *block(32, 64), *block(64, 64), nn.MaxPool2d(2),
        *block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    return Bench("cnn", "CNN+BN 32x32", model, _teacher((32, 3, 32, 32), 10),
                 nn.functional.cross_entropy)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 1024, d: int = 192, layers: int = 4, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = self.encoder(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def make_transformer() -> Bench:
    vocab, seq, batch = 1024, 64, 16
    data = []
    for _ in range(4):
        t = torch.randint(0, vocab, (batch, seq + 1))
        data.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))

    def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    return Bench("transformer", "transformer 4xd192", TinyLM(vocab, seq=seq), data, loss_fn)


class Residual(nn.Module):
    """x + relu(fc(x)): a plain 100-layer ReLU stack does not train (chance loss, a flood
    of legitimate warnings and captures), a residual one does."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()
        nn.init.normal_(self.fc.weight, std=0.1 / width**0.5)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


def make_deep() -> Bench:
    model = nn.Sequential(*[Residual(128) for _ in range(100)], nn.Linear(128, 10))
    return Bench("deep", "MLP 100x128", model, _teacher((128, 128), 10),
                 nn.functional.cross_entropy)


def make_cnn_channels_last() -> Bench:
    """The same CNN in the channels-last layout (weights and batches), which many users
    pick for faster convolutions: every conv output is then a tensor that is not
    contiguous, on which PyTorch's reductions can take slow paths."""
    b = make_cnn()
    b.model.to(memory_format=torch.channels_last)
    return Bench("cnn-cl", "CNN+BN channels-last", b.model,
                 [(x.contiguous(memory_format=torch.channels_last), y) for x, y in b.batches],
                 b.loss_fn)


MODELS: dict[str, Callable[[], Bench]] = {
    "mlp": make_mlp, "cnn": make_cnn, "transformer": make_transformer, "deep": make_deep,
    "cnn-cl": make_cnn_channels_last, "mlp-dying": make_mlp_dying}
DEFAULT_MODELS = ("mlp", "cnn", "transformer", "deep")
"""Run when no `--models` is given: a fully connected net, a CNN, a transformer and a deep
stack of small layers."""


def fresh(key: str) -> Bench:
    """A new copy of benchmark `key`, the same weights and batches every time."""
    torch.manual_seed(0)
    return MODELS[key]()

# -- configurations ------------------------------------------------------------------


def step(b: Bench) -> torch.Tensor:
    x, y = b.batch()
    b.opt.zero_grad(set_to_none=True)
    loss = b.loss_fn(b.model(x), y)
    loss.backward()
    b.opt.step()
    return loss


def step_item_norms(b: Bench) -> dict[str, float]:
    """A hand-written gradient monitor: one `.item()` per parameter after backward."""
    x, y = b.batch()
    b.opt.zero_grad(set_to_none=True)
    loss = b.loss_fn(b.model(x), y)
    loss.backward()
    norms: dict[str, float] = {}
    for name, p in b.model.named_parameters():
        if p.grad is not None:
            norms[name] = p.grad.norm().item()
    b.opt.step()
    return norms


def step_gradient_floor(b: Bench) -> list[float]:
    """The least a gradient watch can cost (the floor of its gradients-only mode): one fused read
    of every gradient after backward (`torch._foreach_norm`) and one transfer of the
    norms to the host."""
    x, y = b.batch()
    b.opt.zero_grad(set_to_none=True)
    loss = b.loss_fn(b.model(x), y)
    loss.backward()
    grads = [p.grad for p in b.model.parameters() if p.grad is not None]
    norms = torch.stack(torch._foreach_norm(grads)).tolist()
    b.opt.step()
    return norms


def _nothing(module: nn.Module, args: tuple, output: object) -> None:
    return None


@contextlib.contextmanager
def empty_hooks(b: Bench) -> Iterator[None]:
    """A forward hook that does nothing on every leaf module (every layer the watch
    hooks, and the activations): what PyTorch charges for calling hooks at all (a module
    with hooks leaves its fast path), before any statistics are taken."""
    handles = [m.register_forward_hook(_nothing) for m in b.model.modules()
               if next(m.children(), None) is None]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def reducing_hooks(b: Bench) -> Iterator[None]:
    """A forward hook on every leaf module that takes the reduction the watch takes of
    its output and keeps the values: `reductions.min_max` (`amin` and `amax`, or `aminmax` on
    small outputs), `amax` alone where the output cannot be negative, none for a ReLU
    (the watch derives its max from its input's). The least a per-step activation summary
    that never misses a NaN can cost, with no bookkeeping, no input batch, weight or loss
    summaries and no detection. With `step_gradient_floor`, a floor for the default
    mode."""
    def reduce(module: nn.Module, args: tuple, output: object) -> None:
        if type(output) is torch.Tensor and output.is_floating_point() and output.numel():
            y = output.detach()
            kept.append(y.amax() if is_nonnegative(module) else reductions.min_max(y))

    kept: list[object] = []
    handles = [m.register_forward_hook(reduce) for m in b.model.modules()
               if next(m.children(), None) is None and type(m) is not nn.ReLU]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _watch_params() -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(neuraldbg_nb.watch).parameters)


def gradients_only_kwargs() -> tuple[dict[str, object], str | None]:
    """watch() arguments that turn activation statistics off, and a footnote when the
    API has no such mode and the benchmark falls back to a very large sample_every."""
    params = _watch_params()
    if "activations" in params:
        return {"activations": False}, None
    if "gradients_only" in params:
        return {"gradients_only": True}, None
    return {"sample_every": 10**9}, (
        "watch() has no gradients-only mode: this row is watch(model, sample_every=10**9), "
        "i.e. no sampled (rich) activation statistics after the first step; the per-step "
        "cheap path (one aminmax per layer output, input-batch stats, weight norms) and "
        "detection still run.")


def every_step_kwargs() -> dict[str, object]:
    """Rich activation statistics on every step: sample_every=1, and no overhead budget
    that would stretch the interval (where watch() has one)."""
    kw: dict[str, object] = {"sample_every": 1}
    if "overhead" in _watch_params():
        kw["overhead"] = None
    return kw


def call_text(kw: dict[str, object]) -> str:
    return "watch(model" + "".join(f", {k}={v!r}" for k, v in kw.items()) + ")"


@dataclass
class Config:
    key: str
    label: str
    step: Callable[[Bench], object]
    context: Callable[[Bench], contextlib.AbstractContextManager] | None = None
    watch_kwargs: dict[str, object] | None = None
    env: dict[str, str] | None = None  # environment the watch is made under
    runs: dict[str, neuraldbg_nb.Run] = field(default_factory=dict)
    watches: dict[str, object] = field(default_factory=dict)

    def enter(self, b: Bench) -> contextlib.AbstractContextManager:
        if self.watch_kwargs is not None:
            w = self.watches.get(b.key)
            if w is None:
                saved = {k: os.environ.get(k) for k in self.env or {}}
                os.environ.update(self.env or {})
                try:
                    w = self.watches[b.key] = neuraldbg_nb.watch(b.model, report=False,
                                                                 **self.watch_kwargs)
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
            return w
        if self.context is not None:
            return self.context(b)
        return contextlib.nullcontext()


@contextlib.contextmanager
def anomaly(_: Bench) -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly():
            yield


def configs() -> tuple[list[Config], list[str]]:
    grad_kw, grad_note = gradients_only_kwargs()
    notes = []
    grad_label = "neuraldbg gradients only"
    if grad_note:
        grad_label += " [1]"
        notes.append(f"[1] {grad_note}")
    return [
        Config("plain", "plain", step),
        Config("control", "plain vs plain (control)", step),
        Config("default", "neuraldbg default", step, watch_kwargs={}),
        Config("grads", grad_label, step, watch_kwargs=grad_kw),
        Config("budget", "neuraldbg overhead=0.02 (adaptive)", step,
               watch_kwargs={"overhead": 0.02}),
        Config("sample1", "neuraldbg sample_every=1", step, watch_kwargs=every_step_kwargs()),
        Config("hooks_every", "neuraldbg layer hooks on every step", step,
               watch_kwargs={"layer_hooks": "every"}),
        Config("floor", "floor: one fused gradient read", step_gradient_floor),
        Config("floor_hooks", "floor: gradient read + empty layer hooks", step_gradient_floor,
               context=empty_hooks),
        Config("floor_reduce", "floor: gradient read + one min/max per layer output",
               step_gradient_floor, context=reducing_hooks),
        Config("item", "ref: per-param .item() grad norms", step_item_norms),
        Config("anomaly", "ref: torch.autograd.detect_anomaly()", step, context=anomaly),
    ], notes


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
"""`wall`: elapsed time, what a user waits for. `cpu`: the CPU time of this process (all
its threads), which leaves out the time other jobs on a shared machine take the cores
away; with `--threads 1` it equals the wall time of an unshared run and is much steadier.
(With several threads it under-weighs the debugger's single-threaded Python against
PyTorch's parallel kernels, so use it with `--threads 1`.)"""


def settle(full: bool = False) -> None:
    """Collect the garbage of the blocks before, outside the timing: before each block
    the young generations, where what a block leaves lies; at the start of each round
    everything (`full`). A full collection walks every object of the process, about
    0.3 s once PyTorch's compiler modules are imported (its optimizers import them): one
    per block spent most of a short run collecting."""
    gc.collect() if full else gc.collect(1)


def run_block(b: Bench, c: Config, steps: int, clock: Callable[[], float]) -> float:
    """Seconds per step for `steps` steps of config c (inside its context, not counting
    entering or leaving it)."""
    settle()
    with c.enter(b) as run:
        if run is not None:
            c.runs[b.key] = run
        step_fn = c.step
        t0 = clock()
        for _ in range(steps):
            step_fn(b)
        t1 = clock()
    return (t1 - t0) / steps


def _held(run: neuraldbg_nb.Run | None) -> str:
    """Whether a run with a budget held it, as the run judged it (`SelfCost.budget_note`)."""
    cost = run.cost if run is not None else None
    if cost is None or cost.recorded < selfcost.CHECK_EVERY:
        return "not judged (too few steps)"
    return "no (the run said so)" if cost.note else "yes"


def _quartiles(xs: list[float]) -> str:
    """The middle half of a configuration's per-round ratios, as "low-high"."""
    if len(xs) < 2:
        return f"{xs[0]:.2f}" if xs else "n/a"
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return f"{q[0]:.2f}-{q[2]:.2f}"


# -- main ----------------------------------------------------------------------------


def source_digest(package: ModuleType = neuraldbg_nb) -> str:
    """A short hash of the engine's sources (of `package`: another checkout's, in
    `compare.py`), to tell which code a table measured."""
    h = hashlib.sha1()
    root = Path(package.__file__).parent
    for f in sorted(root.rglob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def print_header(script: str, argv: list[str] | None) -> None:
    """What a table needs to be read later: the command, the machine, the code, the date
    and the load."""
    cmd = "python " + " ".join(shlex.quote(a) for a in (
        sys.argv if argv is None else [script, *argv]))
    print(f"command: {cmd}")
    print(f"machine: {platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"python {platform.python_version()}, neuraldbg_nb {neuraldbg_nb.__version__} "
          f"(sources sha1 {source_digest()})")
    print(f"date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"load average at start: {load()} (other processes on the machine add noise)")


def fmt_table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(
        (s.ljust(w) if i == 0 else s.rjust(w)) for i, (s, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run for CI (2 rounds, 2-step blocks)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help=f"comma-separated, from {','.join(MODELS)} "
                         f"(default: {','.join(DEFAULT_MODELS)})")
    ap.add_argument("--configs", help="comma-separated configuration keys to time (default: "
                                      "all); 'control', the noise floor, always runs")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 12, quick 2)")
    ap.add_argument("--steps", type=int, help="steps per timed block (default 5, quick 2); a "
                                               "round times 4 blocks per config")
    ap.add_argument("--warmup", type=int, help="untimed steps per config first (default 10, quick 1)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall (default): elapsed time; cpu: this process's CPU time, "
                         "steadier on a shared machine (use with --threads 1)")
    args = ap.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        print("note: --clock cpu with several threads under-weighs single-threaded "
              "overhead; --threads 1 gives comparable ratios", file=sys.stderr)
    clock = CLOCKS[args.clock]
    rounds = args.rounds or (2 if args.quick else 12)
    steps = args.steps or (2 if args.quick else 5)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 10)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")

    torch.set_num_threads(args.threads)
    # the budget's note is expected where the per-step work exceeds it: a row below says
    # which runs gave it, instead of a warning in the middle of the progress lines
    warnings.filterwarnings("ignore", message="neuraldbg: the overhead budget")
    md = args.markdown
    print_header("benchmarks/overhead.py", argv)
    print(f"{rounds} rounds; per round and config a quad of {steps}-step blocks (plain, config, "
          f"config, plain); {warmup} warm-up steps; AdamW lr 1e-3; {args.clock} clock")
    print(flush=True)

    cfgs, notes = configs()
    if args.configs:
        wanted = {"control", *(k.strip() for k in args.configs.split(",") if k.strip())}
        unknown = wanted - {c.key for c in cfgs}
        if unknown:
            ap.error(f"unknown config(s) {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(c.key for c in cfgs[1:])}")
        cfgs = [c for c in cfgs if c.key == "plain" or c.key in wanted]
    plain_cfg, others = cfgs[0], cfgs[1:]
    # per model and configuration, one copy, timed plain and by the configuration in
    # turn: two copies of one model, the same numbers in other memory, train at speeds up
    # to 3% apart for a whole run (four copies of the MLP 8x512: 35.2, 34.2, 35.0, 34.8 ms
    # a step), and a ratio against another copy would carry that pair's gap. The plain
    # steps between watched blocks are training the watch does not see; re-entered, it
    # goes on from there (10 AdamW updates move weights far less than any line).
    copies = {k: {c.key: fresh(k) for c in others} for k in keys}
    titles = {k: copies[k][others[0].key].title for k in keys}
    # per model: each configuration's paired ratio per round, and every plain block's time
    ratios: dict[str, dict[str, list[float]]] = {k: {c.key: [] for c in others} for k in keys}
    plain_times: dict[str, list[float]] = {k: [] for k in keys}
    t_start = time.perf_counter()
    for k in keys:
        for c in others:  # warm-up: allocator, first-call paths, the watch's first steps
            b = copies[k][c.key]
            run_block(b, plain_cfg, warmup, clock)
            run_block(b, c, warmup, clock)
        for r in range(rounds):
            settle(full=True)
            for c in others[r % len(others):] + others[: r % len(others)]:
                b = copies[k][c.key]
                p1 = run_block(b, plain_cfg, steps, clock)
                m1 = run_block(b, c, steps, clock)
                m2 = run_block(b, c, steps, clock)
                p2 = run_block(b, plain_cfg, steps, clock)
                ratios[k][c.key].append((m1 + m2) / (p1 + p2))
                plain_times[k] += [p1, p2]
        med = statistics.median(plain_times[k]) * 1e3
        print(f"  {titles[k]}: plain {med:.1f} ms/step "
              f"({time.perf_counter() - t_start:.0f} s so far)", file=sys.stderr, flush=True)

    header = ["ratio watched/plain (median)"] + [titles[k] for k in keys]
    rows = [["plain step time (ms, median)"] +
            [f"{statistics.median(plain_times[k]) * 1e3:.1f}" for k in keys]]
    spread = []
    for c in others:
        rows.append([c.label] + [f"{statistics.median(ratios[k][c.key]):.2f}" for k in keys])
        spread.append([c.label] + [_quartiles(ratios[k][c.key]) for k in keys])
    print(fmt_table(header, rows, md))
    print()
    print(fmt_table(["per-round ratio, quartiles 25%-75%"] + header[1:], spread, md))
    print()

    # what the watched runs measured of themselves (`run.overhead`), beside the ratios
    own = []
    for c in others:
        if c.watch_kwargs is None:
            continue
        cells = []
        for k in keys:
            o = c.runs[k].overhead if k in c.runs else None
            cells.append(f"{1 + o.fraction:.2f}" if o is not None else "n/a")
        own.append([c.label] + cells)
        if c.watch_kwargs.get("overhead"):
            own.append([f"{c.label}: budget held?"] + [_held(c.runs.get(k)) for k in keys])
    print(fmt_table(["self-reported: 1 + run.overhead.fraction"] + header[1:], own, md))
    print()

    # trace memory and events of the default-settings run (where it was timed)
    default = next((c for c in cfgs if c.key == "default"), None)
    if default is not None:
        mem = [["trace bytes per layer-step (default)"], ["layers watched"], ["steps recorded"],
               ["events (default run)"], ["captures kept (default run)"]]
        for k in keys:
            run = default.runs[k]
            tr = run.trace
            n = tr.n_steps * tr.n_layers
            mem[0].append(f"{tr.nbytes / n:.1f}" if n else "n/a")
            mem[1].append(str(tr.n_layers))
            mem[2].append(str(tr.n_steps))
            ev = run.events
            errors = sum(e.severity == "error" for e in ev)
            warns = sum(e.severity == "warning" for e in ev)
            mem[3].append(f"{len(ev)} ({errors} err, {warns} warn)")
            mem[4].append(f"{len(run.captures)} ({run.captures.nbytes / 2**20:.0f} MB)")
        print(fmt_table(["trace"] + header[1:], mem, md))
        print()
    for c in cfgs:
        if c.watch_kwargs is not None:
            env = "".join(f"{k}={v} " for k, v in (c.env or {}).items())
            notes.append(f"{c.label}: {env}{call_text(c.watch_kwargs)}")
    notes.append("Self-reported: the engine's own time per step, measured by the run as it "
                 "trained (the mean over its last 256 steps, reference-capture steps left "
                 "out), over the loop's median step without it; PyTorch's cost of calling "
                 "the hooks is estimated per layer call, from a calibration.")
    notes.append(f"Ratios: per round, a quad of {steps}-step blocks (plain, config, config, "
                 "plain); the config's time over the plain time of the same quad; the "
                 f"median over {rounds} rounds. Quartiles: of the same {rounds} ratios.")
    for n in notes:
        print(n)
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; load average at end: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
