# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. Exploding gradients: a learning rate that blows up
#
# You sweep learning rates, 0.1, 0.3, 1, 3, and the last one blows up: the loss
# jumps, gradient norms reach 10^4, then everything is NaN. By the time the loss
# curve shows it, every layer looks broken at once. Which of all these alarms is
# the cause, and which are symptoms?
#
# The lesson: the broken run under `%%neuraldbg`; reading the panel's chain of
# events from the first failure on; why gradient clipping alone does not fix it;
# the fix (a sane learning rate, with clipping as a safety net); the healthy run.

# %%
# %load_ext neuraldbg_nb
import torch
import torch.nn.functional as F

import neuraldbg_nb

from lessons import X_test, X_train, accuracy, batches, lesson_ok, mlp, y_train

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
# A plain classifier, nothing unusual about it: `mlp(128, 128, 64)` from `lessons.py`,
# three hidden layers of 128, 128 and 64 ReLU units and a linear head, seeded so that every
# run starts from the same weights. It trains well with SGD at a learning rate of 0.1, as
# we will see at the end.

# %%
mlp(128, 128, 64)

# %% [markdown]
# ## The learning rate that blows up: 3.0

# %%
# %%neuraldbg
model = mlp(128, 128, 64)
opt = torch.optim.SGD(model.parameters(), lr=3.0, momentum=0.9)
for xb, yb in batches(X_train, y_train, epochs=7):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")

# %%
run = neuraldbg_nb.last_run()
broken_acc = accuracy(model)
print(run)
print(f"\ntest accuracy {broken_acc:.1%}")

# %% [markdown]
# ## Reading the chain: cause first, then symptoms
#
# The panel names one first failure and groups everything after it as "what
# followed". Here is the run's timeline, the first event of each kind:

# %%
first_of_kind = {}
for e in run.events:
    if e.severity != "info":
        first_of_kind.setdefault(e.kind, e)
for e in first_of_kind.values():
    print(f"step {e.step:3d}  {e.kind:<20} {e.message}")

# %% [markdown]
# Read it from the top. At step 5, **one update moved the output layer's weights
# by about twice their own size**: that is the first failure. Three steps later
# the same happens to every layer; then the loss jumps by 40x and the ReLUs start
# to die; then the gradients explode (norms of 10^4, a hundred thousand times what
# they were at the start); then the loss and the gradients become NaN, and the
# gradients of the dead layers vanish. "Exploding gradients" is in the list, loud,
# but it came six steps after the first failure.
#
# Three rules tell cause from symptoms, and the panel applies them for you:
#
# 1. **Earliest first.** Everything that follows a failure may be its consequence;
#    nothing that comes before it can be.
# 2. **At the same step, the data, then the layers in forward order, then the
#    update, then the loss, then the gradients.** A broken input makes every
#    layer look broken; a layer whose output jumped makes every gradient
#    explode. Gradients come last because they react to everything.
# 3. **Transitions, not levels.** Each layer is judged against its own recent
#    history, so "jumped 15x at step 5" is found in a layer whatever its scale.
#
# The numbers behind the first failure, from the trace. At step 5 the gradients
# are a few units: larger than before, nowhere near exploding. The weights, though,
# grow by several times their size in one update (the output layer's norm goes
# from 2.9 to 8.5). The update, `lr x gradient`, is what is too big: the learning
# rate is the cause.

# %%
names = run.trace.layer_names
cols = [names.index(n) for n in ("fc1", "fc2", "fc3", "out")]
grad = run.trace.col("grad_norm")[:, cols]
weight = run.trace.col("param_norm")[:, cols]
loss_col = run.trace.scalar("loss")
print("step   loss       gradient norm (fc1 fc2 fc3 out)      "
      "weight norm after the update (fc1 fc2 fc3 out)")
for s in range(3, 13):
    g = " ".join(f"{v:8.2g}" for v in grad[s])
    w = " ".join(f"{v:7.3g}" for v in weight[s])
    print(f"{s:4d} {loss_col[s]:9.3g}   {g}    {w}")

# %% [markdown]
# ## Why clipping alone does not fix it
#
# Gradient clipping (`torch.nn.utils.clip_grad_norm_`) rescales the gradient when
# its norm is above a limit. It removes the loudest symptom, the exploding
# gradient. But with a learning rate of 3 every step is still `3 x` a gradient of
# norm up to 1: the updates are still far too big for these weights. Watched in
# code with `neuraldbg_nb.watch` (no panel):

# %%
model = mlp(128, 128, 64)
opt = torch.optim.SGD(model.parameters(), lr=3.0, momentum=0.9)
with neuraldbg_nb.watch(model, report=False) as clipped:
    for xb, yb in batches(X_train, y_train, epochs=7):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
clipped_acc = accuracy(model)
print(clipped)
print(f"\ntest accuracy {clipped_acc:.1%}")

# %% [markdown]
# No NaN any more, and no exploding gradient: the symptom is gone. The network
# died instead: the oversized steps pushed the ReLUs into the region where they
# output zero for every input (lesson 3). Treating a symptom moved the damage
# elsewhere.
#
# ## The fix
#
# - **A sane learning rate**, the real fix: 0.1 here, thirty times smaller. A quick
#   sweep over a few values on a short run, watched by the panel, finds it.
# - **Clipping as a safety net**: harmless when gradients are ordinary, it caps
#   the rare spike (an unusual batch) before it becomes a blown-up step.

# %%
# %%neuraldbg
model = mlp(128, 128, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for xb, yb in batches(X_train, y_train, epochs=7):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()
print(f"last loss {loss.item():.3f}")

# %%
fixed = neuraldbg_nb.last_run()
fixed_acc = accuracy(model)
print(fixed)
print(f"\ntest accuracy {fixed_acc:.1%} (was {broken_acc:.1%})")

# %% [markdown]
# ## The lesson, checked

# %%
ff = run.first_failure
assert ff is not None and ff.kind == "exploding_update", ff
assert (ff.layer, ff.step) == ("out", 5), ff
exploding = [e for e in run.events if e.kind == "exploding_gradient"]
assert exploding and all(e in run.symptoms for e in exploding), exploding
assert min(e.step for e in exploding) > ff.step
assert any(e.kind == "loss_nonfinite" for e in run.symptoms)
assert clipped.first_failure is not None                   # clipping alone: still broken
assert not any(e.kind == "exploding_gradient" for e in clipped.events)
assert clipped_acc < 0.3 and broken_acc < 0.3
assert fixed.first_failure is None, fixed.first_failure
assert fixed_acc > 0.9, fixed_acc
lesson_ok(f"{ff.kind} {ff.layer} step {ff.step}; "
          f"exploding gradients from step {min(e.step for e in exploding)} are symptoms; "
          f"fixed run healthy")
