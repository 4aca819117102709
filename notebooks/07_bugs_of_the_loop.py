# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 7. Bugs of the loop: training that runs, and is not the training you wrote
#
# Not every broken run goes NaN. Three bugs that notebooks make every day leave
# no error on the map: a model left in evaluation mode after an evaluation,
# a layer replaced after the optimizer was made, and an optimizer made for an
# earlier copy of the model. The loss falls (or just sits there), no number
# explodes, and no other tool says a word. A fourth, a loop without
# `zero_grad()`, does break the training, dozens of steps later, in a layer that
# is not to blame.
#
# The lesson: each bug under `%%neuraldbg`, what the run says about it, and the
# one-line fix.

# %%
# %load_ext neuraldbg_nb
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

import neuraldbg_nb

from lessons import X_test, X_train, accuracy, batches, lesson_ok, y_test, y_train

# %% [markdown]
# ## The data
#
# `load_digits` ships with scikit-learn, so nothing is downloaded: 1,797 handwritten
# digits, 8x8 pixels, each pixel an integer from 0 to 16. `lessons.py`, beside this
# notebook, keeps 297 of them aside to measure accuracy on digits the model never trained
# on, and scales the pixels to 0..1: `X_train, y_train` and `X_test, y_test`.
# `batches(X, y, epochs)` deals them in shuffled mini-batches (the same ones on every run),
# and `accuracy(model)` is the fraction of the test images the model gets right.

# %%
print(f"{len(X_train)} training images, {len(X_test)} test images, "
      f"{len(X_train) // 64} steps per epoch")


# %% [markdown]
# ## The model
#
# A classifier with BatchNorm and dropout: the two kinds of layer that compute
# differently in training mode (`model.train()`) and in evaluation mode
# (`model.eval()`).

# %%
def net():
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(
        fc1=nn.Linear(64, 128), bn1=nn.BatchNorm1d(128), relu1=nn.ReLU(),
        drop=nn.Dropout(0.3),
        fc2=nn.Linear(128, 64), relu2=nn.ReLU(),
        out=nn.Linear(64, 10),
    ))


net()


# %% [markdown]
# ## Bug 1: an evaluation that leaves the model in evaluation mode
#
# After each epoch we measure the test accuracy. The helper puts the model in
# evaluation mode, as it must, and forgets to put it back.

# %%
@torch.no_grad()
def test_accuracy(model):
    model.eval()
    return (model(X_test).argmax(1) == y_test).float().mean().item()
    # model.train() is missing


# %%
# %%neuraldbg
model = net()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for epoch in range(4):
    for xb, yb in batches(X_train, y_train, epochs=1, seed=epoch):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    print(f"epoch {epoch}: test accuracy {test_accuracy(model):.1%}")

# %%
in_eval = neuraldbg_nb.last_run()
print(in_eval)

# %% [markdown]
# The first epoch (23 steps) trained in training mode. From step 23 on, after the
# first evaluation, the model trained in evaluation mode: dropout off, and
# BatchNorm normalising each batch with running statistics that it no longer
# updates, frozen at what the first epoch left. The run says so at the first step
# it happened, with how many layers it concerns: a warning, which becomes an error
# (and the first failure, dated from step 23) once it has gone on for 50 steps. The evaluations themselves, run
# under `torch.no_grad()`, are not recorded: they train nothing.
#
# On this small, easy dataset the accuracy hardly shows it, and that is the
# point: the model that trained is not the one you designed (no dropout's
# regularization, BatchNorm fixed after one epoch), and neither the loss nor the
# accuracy tells you. The fix is one line, `model.train()` after evaluating (the
# `accuracy` helper of `lessons.py` does it).
#
# A model kept in evaluation mode on purpose is not flagged when it has nothing
# to train (a frozen teacher), nor a BatchNorm layer put in evaluation mode inside
# a model that trains (fine-tuning with its statistics kept).
#
# ## Bug 2: a layer replaced after the optimizer was made
#
# You try a new first layer, in a cell after the one that made the optimizer. The
# optimizer still holds the old layer's parameters. The new layer gets gradients
# in every backward, and never moves.

# %%
# %%neuraldbg
model = net()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model.fc1 = nn.Linear(64, 128)   # a new first layer, after the optimizer
for xb, yb in batches(X_train, y_train, epochs=3):
    opt.zero_grad()
    F.cross_entropy(model(xb), yb).backward()
    opt.step()
left_out_acc = accuracy(model)
print(f"test accuracy {left_out_acc:.1%}")

# %%
left_out = neuraldbg_nb.last_run()
print(left_out)
stuck = next(e for e in left_out.events if e.kind == "weights_not_updated")
print(stuck.message)

