"""Two versions of the engine side by side in one process: did a change make it cheaper?

    git worktree add /tmp/base HEAD~1
    python benchmarks/compare.py --base /tmp/base --models mlp,cnn-cl --threads 1 --clock cpu

The package of the checkout at `--base` is imported under another name beside this
checkout's, and each version trains a copy of the model of its own. A round times each
version as a quad of `--steps`-step blocks on its copy (plain, watched, watched, plain),
the two versions in an order swapped every other round; a version's ratio is its two
watched blocks over its two plain blocks, and the table gives the median over the rounds.
Each version's plain blocks train its own copy: two copies made alike train up to 3%
apart, and a plain copy shared by both versions would put that gap into their
difference. Runs of `overhead.py` minutes apart differ by 0.03-0.05 on a shared machine,
more than most single changes move them; here both versions are timed in the same
rounds.
`--models nb-cnn,nb-mlp121` are the notebook models of `notebook_path.py`; with
`--threads 2 --clock wall` a run reads what a notebook's user waits for.
Compare a checkout with itself first (`--base .`) to see what noise looks like: on the
CNN, 16 rounds of identical code gave a median difference of +0.024.
With `--fresh`, each watched block is a watch of its own, started and ended in the block:
what a short run pays (its first steps, its reference captures, its final scan), where
by default one watch per version is entered again block after block (the steady state).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import overhead as ob
import torch


def import_base(checkout: Path) -> ModuleType:
    """The `neuraldbg_nb` package of another checkout, as the module `neuraldbg_base`
    (its imports are relative, so it runs beside this checkout's without mixing)."""
    init = checkout / "neuraldbg_nb" / "__init__.py"
    if not init.is_file():
        raise SystemExit(f"--base {checkout}: no neuraldbg_nb/__init__.py there; give the "
                         f"root of a checkout (e.g. `git worktree add /tmp/base HEAD~1`)")
    spec = importlib.util.spec_from_file_location(
        "neuraldbg_base", init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["neuraldbg_base"] = module
    spec.loader.exec_module(module)
    return module


NOTEBOOK_MODELS = {"nb-cnn": ("cnn", "CNN on digits"), "nb-mlp121": ("mlp121", "MLP 121 layers")}
"""The notebook models of `notebook_path.py` (trained with `overhead.Bench`'s optimizer)."""


def fresh(key: str) -> ob.Bench:
    """A new copy of benchmark `key`: `overhead`'s, or a notebook model."""
    if key not in NOTEBOOK_MODELS:
        return ob.fresh(key)
    import notebook_path

    made: dict[str, object] = {}
    exec(notebook_path.MODELS_SOURCE, made)  # noqa: S102 - the benchmark's own source
    name, title = NOTEBOOK_MODELS[key]
    return ob.Bench(key, title, made["MAKE"][name](), made["BATCHES"],  # type: ignore[index]
                    torch.nn.functional.cross_entropy)


def compare(key: str, versions: dict[str, ModuleType], rounds: int, steps: int, warmup: int,
            watch_kwargs: dict[str, object], clock: Callable[[], float], per_block: bool = False
            ) -> tuple[str, dict[str, list[float]]]:
    """The model's title and, per version, the ratio of each round (see the module
    docstring; `per_block`: a watch of its own per watched block, `--fresh`)."""
    # each version trains a copy of its own, and its plain blocks train that same copy:
    # two copies made alike train up to 3% apart (`overhead.main`)
    runs = {}
    for name, package in versions.items():
        b = fresh(key)
        runs[name] = (b, package, package.watch(b.model, report=False, **watch_kwargs))

    def block(b: ob.Bench, w, n: int = steps) -> float:
        ob.settle()
        start = clock()
        with w or contextlib.nullcontext():
            for _ in range(n):
                ob.step(b)
        return clock() - start

    def watched(name: str) -> object:
        b, package, w = runs[name]
        return package.watch(b.model, report=False, **watch_kwargs) if per_block else w

    for name, (b, _, _) in runs.items():
        block(b, None, warmup)
        block(b, watched(name), warmup)
    names = list(runs)
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        ob.settle(full=True)
        for name in (names if r % 2 == 0 else names[::-1]):
            b = runs[name][0]
            p1, m1, m2, p2 = (block(b, None), block(b, watched(name)), block(b, watched(name)),
                              block(b, None))
            ratios[name].append((m1 + m2) / (p1 + p2))
        print(f"  {key}: round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    return runs[names[0]][0].title, ratios


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True,
                    help="root of the checkout to compare with (its neuraldbg_nb/ is used)")
    choices = [*ob.MODELS, *NOTEBOOK_MODELS]
    ap.add_argument("--models", default="mlp",
                    help=f"comma-separated, from {','.join(choices)} (default mlp)")
    ap.add_argument("--rounds", type=int, default=12, help="rounds (default 12)")
    ap.add_argument("--steps", type=int, default=5, help="steps per block (default 5)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps per copy first")
    ap.add_argument("--gradients-only", action="store_true",
                    help="watch(model, activations=False) in both versions")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--clock", choices=sorted(ob.CLOCKS), default="cpu",
                    help="cpu (default, with --threads 1) or wall")
    ap.add_argument("--fresh", action="store_true",
                    help="a watch of its own per watched block: short runs, start and end included")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args(argv)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in choices]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(choices)}")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--rounds and --steps must be at least 1, --warmup at least 0")
    base = import_base(args.base.resolve())
    versions = {f"base {ob.source_digest(base)}": base, f"this {ob.source_digest()}": ob.neuraldbg_nb}
    torch.set_num_threads(args.threads)
    kw: dict[str, object] = {"activations": False} if args.gradients_only else {}
    ob.print_header("benchmarks/compare.py", argv)
    print(f"base: {args.base} (sources sha1 {ob.source_digest(base)})")
    print(f"{args.rounds} rounds; per version a quad of {args.steps}-step blocks on its own copy "
          f"(plain, watched, watched, plain), the versions' order swapped every other round; "
          f"{ob.call_text(kw)}{', a watch of its own per block' if args.fresh else ''}; "
          f"{args.clock} clock\n")
    rows = []
    for key in keys:
        title, got = compare(key, versions, args.rounds, args.steps, args.warmup, kw,
                             ob.CLOCKS[args.clock], args.fresh)
        for name, values in got.items():
            rows.append([title, name, f"{statistics.median(values):.3f}", ob._quartiles(values)])
        diffs = [b - a for a, b in zip(*got.values())]
        rows.append([title, "this - base (median of per-round differences)",
                     f"{statistics.median(diffs):+.3f}", ob._quartiles(diffs)])
    print(ob.fmt_table(["model", "version", "watched/plain (median)", "quartiles"], rows,
                       args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
