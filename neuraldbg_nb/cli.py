"""`neuraldbg`: the same engine for scripts and saved runs.

    neuraldbg demo [NAME]            train a built-in broken example under the debugger
    neuraldbg run [--save RUN.npz] [OPTIONS] script.py [args]
    neuraldbg run [--save RUN.npz] [OPTIONS] -m package.module [args]
                                     run a training script under watch(), as `python`
                                     would run it, and save the run (OPTIONS: watch()'s
                                     and the thresholds, see `neuraldbg run --help`;
                                     options after the script are the script's own; the
                                     exit code is the script's; under torchrun, each rank
                                     saves RUN.rank<r>.npz)
    neuraldbg show RUN.npz           the story of a saved run
    neuraldbg show RUN.npz --vanish 1e-7 ...   the same run under other thresholds
    neuraldbg report RUN.npz [-o REPORT.html]  the run as one offline HTML page
    neuraldbg compare A.npz B.npz    where two runs part, and the events one lacks
"""

from __future__ import annotations

import argparse
import builtins
import importlib.machinery
import importlib.util
import os
import runpy
import signal
import sys
import traceback
import types
from pathlib import Path

from . import demo
from .live.options import (
    add_arguments,
    threshold_arguments,
    threshold_changes,
    watch_arguments,
    watch_keywords,
)
from .live.watcher import watch
from .report.compare import compare
from .report.run import Run, TrainingFailure, load, saved_files


def _per_rank(path: Path, rank: tuple[int, int] | None) -> Path:
    """Where a process saves its run: under torchrun each rank writes its own file
    (`neuraldbg-run.rank1.npz`), where they would all write the same one."""
    if rank is None:
        return path
    npz = saved_files(path)[0]
    return npz.with_name(f"{npz.name[:-len('.npz')]}.rank{rank[0]}.npz")


def make_parser() -> argparse.ArgumentParser:
    """The command line: its commands, and their options (`run`'s from `live.options`)."""
    parser = argparse.ArgumentParser(prog="neuraldbg", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="train a built-in broken example under the debugger")
    p_demo.add_argument("name", nargs="?", default="weight-blowup", choices=sorted(demo.EXAMPLES))
    p_demo.add_argument("--save", type=Path, default=None, help="save the run (.npz)")
    p_run = sub.add_parser("run", help="run a training script under the debugger")
    p_run.add_argument("-m", dest="module", default=None, metavar="MODULE",
                       help="run a module as `python -m MODULE` does (its arguments follow)")
    p_run.add_argument("script", type=Path, nargs="?", default=None)
    p_run.add_argument("script_args", nargs=argparse.REMAINDER,
                       help="the script's own arguments (neuraldbg's options go before the "
                            "script)")
    p_run.add_argument("--save", type=Path, default=Path("neuraldbg-run.npz"),
                       help="where to save the run (default: %(default)s)")
    add_arguments(p_run, [*watch_arguments(), *threshold_arguments()])
    p_show = sub.add_parser("show", help="tell the story of a saved run")
    p_show.add_argument("path", type=Path)
    p_show.add_argument("--events", action="store_true", help="list every event")
    add_arguments(p_show, threshold_arguments())
    p_report = sub.add_parser("report", help="write a saved run as one offline HTML page")
    p_report.add_argument("path", type=Path)
    p_report.add_argument("-o", "--output", type=Path, default=None,
                          help="the HTML file (default: the run's path with .html)")
    add_arguments(p_report, threshold_arguments())
    p_compare = sub.add_parser("compare", help="where two saved runs part")
    p_compare.add_argument("a", type=Path)
    p_compare.add_argument("b", type=Path)
    return parser


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`neuraldbg run`: the script or module as `python` runs it (its folder, or the
    current one for `-m`, first on `sys.path`; its own argv; `__main__`), under a watch.
    The exit code is the script's: 0 at its end or at `sys.exit(0)`, its `sys.exit` code,
    1 with the traceback for an exception, 130 for Ctrl-C. The run is saved whatever
    the end, unless the script never started: one that does not compile, or a module
    (or a package's submodule) that is not there, is said as `python` says it (exit code
    1), and an earlier run saved at the same path stays. A caller of `main()` (a test, a notebook) gets its argv and
    path back."""
    if args.module is not None:
        rest = [str(args.script)] if args.script is not None else []
        script_argv = [args.module, *rest, *args.script_args]
        first_path = os.getcwd()
        top = args.module.partition(".")[0]  # (finding a package imports nothing)
        if importlib.util.find_spec(top) is None and not Path(first_path, top).is_dir():
            print(f"neuraldbg run: No module named {top}", file=sys.stderr)
            return 1
        if "." in args.module and not _module_found(args.module, first_path):
            print(f"neuraldbg run: No module named {args.module}", file=sys.stderr)
            return 1
    elif args.script is None:
        parser.error("give a script to run, or -m MODULE")
    else:
        if not args.script.is_file():
            parser.error(f"no such script: {args.script}")
        script_argv = [str(args.script), *args.script_args]
        first_path = str(args.script.resolve().parent)
        try:
            compile(args.script.read_bytes(), os.path.abspath(args.script), "exec")
        except (SyntaxError, ValueError) as exc:  # (ValueError: a null byte in it)
            traceback.print_exception(type(exc), exc, None)
            return 1
    # where the run is saved, fixed now: the script may change its working directory
    args.save = Path(os.path.abspath(args.save))
    try:
        w = watch(None, report=True, **watch_keywords(args))
    except (TypeError, ValueError) as e:  # an option's value out of its range
        parser.error(str(e))
    global _interrupted
    _interrupted = False
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = script_argv
    sys.path.insert(0, first_path)
    code = 0
    try:
        with w:
            if args.module is not None:
                runpy.run_module(args.module, run_name="__main__", alter_sys=True)
            else:
                _run_script(os.path.abspath(script_argv[0]))
    except TrainingFailure:
        pass  # the story says where it stopped
    except SystemExit as exit_:
        code = _exit_code(exit_)
    except KeyboardInterrupt as exc:
        _print_script_error(exc)
        code = INTERRUPTED
        _interrupted = True
    except Exception as exc:  # noqa: BLE001 - the script's own error: reported as python would
        _print_script_error(exc)
        code = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        saved = w.run.save(_per_rank(args.save, w.run.rank))
        print(f"neuraldbg: run saved to {saved}", file=sys.stderr)
    return code


def _module_found(name: str, first_path: str) -> bool:
    """Whether `python -m name` finds a package's submodule, with `first_path` first on
    `sys.path`: looked for as python looks for it, which imports the packages above it.
    A package that raises as it is imported counts as found: its error is the script's."""
    sys.path.insert(0, first_path)
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # (a package above it is not there, or is no package)
        return False
    except Exception:  # noqa: BLE001 - raised again as the module runs, as python shows it
        return True
    finally:
        sys.path.remove(first_path)


