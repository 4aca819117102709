"""How the loss was built, read from its autograd graph: losses given inputs of the wrong
form train, the loss moves, and nothing else says why the model learns slowly or not at
all.

- `SOFTMAX_TWICE`: a log-softmax (cross-entropy's first op) applied to the output of a
  softmax: the model's probabilities taken as logits. Every class's logit then lies in
  [0, 1], so with C classes the loss cannot fall below log(1 + (C - 1) / e) (1.46 for 10
  classes), and the gradients shrink by the softmax's slope.
- `BOUNDED_LOGITS`: a log-softmax or `binary_cross_entropy_with_logits` applied to a
  ReLU's, a sigmoid's or a tanh's output: logits that cannot go below 0 (a logit the ReLU
  zeroes gets no gradient to raise it; binary probabilities never fall below 0.5), or
  that stay inside (0, 1) or (-1, 1), where the loss has a floor.
- `SIGMOID_TWICE`: `binary_cross_entropy_with_logits` given the output of a sigmoid: the
  logits it is given lie in (0, 1), so its own sigmoid of them lies in (0.5, 0.73).
- `broadcast`: a regression loss (MSE, smooth L1, Huber) whose prediction was broadcast
  to another shape against its target (a prediction of shape [N, 1] against a target of
  shape [N] makes [N, N]): every prediction is compared with every target, and the best
  the model can do is predict their mean. The factor is how many targets each
  prediction meets.

Shape-only ops (views, transposes, slices, dtype casts such as autocast's) between the two
ops are looked through. The graph is walked from the loss for at most `NODES` nodes, near
the loss, where these ops sit: on sampled steps only (`Backwards`).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import torch

from ..trace.columns import BOUNDED_LOGITS, SIGMOID_TWICE, SOFTMAX_TWICE

NODES = 32
"""Graph nodes read from the loss, at most."""

_SHAPE_ONLY = ("View", "Reshape", "UnsafeView", "Permute", "Transpose", "Squeeze",
               "Unsqueeze", "Slice", "Select", "Clone", "ToCopy", "Alias", "T", "Expand",
               "Contiguous")
_OP = {"ReLU": "ReluBackward0", "sigmoid": "SigmoidBackward0", "tanh": "TanhBackward0"}
_BOUNDED = {_OP[name]: code for code, name in BOUNDED_LOGITS.items()}
"""The bounded activations' ops, by name, and their `loss_squashed` codes."""
_REGRESSION = frozenset({"MseLossBackward0", "SmoothL1LossBackward0", "HuberLossBackward0"})


def _name(node: object) -> str:
    return type(node).__name__


def _shape_only(name: str) -> bool:
    base = name[:-len("Backward0")] if name.endswith("Backward0") else name.rstrip("0123456789")
    base = base.removesuffix("Backward")
    return base in _SHAPE_ONLY


def _input_node(node: object) -> object | None:
    """The node that made `node`'s first input, shape-only ops looked through."""
    nxt = getattr(node, "next_functions", ())
    for _ in range(8):
        if not nxt or nxt[0][0] is None:
            return None
        node = nxt[0][0]
        if not _shape_only(_name(node)):
            return node
        nxt = node.next_functions  # type: ignore[attr-defined]
    return None


def _input_op(node: object) -> str:
    """The op that made `node`'s first input, shape-only ops looked through."""
    made = _input_node(node)
    return "" if made is None else _name(made)


_MEAN = 1  # `_saved_reduction` of a mean
_NLL = frozenset({"NllLossBackward0", "NllLoss2DBackward0"})


def chance(root: object) -> float:
    """ln(C), the loss of a uniform guess among C classes, where the loss `backward()` is
    called on is itself a mean cross-entropy (a negative log-likelihood of a
    log-softmax over C classes): what a model that learns nothing from its inputs
    stays at (`loss_chance`) where the classes are balanced. NaN for any other loss (a
    sum of terms, a scaled one)."""
    classes = _classes(root)
    return math.log(classes) if classes >= 2 else math.nan


def _classes(root: object) -> int:
    """C where `root` is a mean cross-entropy over C classes (`chance`), else 0."""
    if _name(root) not in _NLL or getattr(root, "_saved_reduction", None) != _MEAN:
        return 0
    made = _input_node(root)
    if made is None or _name(made) != "LogSoftmaxBackward0":
        return 0
    result, dim = getattr(made, "_saved_result", None), getattr(made, "_saved_dim", None)
    if not isinstance(result, torch.Tensor) or not isinstance(dim, int) or result.dim() == 0:
        return 0
    return int(result.shape[dim])


