"""Which modules are watched as layers, and what kind of layer each is.

A layer is a module with parameters of its own, or a leaf module (activations, pooling,
norms), minus the ones whose output says nothing about health (dropout, identity,
reshapes). Containers are not layers: their output is their last child's.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

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


def own_params(module: nn.Module) -> list[nn.Parameter]:
    return list(module.parameters(recurse=False))


def is_layer(module: nn.Module) -> bool:
    if isinstance(module, _SKIP):
        return False
    has_children = next(module.children(), None) is not None
    return bool(own_params(module)) or not has_children


def iter_layers(root: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """(qualified name, module) for each layer under root; a shared module appears once."""
    for name, module in root.named_modules(prefix=prefix.rstrip(".")):
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
