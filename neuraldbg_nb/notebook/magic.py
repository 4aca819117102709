"""`%%neuraldbg`: watch the training in a cell, with no change to the cell's code.

The cell runs in the user's namespace under `watch()`; the panel is shown above its output
and updates live. If the cell raises, the user gets their exception (after the panel has
shown what happened up to it); `--stop-on error` stops at the first failure quietly, so
the next cells can inspect it.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from ..live.watcher import watch
from ..report.run import Run, TrainingFailure

_THRESHOLD_OPTIONS = {
    "vanish": "gradient norm below which a layer's gradient has vanished (default 1e-6)",
    "explode": "gradient norm above which it has exploded (default 1e3; scaled up where a "
               "run's gradients start above 100)",
    "jump": "factor against a layer's own history that is a regime shift (default 10)",
    "jump_error": "factor that makes an activation jump an error (default 100)",
    "dead": "fraction of dead ReLU units that is reported (default 0.5)",
    "saturated": "fraction of saturated outputs that is reported (default 0.5)",
    "unmoved": "fraction of a half-precision layer's weights an update leaves unchanged that "
               "is reported: its updates round away (default 0.9)",
    "max_update": "relative weight change in one update that is an error (default 1.0)",
    "loss_rise": "loss above its recent level by this factor is divergence (default 10)",
    "window": "steps of history a regime shift is measured against (default 20)",
    "patience": "steps a slow condition must hold before it is reported (default 3)",
}


def _threshold_arguments(func):
    for name, text in reversed(_THRESHOLD_OPTIONS.items()):
        kind = int if name in ("window", "patience") else float
        func = argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=text)(func)
    return func


@magics_class
class NeuralDbgMagics(Magics):
    @magic_arguments()
    @argument("--stop-on", choices=("error", "never"), default="never",
              help="stop training at the first error event (default: never)")
    @argument("--capture-mb", type=float, default=256,
              help="memory budget for captured tensors, in MB (default 256; 0: off)")
    @argument("--sample-every", type=int, default=10,
              help="full activation statistics every N steps (default 10)")
    @argument("--overhead", type=float, default=None, metavar="FRACTION",
              help="budget for watching as a fraction of the step time, e.g. 0.02: the "
                   "full statistics are sampled less often to hold it; the run says so "
                   "where its per-step work alone costs more (default: off)")
    @argument("--trace-mb", type=float, default=64,
              help="memory for the exact recent steps; older ones are compacted (default 64)")
    @argument("--no-activations", action="store_true",
              help="watch gradients, weights, loss and input only (cheapest)")
    @argument("--no-panel", action="store_true", help="print the text summary instead")
    @argument("-o", "--output", default=None, metavar="NAME",
              help="also bind the Run to NAME in the notebook's namespace")
    @argument("-h", "--help", action="store_true", help="show this help and do nothing")
    @_threshold_arguments
    @cell_magic
    def neuraldbg(self, line: str, cell: str) -> None:
        """Watch the training in this cell: a live panel of each layer's health, the first
        failure named, click-to-inspect, threshold sliders. The Run is also
        `neuraldbg_nb.last_run()`."""
        args = _parse(self.neuraldbg, line)
        if args.help:
            print(self.neuraldbg.parser.format_help())
            return
        changes = {k: getattr(args, k) for k in _THRESHOLD_OPTIONS if getattr(args, k) is not None}
        w = watch(None, stop_on=args.stop_on, capture_mb=args.capture_mb,
                  sample_every=args.sample_every, overhead=args.overhead,
                  trace_mb=args.trace_mb, activations=not args.no_activations,
                  report=False, **changes)
        w.warn_notes = False  # printed below, once
        run = w.run
        shell = self.shell
        assert shell is not None  # a registered magic always has its shell
        if args.output:
            shell.user_ns[args.output] = run
        panel = None if args.no_panel else _panel(run)
        if panel is not None:
            display(panel)
        code = compile(shell.transform_cell(cell), "<neuraldbg cell>", "exec")
        try:
            with w:
                exec(code, shell.user_ns)  # noqa: S102 - running the user's cell is the point
        except TrainingFailure:
            pass  # the panel shows where it stopped; next cells can inspect the run
        finally:
            if panel is None:
                print(run, file=sys.stdout)  # the notes are in it
            elif run.notes:
                print("neuraldbg: " + " ".join(run.notes), file=sys.stderr)


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


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(NeuralDbgMagics)
