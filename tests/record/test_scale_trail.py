"""The loss scales of a step's scaled backwards (`record.amp_scale.ScaleTrail`), read from
a real GradScaler whose steps overflow: the first and the last, copies taken at each
backward (the scaler halves its scale in place after a skipped step)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from models import mlp

from neuraldbg_nb.record import reductions
from neuraldbg_nb.record.amp_scale import ScaleReader, ScaleTrail


def _iterations(skip: int, scaler: torch.amp.GradScaler, reader: ScaleReader,
                trail: ScaleTrail, sc: reductions.Scalars) -> None:
    setup = mlp()
    model = setup.model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(skip + 1):
        x, y = setup.batch(step)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        root = scaler.scale(loss)
        unscaled = reader.unscaled(root)
        assert unscaled is not None and torch.allclose(unscaled, loss.detach().float())
        trail.heard(reader.scale, sc)
        root.backward()
        if step < skip:  # an overflow: the scaler skips the step and halves its scale
            model[0].weight.grad.view(-1)[0] = float("inf")
        scaler.step(opt)
        scaler.update()


def test_the_trail_holds_the_first_and_last_scale_of_skipped_iterations():
    scaler, reader, trail, sc = torch.amp.GradScaler("cpu"), ScaleReader(), ScaleTrail(), \
        reductions.Scalars()
    _iterations(5, scaler, reader, trail, sc)
    assert trail.values(sc.to_host()) == {"amp_scale_from": 65536.0,
                                          "amp_scale": 65536.0 / 2 ** 5}
    trail.new_step()
    assert trail.values([]) == {}


def test_a_backward_no_scaler_scaled_leaves_no_scale():
    reader = ScaleReader()
    w = torch.ones(3, requires_grad=True)
    assert reader.unscaled((w * torch.tensor(2.0)).sum()) is None
    assert reader.scale is None
