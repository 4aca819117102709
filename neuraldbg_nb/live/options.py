"""How a training is watched: `watch()`'s options, declared once.

Each option's default, type and meaning (the docstring under its field) are written in
`WatchOptions` only. `watch()` and `Watch` take them as keywords with these defaults (a test
checks that their signatures match the fields), `watch()`'s help is made from the docstrings
(`document`), and the `%%neuraldbg` magic and `neuraldbg run` make their command-line
options from the same fields and from `Thresholds` (`watch_arguments`,
`threshold_arguments`).
"""

from __future__ import annotations

import argparse
import inspect
import textwrap
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ..detect.fielddocs import field_docs
from ..detect.thresholds import Thresholds, number, settings

StopOn = Literal["error", "never"]
LayerHooks = Literal["sampled", "every"]

_NOT_ON_COMMAND_LINE = {"command_line": False}
"""A field's metadata: a keyword of `watch()` only (the magic and the CLI set it)."""


@dataclass(frozen=True)
class WatchOptions:
    """The options of one watch, checked when it is made."""

    thresholds: Thresholds = field(default_factory=Thresholds, metadata=_NOT_ON_COMMAND_LINE)
    """Detection settings: a `Thresholds`, changed one setting at a time by keywords
    (`watch(model, vanish=1e-7)`, `--vanish 1e-7`); a recorded run is judged again under
    others with `run.reclassify(...)`, without training again."""
    stop_on: StopOn = "never"
    """"error" stops training at the first error event, so that it stops at the cause
    instead of running on in NaNs (`watch()` raises `TrainingFailure`, the cell magic and
    `neuraldbg run` stop quietly); "never" trains to the end."""
    capture_mb: float = 256
    """Memory budget for captured tensors, in MB (0 turns capture off). On the CPU a layer's
    input and output are kept for capture only at steps where the layer looks unusual,
    sampled steps and reference steps."""
    sample_every: int = 10
    """Full activation statistics every N steps at most (a non-finite value is caught every
    step: it reaches the loss or a gradient, read every step, and the step is replayed to
    find the layer where it began)."""
    overhead: float | None = field(default=None, metadata={"metavar": "FRACTION"})
    """A budget for watching, as a fraction of the step time (e.g. 0.02): the full
    statistics are sampled less often to fit in what the per-step work (all the rest)
    leaves of it; where that alone costs more, the run says so (a RuntimeWarning and
    `run.notes`). Measured in time, so which steps are sampled can differ between two runs;
    without it (the default) exactly every `sample_every` steps are sampled, reproducibly.
    Whatever the budget, `run.overhead` reports what watching cost."""
    activations: bool = True
    """Watch each layer's activations. Off (`activations=False`, `--no-activations`), only
    gradients, weights, the loss and the input are watched: the cheapest mode, in which no
    forward hook does any work."""
    layer_hooks: LayerHooks = "sampled"
    """When each layer's forward hook runs. "sampled": only for the forwards of sampled
    steps and reference steps (at most `trace.HOOK_GAP` apart: each layer's recent level), and for
    the replay of a step whose every-step numbers (loss, gradient and weight norms, input,
    learning rate) went wrong, so the first failure is still found at its own step and
    layer while a healthy step pays nothing per layer; activation columns are NaN (not
    measured) on the other steps. "every": on every layer call of every step (about 30 us
    each on a CPU), for an activation abs-max at every step."""
    trace_mb: float = 64
    """Memory for the exact recent steps of the trace, in MB; older steps are compacted into
    blocks (events found on them are kept exactly) held to half as much, so a run of any
    length stays within 1.5 x trace_mb."""
    report: bool | None = field(default=None, metadata=_NOT_ON_COMMAND_LINE)
    """Print the text summary when the block ends (default: outside notebooks)."""

    def __post_init__(self) -> None:
        if self.stop_on not in typing.get_args(StopOn):
            raise ValueError(f"stop_on must be 'error' or 'never', got {self.stop_on!r}")
        every = self.sample_every
        if isinstance(every, bool) or not isinstance(every, (int, float)):
            raise TypeError(f"sample_every is a number of steps, got {every!r}")
        if not float(every).is_integer():  # (a whole float, as a config file gives it: a count)
            raise ValueError(f"sample_every is a whole number of steps, got {every!r}")
        object.__setattr__(self, "sample_every", int(every))
        if self.sample_every < 1:
            raise ValueError(f"sample_every must be >= 1, got {self.sample_every}")
        if self.overhead is not None and not 0 < self.overhead < 1:
            raise ValueError(f"overhead is a fraction of the step time in (0, 1), e.g. 0.02; "
                             f"got {self.overhead!r} (None turns the budget off)")
        if self.layer_hooks not in typing.get_args(LayerHooks):
            raise ValueError(f"layer_hooks must be 'sampled' or 'every', got "
                             f"{self.layer_hooks!r}")
        if self.trace_mb <= 0:
            raise ValueError(f"trace_mb must be > 0, got {self.trace_mb}")
        if self.capture_mb < 0:
            raise ValueError(f"capture_mb must be >= 0, got {self.capture_mb}")


