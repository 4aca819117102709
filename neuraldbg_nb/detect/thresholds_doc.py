"""docs/thresholds.md, generated from `Thresholds`: its defaults and meanings, one table.

    python -m neuraldbg_nb.detect.thresholds_doc > docs/thresholds.md

A test checks that the committed file is what this writes, so the page follows the fields.
"""

from __future__ import annotations

import sys

from .thresholds import Setting, number, settings

INTRO = """\
# Thresholds

What counts as unhealthy: the fields of `neuraldbg_nb.Thresholds`. Set any of them when
watching (`watch(model, vanish=1e-7)`, `%%neuraldbg --vanish 1e-7`,
`neuraldbg run --vanish 1e-7 train.py`), or judge a recorded run again under others without
training it again (`run.reclassify(vanish=1e-7)`, `neuraldbg show RUN.npz --vanish 1e-7`,
the panel's sliders).

<!-- Generated from neuraldbg_nb/detect/thresholds.py by
     `python -m neuraldbg_nb.detect.thresholds_doc > docs/thresholds.md`: edit the fields'
     docstrings there, not this file. -->
"""


def _span(s: Setting) -> str:
    if s.span is None:
        return ""
    lo, hi = s.span
    return f"{number(lo)} to {number(hi)}" + (" (log)" if s.log else "")


def _cell(text: str) -> str:
    """Text fit for a table cell: one line, no bare pipe."""
    return " ".join(text.split()).replace("|", "\\|")


def markdown() -> str:
    """The page: an introduction, then one row per setting in declaration order."""
    rows = ["| Setting | Option | Type | Default | Panel slider | Meaning |",
            "|---|---|---|---|---|---|"]
    rows += [f"| `{s.name}` | `{s.option}` | {s.type.__name__} | {number(s.default)} | "
             f"{_span(s)} | {_cell(s.doc)} |" for s in settings()]
    return INTRO + "\n" + "\n".join(rows) + "\n"


def main() -> int:
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
