"""Labels of one class (`label_top`, `label_share`, read on sampled steps from a
cross-entropy's graph, `record.loss_form.labels`).

A classifier given labels that are all one class learns to answer it whatever its input:
the loss falls toward 0 and nothing else looks wrong (labels made as a constant, read from
the wrong column, overwritten in the loop). Batches that each hold one class, a different
one from stretch to stretch, are data sorted by class and not shuffled: each stretch pulls
the model to its class and it forgets the others. Either is an error, dated from the first
of `READS` batches read in a row whose labels are all of one class, as a data anomaly
(signal "labels"): the data comes before everything the step computes from it.

Judged only where one batch of one class is unlikely by chance: at least `MIN_LABELS`
labels in the batch, and between `MIN_CLASSES` and `MAX_CLASSES` classes (two classes
of very unequal sizes give one-class batches often; beyond `MAX_CLASSES` the "classes"
are the index of a positive among candidates, as in a contrastive loss whose positive is
always first, or a vocabulary).
"""

from __future__ import annotations

import numpy as np

from ..trace.columns import Trace
from .scan import ERROR, Finding, grade
from .thresholds import Thresholds

READS = 3
"""Batches read in a row (on sampled steps) whose labels are all of one class, before it
is reported."""
MIN_LABELS = 8
"""Labels a batch must hold to be judged."""
MIN_CLASSES = 3
MAX_CLASSES = 1000
"""The classes a cross-entropy must be over for its labels to be judged."""


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    top = trace.scalar("label_top", lo, stop)
    share = trace.scalar("label_share", lo, stop)
    n = trace.scalar("label_n", lo, stop)
    classes = trace.scalar("label_classes", lo, stop)
    with np.errstate(invalid="ignore"):
        judged = (n >= MIN_LABELS) & (classes >= MIN_CLASSES) & (classes <= MAX_CLASSES)
        one = judged & (share >= 1.0)
    codes = grade(judged[:, None], (one[:, None], ERROR))

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        first = max(s - lo, 0)
        mixed = np.flatnonzero(judged[first:] & ~one[first:])  # (the stretch ends there)
        end = first + int(mixed[0]) if len(mixed) else len(one)
        rows = np.flatnonzero(one[first:end]) + first
        seen = [(lo + int(r), int(top[r])) for r in rows]
        count = int(classes[rows[0]]) if len(rows) else 0
        labels = int(n[rows].sum()) if len(rows) else 0
        kinds = sorted({k for _, k in seen})
        if len(kinds) == 1:
            return (f"every label the loss was given is class {kinds[0]} of {count}, in each "
                    f"batch read from step {s} on ({len(seen)} batches, {labels} labels): the "
                    f"model only learns to answer {kinds[0]}, and its loss falls toward 0 "
                    f"whatever it learns of its inputs. The labels are made wrong (a "
                    f"constant, the wrong column, overwritten in the loop), or the data is "
                    f"sorted by class and not shuffled (DataLoader(..., shuffle=True))")
        said = ", ".join(f"{k} at step {t}" for t, k in seen[:4])
        return (f"each batch read from step {s} on holds labels of one class only ({said}): "
                f"the data is sorted by class and not shuffled, so each stretch of batches "
                f"pulls the model to its class and it forgets the others. Shuffle it "
                f"(DataLoader(..., shuffle=True))")

    return [Finding("data_anomaly", "labels", codes, share[:, None], per_layer=False,
                    patience=READS, hold_counts=False, message=message,
                    recovery=lambda name, s, v, p, sev: f"the labels of the batch at step {s} "
                                                        f"are of several classes again")]
