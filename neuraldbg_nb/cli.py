"""`neuraldbg`: the same engine for scripts and saved runs.

    neuraldbg demo [NAME]            train a built-in broken example under the debugger
    neuraldbg run [--save RUN.npz] script.py [args]
                                     run a training script under watch(), save the run
                                     (options after the script are the script's own;
                                     under torchrun, each rank saves RUN.rank<r>.npz)
    neuraldbg show RUN.npz           the story of a saved run
    neuraldbg show RUN.npz --vanish 1e-7 ...   the same run under other thresholds
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import Any

from . import demo
from .detect.thresholds import Thresholds
from .live.watcher import watch
from .report.run import TrainingFailure, load

_SETTINGS = ("vanish", "explode", "jump", "jump_error", "dead", "saturated", "unmoved",
             "max_update", "loss_rise")


def _thresholds_args(p: argparse.ArgumentParser) -> None:
    for name in _SETTINGS:
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=None,
                       help=f"threshold {name} (default {getattr(Thresholds(), name):g})")


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in _SETTINGS if getattr(args, k) is not None}


def _per_rank(path: Path, rank: tuple[int, int] | None) -> Path:
    """Where a process saves its run: under torchrun each rank writes its own file
    (`neuraldbg-run.rank1.npz`), where they would all write the same one."""
    if rank is None:
        return path
    return path.with_name(f"{path.with_suffix('').name}.rank{rank[0]}.npz")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="neuraldbg", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="train a built-in broken example under the debugger")
    p_demo.add_argument("name", nargs="?", default="weight-blowup", choices=sorted(demo.EXAMPLES))
    p_demo.add_argument("--save", type=Path, default=None, help="save the run (.npz)")
    p_run = sub.add_parser("run", help="run a training script under the debugger")
    p_run.add_argument("script", type=Path)
    p_run.add_argument("script_args", nargs=argparse.REMAINDER,
                       help="the script's own arguments (neuraldbg's options go before the "
                            "script)")
    p_run.add_argument("--save", type=Path, default=Path("neuraldbg-run.npz"))
    p_run.add_argument("--stop-on", choices=("error", "never"), default="never")
    _thresholds_args(p_run)
    p_show = sub.add_parser("show", help="tell the story of a saved run")
    p_show.add_argument("path", type=Path)
    p_show.add_argument("--events", action="store_true", help="list every event")
    _thresholds_args(p_show)
    args = parser.parse_args(argv)

    if args.command == "demo":
        train = demo.EXAMPLES[args.name]()
        story = (demo.EXAMPLES[args.name].__doc__ or "").split(".")[0]
        print(f"neuraldbg demo {args.name}: {story}.")
        with watch(train.model, report=True) as run:  # type: ignore[attr-defined]
            train()
        if args.save:
            print(f"saved to {run.save(args.save)}")
        return 0 if run.first_failure is not None else 1

    if args.command == "run":
        if not args.script.is_file():
            parser.error(f"no such script: {args.script}")
        # the script sees its own argv, as `python script.py args` would give it; a
        # caller of main() (a test, a notebook) gets its own back afterwards
        saved_argv, sys.argv = sys.argv, [str(args.script), *args.script_args]
        w = watch(None, stop_on=args.stop_on, report=True, **_changes(args))
        try:
            with w:
                runpy.run_path(str(args.script), run_name="__main__")
        except TrainingFailure:
            pass
        finally:
            sys.argv = saved_argv
            print(f"neuraldbg: run saved to {w.run.save(_per_rank(args.save, w.run.rank))}",
                  file=sys.stderr)
        return 0

    if not args.path.exists() and not args.path.with_suffix(".npz").exists():
        parser.error(f"no saved run at {args.path}")
    run = load(args.path)
    if _changes(args):
        run = run.reclassify(**_changes(args))
    print(run)
    if args.events:
        for e in run.events:
            print(f"  {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