DEFAULT = WatchOptions()
"""The defaults, which `watch()`'s and `Watch`'s keywords take."""


def document(head: str) -> str:
    """`head` (a docstring) followed by one entry per option: `name: its docstring`."""
    docs = field_docs(WatchOptions)
    entries = [textwrap.fill(f"{f.name}: {docs.get(f.name, '')}", 88,
                             subsequent_indent="    ", break_on_hyphens=False,
                             break_long_words=False)
               for f in fields(WatchOptions)]
    return "\n".join([inspect.cleandoc(head), "", *entries]) + "\n"


Argument = tuple[tuple[str, ...], dict[str, Any]]
"""The flags and keywords of one `argparse` argument (`parser.add_argument(*flags, **kw)`,
or IPython's `@argument(*flags, **kw)`)."""


def _help(text: str, default: str | None) -> str:
    text = text.replace("%", "%%")  # argparse formats help with %
    return f"{text} (default: {default})" if default is not None else text


def watch_arguments() -> list[Argument]:
    """The options of `WatchOptions` a command line sets, in declaration order."""
    hints = typing.get_type_hints(WatchOptions)
    docs = field_docs(WatchOptions)
    out: list[Argument] = []
    for f in fields(WatchOptions):
        if not f.metadata.get("command_line", True):
            continue
        flag, doc, kind = "--" + f.name.replace("_", "-"), docs.get(f.name, ""), hints[f.name]
        default = getattr(DEFAULT, f.name)
        if kind is bool:  # on by default: the flag turns it off
            assert default is True, f"WatchOptions.{f.name}: a flag turns an option off"
            out.append(((f"--no-{flag[2:]}",),
                        {"dest": f.name, "action": "store_false", "help": _help(doc, None)}))
            continue
        kw: dict[str, Any] = {"dest": f.name, "default": default}
        choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else ()
        if choices:
            kw["choices"] = choices
        else:
            kw["type"] = next(t for t in (*typing.get_args(kind), kind) if t in (int, float))
        if "metavar" in f.metadata:
            kw["metavar"] = f.metadata["metavar"]
        shown = None if default is None else \
            default if isinstance(default, str) else number(default)
        kw["help"] = _help(doc, shown)
        out.append(((flag,), kw))
    return out


def threshold_arguments() -> list[Argument]:
    """One option per field of `Thresholds`; an option not given leaves its setting as it
    is (`threshold_changes`)."""
    return [((s.option,), {"dest": s.name, "type": s.type, "default": None,
                           "help": _help(s.doc, number(s.default))}) for s in settings()]


def add_arguments(parser: argparse.ArgumentParser, arguments: Iterable[Argument]) -> None:
    for flags, kw in arguments:
        parser.add_argument(*flags, **kw)


def watch_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """`watch()`'s keywords from parsed `watch_arguments` and `threshold_arguments` (those
    of the two that the parser has)."""
    names = [kw["dest"] for _, kw in watch_arguments()]
    out = {k: getattr(args, k) for k in names if hasattr(args, k)}
    out.update(threshold_changes(args))
    return out


def threshold_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of `Thresholds` given as options in parsed `threshold_arguments`."""
    return {s.name: getattr(args, s.name) for s in settings()
            if getattr(args, s.name, None) is not None}