def labels(root: object) -> tuple[torch.Tensor, int] | None:
    """How many of the step's labels each class has (C counts, on the labels' device, in
    ops that never wait for it: read with the step's other numbers), and C, where `root`
    is a mean cross-entropy of class labels without class weights (`chance`); None
    otherwise. Labels set to its `ignore_index` are not counted."""
    classes = _classes(root)
    target = getattr(root, "_saved_target", None)
    if classes < 2 or getattr(root, "_saved_weight", None) is not None \
            or not isinstance(target, torch.Tensor) or target.is_floating_point():
        return None
    flat = target.reshape(-1).long()
    ignore = getattr(root, "_saved_ignore_index", None)
    if isinstance(ignore, int):  # (an unsigned 64-bit on the node: -100 reads 2**64 - 100)
        ignore = ignore - (1 << 64) if ignore >= 1 << 63 else ignore
        flat = torch.where(flat == ignore, classes, flat)  # counted apart, then dropped
    counts = torch.zeros(classes + 1, dtype=torch.float32, device=flat.device)  # (exact below 2**24)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=counts.dtype))
    return counts[:classes], classes


def per_sample(root: object) -> bool:
    """Whether cross-entropy `root` (`labels`) takes one class label per sample, not one per
    position of a map (`nll_loss2d`: a segmentation's pixels, most of a batch's of one
    class by nature)."""
    return _name(root) == "NllLossBackward0"


BALANCED_Z = 3.09
"""Labels count as drawn from balanced classes unless a chi-square test of their counts
says otherwise at this many standard deviations (one time in a thousand): a hundred
labels of two balanced classes split 60/40 now and then, and chance stays ln 2 there."""


def chance_level(counts: np.ndarray) -> float:
    """The loss a model that learns nothing from its inputs settles at, given how many
    labels of each class were seen (`counts`): it predicts the classes' frequencies, and
    its loss is their entropy (nats). Where the counts may come from balanced classes
    (`BALANCED_Z`), ln C exactly; NaN where none were counted."""
    total = float(counts.sum())
    classes = len(counts)
    if total <= 0 or classes < 2:
        return math.nan
    expected = total / classes
    chi2 = float(((counts - expected) ** 2).sum() / expected)
    k = classes - 1  # (the chi-square's quantile at `BALANCED_Z`: Wilson and Hilferty)
    if chi2 <= k * (1 - 2 / (9 * k) + BALANCED_Z * math.sqrt(2 / (9 * k))) ** 3:
        return math.log(classes)
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())


def _broadcast(node: object) -> float:
    """How many targets each prediction meets in regression loss `node`: its input's
    elements over the prediction's before the broadcast; 0 where it was not broadcast."""
    nxt = node.next_functions  # type: ignore[attr-defined]
    if not nxt or nxt[0][0] is None or _name(nxt[0][0]) != "ExpandBackward0":
        return 0.0
    before = getattr(nxt[0][0], "_saved_self_sym_sizes", None)
    after = getattr(node, "_saved_self", None)
    if before is None or not isinstance(after, torch.Tensor):
        return 0.0
    n = math.prod(int(s) for s in before)
    return after.numel() / n if n > 0 and after.numel() > n else 0.0


def read(loss: torch.Tensor, scaled: bool = False) -> dict[str, float]:
    """The step's columns of how the loss `backward()` is called on was built:
    `loss_squashed` (0, `SOFTMAX_TWICE`, `SIGMOID_TWICE` or a code of `BOUNDED_LOGITS`),
    `loss_broadcast` (0 or the factor) and `loss_chance` (`chance`). `scaled`: `loss`
    is a GradScaler's scaling of the loss (`amp_scale.ScaleReader`), which is its
    graph's first input."""
    root = loss.grad_fn
    if scaled and root is not None and root.next_functions:
        root = root.next_functions[0][0]
    squashed = broadcast = 0.0
    if root is None:
        return {"loss_squashed": squashed, "loss_broadcast": broadcast,
                "loss_chance": math.nan}
    todo, seen = deque([root]), {id(root)}
    for _ in range(NODES):
        if not todo:
            break
        node = todo.popleft()
        name = _name(node)
        if name == "LogSoftmaxBackward0":
            op = _input_op(node)
            squashed = SOFTMAX_TWICE if op == "SoftmaxBackward0" else _BOUNDED.get(op, squashed)
        elif name == "BinaryCrossEntropyWithLogitsBackward0":
            op = _input_op(node)
            squashed = SIGMOID_TWICE if op == "SigmoidBackward0" else _BOUNDED.get(op, squashed)
        elif name in _REGRESSION:
            broadcast = max(broadcast, _broadcast(node))
        for nxt, _ in node.next_functions:
            if nxt is not None and id(nxt) not in seen and _name(nxt) != "AccumulateGrad":
                seen.add(id(nxt))
                todo.append(nxt)
    return {"loss_squashed": squashed, "loss_broadcast": broadcast,
            "loss_chance": chance(root)}
