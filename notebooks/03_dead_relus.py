# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 3. Dead ReLUs: units that stop firing and never come back
#
# A ReLU outputs `max(0, x)`. If a unit's input `x` is negative for every example,
# the unit outputs 0 for every example, and its gradient is 0 for every example:
# nothing will ever move its weights again. The unit is dead. Nothing crashes and
# nothing is NaN: the network keeps training with what is left of it, and you get
# a worse model without being told.
#
# Here two small mistakes, each of which you could survive alone, kill 90% of a
# layer in the first few steps: the pixels are fed raw (0..16, not scaled to
# 0..1), and Adam runs with a learning rate of 0.03, ten times the usual.

# %%
# %load_ext neuraldbg_nb
import torch
import torch.nn.functional as F

import neuraldbg_nb

from lessons import X_test, X_train, accuracy, batches, lesson_ok, mlp, y_test, y_train

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
# ## The model and the mistake
#
# The model is `mlp(128, 128)` from `lessons.py`: two hidden layers of 128 ReLU units
# (`fc1`, `relu1`, `fc2`, `relu2`) and a linear head, seeded so that every run starts from
# the same weights. The first mistake is in the data; the second, the learning rate, is
# in the training below.

# %%
Xraw_train, Xraw_test = X_train * 16, X_test * 16   # the mistake: pixels 0..16
mlp(128, 128)

# %%
# %%neuraldbg
model = mlp(128, 128)
opt = torch.optim.Adam(model.parameters(), lr=0.03)
for xb, yb in batches(Xraw_train, y_train, epochs=7):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")

# %%
run = neuraldbg_nb.last_run()
broken_acc = accuracy(model, Xraw_test, y_test)
print(run)
print(f"\ntest accuracy {broken_acc:.1%}")


# %% [markdown]
# ## What the panel shows
#
# **`relu1`: about 90% of its units dead (zero for the whole batch), was 5%**, and
# the row stays magenta (error) to the end. It is the only failure. The test accuracy is
# not even bad, which is exactly the danger: the network works with the ten or so
# first-layer units it has left out of 128, and nothing but the panel says so.
#
# **When did they die?** The panel computes the full activation statistics, dead
# units among them, on sampled steps: every 10 steps by default
# (`--sample-every`), less often when they would cost more than 2% of the training
# time. So it dates the death at the first sampled step that saw it. The tensors
# captured for reference at steps 0, 1, 2, 4 and 8 pin it down; `run.inspect`
# opens them, the same as a click on the map:

# %%
def dead_fraction(out):
    """Units that output 0 for every example of the batch."""
    return (out.amax(dim=0) <= 0).float().mean().item()


for step in (0, 1, 2, 4, 8):
    cap = run.inspect("relu1", step)
    print(f"step {step}: {dead_fraction(cap['output']):4.0%} of relu1 dead in the batch")

# %% [markdown]
# Most of the layer died within four steps.
#
# ## Why it happened
#
# Adam moves every weight by about `lr` per step, whatever the size of its
# gradient. A unit's input is `w . x + b`: one step can shift it by up to
# `lr x sum(|x|)`. With raw pixels that sum is in the hundreds. Compare with how
# far from zero the units' inputs were at step 0 (the input of `relu1` is the
# output of `fc1`, captured at step 0):

# %%
start = run.inspect("relu1", 0)["input"]               # fc1's output at step 0
print(f"inputs of relu1 at step 0: typically {start.abs().mean():.1f} away from zero")
for label, data in (("raw pixels 0..16", Xraw_train), ("pixels scaled to 0..1", X_train)):
    reach = 0.03 * data.abs().sum(dim=1).mean()
    print(f"{label:>22}: one Adam step at lr 0.03 can move them by up to {reach:.1f}")

# %% [markdown]
# One step can carry a unit's input far past zero, for every image at once.
#
# ## Why they never come back
#
# Look at the first failure's capture: for each dead unit, its input (`fc1`'s
# output) is negative for every image of the batch. On the whole training set
# it is the same, and so the gradient reaching those units' weights is exactly
# zero. To prove the point, train three more epochs with a gentle learning rate:

# %%
cap = run.inspect(run.first_failure)
print(cap.note or f"capture of {cap.layer} at step {cap.step}")
dead_in_batch = cap["output"].amax(dim=0) <= 0
print(f"largest input of a dead unit over the batch: {cap['input'][:, dead_in_batch].max():.2f}")

with torch.no_grad():
    dead = model.relu1(model.fc1(Xraw_train)).amax(dim=0) <= 0
model.zero_grad()
F.cross_entropy(model(Xraw_train), y_train).backward()
grad_rows = model.fc1.weight.grad[dead]
print(f"{int(dead.sum())} of 128 units dead on all {len(Xraw_train)} training images; "
      f"gradient on their weights: {grad_rows.abs().max():.1f}")

gentle = torch.optim.Adam(model.parameters(), lr=1e-3)
for xb, yb in batches(Xraw_train, y_train, epochs=3, seed=1):
    gentle.zero_grad()
    F.cross_entropy(model(xb), yb).backward()
    gentle.step()
with torch.no_grad():
    still_dead = model.relu1(model.fc1(Xraw_train)).amax(dim=0) <= 0
print(f"after 3 more epochs: {int(still_dead.sum())} dead, "
      f"all of the earlier ones among them: {bool(still_dead[dead].all())}")

# %% [markdown]
# ## The fix
#
# Take away what made the steps too big for the units:
#
# - **Scale the inputs** (to 0..1 here, or standardize them): the same weight step
#   then moves a unit's input 16 times less.
# - **A learning rate in the usual range** for Adam: 3e-3.
#
# Other remedies you will meet: **LeakyReLU** (a small slope below zero, so a
# unit always gets some gradient and can come back), an initialization and a
# **normalization layer** (BatchNorm/LayerNorm before the ReLU) that keep the
# inputs centred around zero, and a **learning-rate warmup**, since units mostly
# die in the first, largest steps.

# %%
# %%neuraldbg
model = mlp(128, 128)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
for xb, yb in batches(X_train, y_train, epochs=7):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")

# %%
fixed = neuraldbg_nb.last_run()
fixed_acc = accuracy(model)
with torch.no_grad():
    fixed_dead = model.relu1(model.fc1(X_train)).amax(dim=0) <= 0
print(fixed)
print(f"\ntest accuracy {fixed_acc:.1%} (was {broken_acc:.1%}); "
      f"relu1 units dead on all training images: {int(fixed_dead.sum())} of 128 "
      f"(was {int(dead.sum())})")

# %% [markdown]
# ## The lesson, checked

# %%
ff = run.first_failure
assert ff is not None and ff.kind == "dead_units" and ff.layer == "relu1", ff
assert ff.step <= 40, ff                     # found at a sampled step soon after
assert dead_fraction(run.inspect("relu1", 0)["output"]) < 0.2
assert dead_fraction(run.inspect("relu1", 8)["output"]) > 0.8
assert dead.float().mean() > 0.8 and bool(still_dead[dead].all())
assert grad_rows.abs().max() == 0
assert fixed.first_failure is None, fixed.first_failure
assert fixed_dead.float().mean() < 0.3 and fixed_acc > 0.9, (fixed_dead.sum(), fixed_acc)
lesson_ok(f"{ff.kind} {ff.layer} step {ff.step}; they stay dead; fixed run healthy")
