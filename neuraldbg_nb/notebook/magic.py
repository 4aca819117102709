"""`%%neuraldbg`: watch the training in a cell, with no change to the cell's code.

The cell runs in the user's namespace under `watch()`; the panel is shown above its output
and updates live. When the cell ends, the diagnosis follows as text for readers without
the kernel (`static`). If the cell raises, the user gets their exception (after the panel has
shown what happened up to it); `--stop-on error` stops at the first failure quietly, so
the next cells can inspect it.
"""

from __future__ import annotations

import difflib
import linecache
import sys
import time
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from ..live.options import Argument, threshold_arguments, watch_arguments, watch_keywords
from ..live.watcher import watch
from ..report.run import Run, TrainingFailure
from .static import show_diagnosis


def _arguments(arguments: list[Argument]) -> Callable[[Any], Any]:
    """IPython's `@argument` for each of `arguments`, in their order (`live.options`)."""
    def add(func: Any) -> Any:
        for flags, kw in reversed(arguments):
            func = argument(*flags, **kw)(func)
        return func
    return add


@magics_class
class NeuralDbgMagics(Magics):
    @magic_arguments()
    @_arguments(watch_arguments())
    @argument("--no-panel", action="store_true", help="print the text summary instead")
    @argument("-o", "--output", default=None, metavar="NAME",
              help="also bind the Run to NAME in the notebook's namespace")
    @argument("--save", default=None, metavar="PATH",
              help="also save the run to PATH (.npz) when the cell ends: after a kernel "
                   "restart, neuraldbg_nb.show(PATH) opens its panel again")
    @argument("-h", "--help", action="store_true", help="show this help and do nothing")
    @_arguments(threshold_arguments())
    @cell_magic
    def neuraldbg(self, line: str, cell: str) -> None:
        """Watch the training in this cell: a live panel of each layer's health, the first
        failure named, click-to-inspect, threshold sliders. The Run is also
        `neuraldbg_nb.last_run()`."""
        __tracebackhide__ = True  # IPython leaves this frame out of the cell's traceback
        args = _parse(self.neuraldbg, line)
        if args.help:
            print(self.neuraldbg.parser.format_help())
            return
        try:
            w = watch(None, report=False, **watch_keywords(args))
        except (TypeError, ValueError) as e:  # an option's value out of its range
            raise UsageError(f"%%neuraldbg: {e}") from None
        w.warn_notes = False  # printed below, once
        run = w.run
        shell = self.shell
        assert shell is not None  # a registered magic always has its shell
        if args.output:
            shell.user_ns[args.output] = run
        shown = time.perf_counter()
        panel = None if args.no_panel else _panel(run)
        if panel is not None:
            display(panel)
        w.charge(time.perf_counter() - shown)  # (the cell's cost: `Overhead.whole`)
        code = _compile(shell.transform_cell(cell), shell.execution_count)
        try:
            with w:
                exec(code, shell.user_ns)  # noqa: S102 - running the user's cell is the point
        except TrainingFailure:
            pass  # the panel shows where it stopped; next cells can inspect the run
        finally:
            if panel is None:
                print(run, file=sys.stdout)  # the notes are in it
            else:
                told = time.perf_counter()
                try:  # for readers without the kernel (`static`); never instead of the
                    show_diagnosis(run)  # cell's own exception
                except Exception as err:  # noqa: BLE001
                    print(f"neuraldbg: no saved diagnosis ({err})", file=sys.stderr)
                w.charge(time.perf_counter() - told)
                if run.notes:
                    print("neuraldbg: " + " ".join(run.notes), file=sys.stderr)
            if args.save:
                _save(run, args.save)


def _save(run: Run, path: str) -> None:
    """`--save`: the run on disk, said where; a failure to write it is said, never raised
    over the cell's own result or exception."""
    try:
        print(f"neuraldbg: run saved to {run.save(path)}", file=sys.stderr)
    except OSError as err:
        print(f"neuraldbg: the run was not saved ({err})", file=sys.stderr)


def _compile(source: str, number: int) -> Any:
    """The cell's code, under a file name whose lines are in `linecache`, so that a
    traceback from the cell shows the user's own source lines."""
    name = f"<neuraldbg cell [{number}]>"
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    return compile(source, name, "exec")


def _parse(magic: Any, line: str) -> Any:
    """Parse the options; an unknown one gets a spelling hint."""
    try:
        return parse_argstring(magic, line)
    except UsageError as err:
        known = [o for a in magic.parser._actions for o in a.option_strings]
        hints = [difflib.get_close_matches(tok.split("=")[0], known, n=1)
                 for tok in line.split() if tok.startswith("-") and tok.split("=")[0] not in known]
        hint = "; ".join(f"did you mean {h[0]}?" for h in hints if h)
        raise UsageError(f"%%neuraldbg: {err}" + (f" ({hint})" if hint else "")
                         + ". See %%neuraldbg --help") from None


def _panel(run: Run) -> Any:
    try:
        from .panel import Panel
    except ImportError as err:
        print(f"neuraldbg: no live panel ({err}); the summary is printed at the end.",
              file=sys.stderr)
        return None
    return Panel(run)


def _give_empty_cells_a_body(lines: list[str]) -> list[str]:
    """IPython refuses a cell magic whose body is empty before the magic is called: a
    `%%neuraldbg --help` cell (or one not written yet) gets an empty line for a body, so
    the magic answers it (with its help, or by saying it watched nothing)."""
    if lines and lines[0].startswith("%%neuraldbg") and not "".join(lines[1:]).strip():
        return [lines[0] if lines[0].endswith("\n") else lines[0] + "\n", "\n"]
    return lines


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(NeuralDbgMagics)
    cleanup = getattr(ipython, "input_transformers_cleanup", None)
    if cleanup is not None and _give_empty_cells_a_body not in cleanup:
        cleanup.append(_give_empty_cells_a_body)