def _run_script(path: str) -> None:
    """Run the script at `path` (absolute) as `python path` runs it: in a new module
    `__main__`, which `sys.modules` holds while it runs (a class it defines pickles by
    that name), with python's globals: `__file__` absolute (a script that changes its
    working directory still finds its own folder), a `SourceFileLoader` as `__loader__`,
    `__package__`, `__spec__` and `__cached__` None, the builtins module as
    `__builtins__`, empty `__annotations__`; compiled without this module's future
    imports."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path),
                         __builtins__=builtins, __annotations__={})
    code = compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)  # noqa: S102 - the user's script, as python runs it
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


INTERRUPTED = 130
"""`neuraldbg run`'s exit code for a script stopped by Ctrl-C (`main`'s return value); the
command itself ends as `python` does there (`entry`): killed by SIGINT, which a shell
reads as 130."""


def entry() -> None:
    """The `neuraldbg` command: `main`, and its code as the process's exit status; a script
    stopped by Ctrl-C ends the process by SIGINT, as `python` ends one, so that a caller
    waiting on it (a shell loop, a job runner) sees the interrupt, not an exit code.
    Output piped into a reader that stops early (`| head`) ends it quietly."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # the reader is gone: no traceback for it, nor at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    if code == INTERRUPTED and _interrupted and os.name == "posix":  # (Windows: the code)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(code)


_interrupted = False
"""The last script `main` ran was stopped by Ctrl-C (not ended by `sys.exit(130)`)."""


def _print_script_error(exc: BaseException) -> None:
    """The traceback of an error the script raised, as `python` prints it: from the
    script's own frames on, without this module's and `runpy`'s that ran it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _runner_frame(tb.tb_frame.f_code):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _runner_frame(code: types.CodeType) -> bool:
    """A frame of `neuraldbg run` itself: this module's, or `runpy`'s."""
    return code.co_filename == __file__ or code.co_filename in (runpy.__file__,
                                                                "<frozen runpy>")


def _load(parser: argparse.ArgumentParser, path: Path) -> Run:
    """The run saved at `path`; a usage error, saying why, where there is none."""
    try:
        return load(path)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))


def _exit_code(exit_: SystemExit) -> int:
    """The process exit code `python` gives a `SystemExit`: None is 0, a number is itself,
    anything else is printed and is 1."""
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    print(exit_.code, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
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
        return _run(parser, args)

    if args.command == "compare":
        print(compare(_load(parser, args.a), _load(parser, args.b)))
        return 0

    run = _load(parser, args.path)
    changes = threshold_changes(args)
    if changes:
        try:
            run = run.reclassify(**changes)
        except (TypeError, ValueError) as err:
            parser.error(str(err))
    if args.command == "report":
        out = args.output or args.path.with_suffix(".html")
        print(f"neuraldbg: report written to {run.to_html(out)}")
        return 0
    print(run)
    if args.events:
        for e in run.events:
            print(f"  {e}")
    return 0


if __name__ == "__main__":
    entry()
