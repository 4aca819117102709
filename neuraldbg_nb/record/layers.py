"""Which modules are watched as layers, and what kind of layer each is.

A layer is a module with parameters of its own, or a leaf module (activations, pooling,
norms), minus the ones whose output says nothing about health (dropout, identity,
reshapes), or a module whose forward is code of its own around its children (`composite`:
a residual block, an attention computing its scores from its projections, a model doing
maths after its last layer), where a value can go wrong that none of its children
computed. Plain containers (`nn.Sequential`, `nn.ModuleList`, `nn.ModuleDict`) are not
layers: their output is their last child's. Children that
only hold or compute their parent's weights (attention's output projection, the
parametrizations of `spectral_norm` and `weight_norm`) are part of its layer (`borrowed`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.utils import parametrize

_SKIP = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
         nn.FeatureAlphaDropout, nn.Identity, nn.Flatten, nn.Unflatten)
_RELU_LIKE = (nn.ReLU, nn.ReLU6, nn.Threshold)
_BOUNDED: dict[type[nn.Module], tuple[float, float]] = {
    nn.Sigmoid: (0.0, 1.0), nn.Hardsigmoid: (0.0, 1.0),
    nn.Tanh: (-1.0, 1.0), nn.Softsign: (-1.0, 1.0),
}


def role_of(module: nn.Module) -> str:
    """'relu' where dead units are meaningful, 'bounded' where saturation is, else 'other'."""
    if isinstance(module, _RELU_LIKE):
        return "relu"
    if bounds_of(module) is not None:
        return "bounded"
    return "other"


def bounds_of(module: nn.Module) -> tuple[float, float] | None:
    """The output range of a bounded activation, or None."""
    if isinstance(module, nn.Hardtanh):
        return (float(module.min_val), float(module.max_val))
    for cls, bounds in _BOUNDED.items():
        if isinstance(module, cls):
            return bounds
    return None


def is_nonnegative(module: nn.Module) -> bool:
    """Outputs are >= 0 unless non-finite (ReLU, ReLU6, Sigmoid, ...): the maximum alone
    is the abs-max, and a NaN or +Inf shows in it; -Inf cannot come out."""
    if isinstance(module, (nn.ReLU, nn.ReLU6)):
        return True
    bounds = bounds_of(module)
    return bounds is not None and bounds[0] >= 0


def acts_by_mode(module: nn.Module) -> bool:
    """Does `module` compute differently in training and in evaluation mode? Dropout
    (off in eval), BatchNorm and InstanceNorm that keep running statistics (eval mode
    normalises with them instead of the batch's, and stops updating them), and layers
    with a dropout of their own (attention, stacked RNNs). A model of none of them trains
    the same in either mode."""
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return module.p > 0
    if isinstance(module, (nn.modules.batchnorm._BatchNorm,
                           nn.modules.instancenorm._InstanceNorm)):
        return module.track_running_stats
    if isinstance(module, (nn.MultiheadAttention, nn.RNNBase)):
        return module.dropout > 0
    return False


_BORROWED: dict[type[nn.Module], tuple[str, ...]] = {nn.MultiheadAttention: ("out_proj",)}
"""Children whose forward the parent never calls: it passes their parameters to a
functional call (`F.multi_head_attention_forward` takes `out_proj.weight`). Listed as
layers of their own, they would be rows without activations, numbered after every layer
that runs."""


def borrowed(module: nn.Module) -> list[nn.Module]:
    """The children of `module` that are part of its layer: those whose parameters it
    uses without calling them (`_BORROWED`), and its parametrizations (`spectral_norm`,
    `weight_norm`), which compute its weight from parameters of their own. Listed as
    layers, a parametrization's "output" would be the weight, and a fault in a
    parametrized weight would be named after the parametrization, not after its layer."""
    held = getattr(module, "parametrizations", None) if parametrize.is_parametrized(module) \
        else None
    found: list[nn.Module] = [held] if isinstance(held, nn.Module) else []
    for cls, names in _BORROWED.items():
        if isinstance(module, cls):
            found += [c for n in names if isinstance(c := getattr(module, n, None), nn.Module)]
    return found


def own_named_params(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters of the layer `module`: its own, and its borrowed children's (named
    from it, e.g. "out_proj.weight")."""
    params = list(module.named_parameters(recurse=False))
    for child in borrowed(module):
        prefix = next(n for n, c in module.named_children() if c is child)
        params += [(f"{prefix}.{n}", p) for n, p in child.named_parameters()]
    return params


def own_params(module: nn.Module) -> list[nn.Parameter]:
    return [p for _, p in own_named_params(module)]


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
"""Containers whose forward computes nothing of its own: `nn.Sequential` chains its
children (its output is its last child's), the lists and dicts have no forward."""


def composite(module: nn.Module) -> bool:
    """A module with children and no weights of its own whose forward is its own code
    (not a plain container's, `_CONTAINERS`). Its output is what that code made of its
    children's, so a value that went wrong there (a square root of a negative difference,
    a softmax over a row all masked, a division by a batch's zero spread) is its own:
    unhooked, it would first show in the next layer's output and be blamed on that
    layer. Numbered at its first output (`Forward.post`), it comes after its children in
    forward order, so a failure that began in a child is still the child's; its row
    holds what it returns, its last child's output too where it passes that on (a
    wrapper whose own code runs only on some steps has its history, and its place in
    forward order, from the first). A model's root is numbered at its first output of
    its own: most return their last layer's output, and theirs is last in forward order
    whenever it comes; a loss returned first (a transformers model given labels) is no
    activation."""
    if next(module.children(), None) is None or own_params(module):
        return False
    forward = type(module).forward
    return forward is not nn.Module.forward and not any(
        forward is c.forward for c in _CONTAINERS)


def is_layer(module: nn.Module) -> bool:
    if isinstance(module, _SKIP):
        return False
    has_children = next(module.children(), None) is not None
    return bool(own_params(module)) or not has_children or composite(module)


def iter_layers(root: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """(qualified name, module) for each layer under root; a shared module appears once,
    a borrowed one (`borrowed`) not at all."""
    inside: set[int] = set()
    for name, module in root.named_modules(prefix=prefix.rstrip(".")):
        if id(module) in inside:
            continue
        for child in borrowed(module):
            inside.update(id(m) for m in child.modules())
        if is_layer(module):
            yield (name or type(module).__name__), module


def first_tensor(obj: object, floating: bool = True) -> torch.Tensor | None:
    """The first tensor in a module's output or arguments (tensor, tuple, list, dict).

    Tuple outputs (attention weights, RNN states) and dict outputs (HF-style models) are
    summarised by their first (floating-point) tensor; None and other objects give None.
    """
    if isinstance(obj, torch.Tensor):
        if floating and not obj.is_floating_point():
            return None
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        for item in obj:
            found = first_tensor(item, floating)
            if found is not None:
                return found
    return None


def tensors_in(obj: object) -> list[torch.Tensor]:
    """Every tensor in a module's output (tensor, tuple, list, dict, nested), in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in tensors_in(item)]
    return []


def storage_at(t: torch.Tensor) -> int:
    """The address of `t`'s memory, shared by its views and detached copies; 0 where it
    has none to compare (sparse and jagged layouts, tensor subclasses without one)."""
    if t.layout != torch.strided:
        return 0
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage of its own: nothing to match
        return 0