# %% [markdown]
# The accuracy is fine: the other layers learn to use whatever the random first
# layer computes. What trained is not what you meant to try. The run reads the
# optimizer's parameter groups at every step: from step 0, `fc1`'s weights get
# gradients that no optimizer holds, while the optimizer still holds weights the
# model no longer has, so it names `fc1` as replaced after the optimizer was built,
# an error and the first failure. Its sampled updates say the same a few steps
# later: `fc1`'s update was exactly 0 at steps 0 and 10 although its gradient was
# not. The fix: make the optimizer after the model is final.
#
# ## Bug 3: an optimizer made for an earlier copy of the model
#
# The cell that makes the model is run again (to start over), but not the cell
# that makes the optimizer. The optimizer trains the old copy; the new one never
# changes. Here both cells are one, in the wrong order:

# %%
# %%neuraldbg
model = net()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model = net()                    # the model's cell, run again
for xb, yb in batches(X_train, y_train, epochs=3):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
stale_acc = accuracy(model)
print(f"last loss {loss.item():.3f}, test accuracy {stale_acc:.1%}")

# %%
stale = neuraldbg_nb.last_run()
print(stale)

# %% [markdown]
# The loss never falls, and nothing is NaN. The optimizer stepped every time, but
# none of the parameters it trains belong to the model that was watched, so no
# step was recorded: the run says which optimizer problem it is, and what to do.
#
# ## Bug 4: no `zero_grad()`
#
# PyTorch adds each backward's gradients to what the parameters already hold, so
# that several backwards can make one step. Without `opt.zero_grad()` in the loop,
# every step's gradient is the sum of all the batches so far.

# %%
# %%neuraldbg
model = net()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for xb, yb in batches(X_train, y_train, epochs=3):
    loss = F.cross_entropy(model(xb), yb)   # opt.zero_grad() is missing
    loss.backward()
    opt.step()
no_zero_acc = accuracy(model)
print(f"last loss {loss.item():.3f}, test accuracy {no_zero_acc:.1%}")

# %%
no_zero = neuraldbg_nb.last_run()
print(no_zero)

# %% [markdown]
# The updates grew with every step until the layers broke. Those breakages are
# what a loss curve or a per-layer monitor shows, dozens of steps in; the first
# failure is the loop itself, at step 1, the first step whose gradients still held
# the last one's. (It is told from one weight's gradient: the same tensor as at
# the last step, changed only by this step's backward.)
#
# ## All four fixed
#
# Evaluate with `accuracy` (which goes back to training mode), make the optimizer
# from the final model, and zero the gradients in every step:

# %%
# %%neuraldbg
model = net()
model.fc1 = nn.Linear(64, 128)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for epoch in range(4):
    for xb, yb in batches(X_train, y_train, epochs=1, seed=epoch):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    fixed_acc = accuracy(model)
    print(f"epoch {epoch}: test accuracy {fixed_acc:.1%}")

# %%
fixed = neuraldbg_nb.last_run()
print(fixed)

# %% [markdown]
# ## The lesson, checked

# %%
quiet = ("eval_mode", "weights_not_updated")
(e1, held) = [e for e in in_eval.events if e.kind == "eval_mode"]
assert (e1.step, e1.layer, e1.severity, e1.value) == (23, None, "warning", 2), e1
assert (held.step, held.severity) == (23 + 49, "error"), held
assert in_eval.first_failure is e1, in_eval.first_failure
e3 = left_out.first_failure
assert (e3.kind, e3.layer, e3.step) == ("not_in_optimizer", "fc1", 0), e3
(e2,) = [e for e in left_out.events if e.kind == "weights_not_updated"]
assert (e2.layer, e2.step, e2.severity) == ("fc1", 10, "warning"), e2
assert left_out_acc > 0.9, left_out_acc
assert stale.trace.n_steps == 1 and stale_acc < 0.3, stale_acc
assert any("an earlier copy of this model" in n for n in stale.notes), stale.notes
e4 = no_zero.first_failure
assert (e4.kind, e4.step, e4.layer) == ("grads_not_zeroed", 1, None), e4
assert no_zero.symptoms, "it broke the training"
assert fixed.first_failure is None, fixed.first_failure
assert not [e for e in fixed.events if e.kind in quiet], fixed.events
assert fixed_acc > 0.9, fixed_acc
lesson_ok(f"{e1.kind} step {e1.step}; {e3.kind} {e3.layer} step {e3.step}, "
          f"{e2.kind} step {e2.step}; "
          f"an optimizer of an earlier model named; {e4.kind} step {e4.step}; "
          f"fixed run quiet")
