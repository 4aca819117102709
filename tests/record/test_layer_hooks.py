"""The layers' hooks are registered once and put on and off between steps: the steps
that are not hooked call no hook, a layer the loop replaces loses its hook for good, and
nothing is left on any module when the watch ends."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.record.layer_hooks import LayerHooks


def _hooks(model: nn.Module) -> dict[str, list[int]]:
    return {name: list(m._forward_hooks) for name, m in model.named_modules() if name}


def test_hooks_go_on_and_off_under_one_id_and_a_replaced_layer_loses_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    old_head = model[2]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 2)
    seen: list[dict[str, list[int]]] = []
    made: list[int] = []  # the hooks made before each time they go on
    real_on = LayerHooks.on

    def on(self: LayerHooks, layers: list) -> None:
        made.append(len(self._made))
        real_on(self, layers)

    monkeypatch.setattr(LayerHooks, "on", on)
    with ndbg.watch(model, report=False) as run:
        for step in range(25):
            if step == 12:  # the loop puts a new head in, with a new optimizer
                model[2] = nn.Linear(16, 2)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            seen.append(_hooks(model))
            opt.step()
    hooked = run.trace.scalar("hooked")
    assert hooked[:3].all() and not hooked[3] and hooked[10], hooked
    # a step whose hooks are off calls none; a hooked one has the same ids every time
    assert seen[3] == {"0": [], "1": [], "2": []}
    first = seen[0]["0"]
    assert first and all(s["0"] == first for s, h in zip(seen[:12], hooked) if h)
    # the new head is hooked from its first measured step; the old one holds no hook
    assert seen[16]["2"] and not old_head._forward_hooks
    assert made[-1] == 3, "each layer's hook is made once (the old head's is gone)"
    assert all(not hooks for hooks in _hooks(model).values())
