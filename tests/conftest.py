"""Shared test settings: one CPU thread, deterministic torch, the engine's own errors
raised (NEURALDBG_STRICT), and a check after every test that no watch left a hook
behind."""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

sys.path.insert(0, os.path.dirname(__file__))

torch.set_num_threads(1)
warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")
# an error in the engine's own hooks fails the test, with its traceback, where a user's
# training would go on unwatched (the kernels and servers the tests start inherit it);
# test_engine_errors.py turns it off to test exactly that
os.environ["NEURALDBG_STRICT"] = "1"

ORIGINAL_BACKWARD = torch.autograd.backward

GLOBAL_HOOK_DICTS = {
    "nn.modules.module._global_forward_hooks": nn_module._global_forward_hooks,
    "nn.modules.module._global_forward_pre_hooks": nn_module._global_forward_pre_hooks,
    "nn.modules.module._global_forward_hooks_always_called":
        nn_module._global_forward_hooks_always_called,
    "nn.modules.module._global_backward_hooks": nn_module._global_backward_hooks,
    "nn.modules.module._global_backward_pre_hooks": nn_module._global_backward_pre_hooks,
    "optim.optimizer._global_optimizer_pre_hooks": optim_module._global_optimizer_pre_hooks,
    "optim.optimizer._global_optimizer_post_hooks": optim_module._global_optimizer_post_hooks,
}


def leftover_global_hooks() -> list[str]:
    """Names of the global hook registries that are not empty, and a wrapped backward."""
    left = [f"{name} ({len(d)})" for name, d in GLOBAL_HOOK_DICTS.items() if d]
    if torch.autograd.backward is not ORIGINAL_BACKWARD:
        left.append("torch.autograd.backward is still wrapped")
    return left


def leftover_module_hooks(model: torch.nn.Module) -> list[str]:
    left = []
    for name, m in model.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
                     "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
                     "_backward_hooks", "_backward_pre_hooks"):
            if getattr(m, attr, None):
                left.append(f"{name or '<root>'}.{attr}")
    return left


@pytest.fixture(autouse=True)
def _no_hook_leaks():
    """Every test must leave torch as it found it (a leak is cleaned up and reported)."""
    torch.manual_seed(0)
    before = leftover_global_hooks()
    yield
    after = leftover_global_hooks()
    if after and not before:
        for d in GLOBAL_HOOK_DICTS.values():
            d.clear()
        torch.autograd.backward = ORIGINAL_BACKWARD
        pytest.fail(f"hooks left behind after the test: {after}")
