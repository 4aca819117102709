# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5. Thresholds and regime shifts: re-judging a finished run
#
# Every detector has a threshold, and no threshold is right for every model. The
# panel lets you move them after the run and see the whole run re-classified at
# once, without training again: the recorded trace is kept, and detection is a
# pure function of the trace and the thresholds.
#
# This lesson: a training that goes wrong in the middle, the sliders (and their
# code form, `run.reclassify(...)`), what a threshold too loose or too tight does
# to the diagnosis, and why the panel looks at **transitions** (a layer against
# its own recent history) rather than absolute values.

# %%
# %load_ext neuraldbg_nb
import time
from itertools import chain

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
# The plain classifier of lesson 2, `mlp(128, 128, 64)` from `lessons.py`: three hidden
# ReLU layers and a linear head, seeded so that every run starts from the same weights.

# %%
mlp(128, 128, 64)

# %% [markdown]
# ## The story: new data arrives
#
# The model is trained on a first export of 1,000 images. Then a second export of
# 500 more arrives and training goes on with it. The second export was written by
# another script, which forgot to divide the pixels by 16: its values are 0..16,
# not 0..1.

# %%
first_X, first_y = X_train[:1000], y_train[:1000]
second_X, second_y = X_train[1000:] * 16, y_train[1000:]   # the other script: 0..16


def data(second_export):
    """Four epochs on the first export, then eight on the second."""
    return chain(batches(first_X, first_y, epochs=4),
                 batches(second_export, second_y, epochs=8))


switch = 4 * (len(first_X) // 64)
print(f"the second export comes in at step {switch}")

# %%
# %%neuraldbg
model = mlp(128, 128, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for xb, yb in data(second_X):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")

# %%
run = neuraldbg_nb.last_run()
print(run)


# %% [markdown]
# The first failure is the data: **the input batch's scale jumped 16x** at the step
# the second export came in. It is only a warning on its own (a 16x jump is below
# the `jump_error` factor of 100 that makes it an error), but it starts the chain
# of errors that follows: the loss diverges the next step, updates and gradients
# explode, the ReLUs die.
#
# ## The sliders
#
# When the run has finished, the panel shows five sliders. Dragging one re-judges
# the whole recorded run under the new value, in milliseconds, and redraws the map,
# the events and the first failure:
#
# | slider | threshold | default | meaning |
# |---|---|---|---|
# | vanishing grad < | `vanish` | 1e-6 | a layer's gradient norm below this has vanished |
# | exploding grad > | `explode` | 1e3 | above this it has exploded |
# | regime jump x | `jump` | 10 | a change by this factor against the layer's recent history is a regime shift |
# | dead units >= | `dead` | 0.5 | fraction of a ReLU layer's units that output 0 for the whole batch |
# | saturated >= | `saturated` | 0.5 | fraction of a sigmoid/tanh layer's outputs stuck at the bounds |
#
# In code, `run.reclassify(**changes)` does the same and returns a new `Run` over
# the same recorded trace and captures: nothing is trained again. It also takes the
# settings without a slider (`jump_error`, `window`, `patience`, `lookback`, ...;
# see `neuraldbg_nb.Thresholds`). The same options exist on the magic's line,
# e.g. `%%neuraldbg --jump 5`.

# %%
def judge(r, label):
    ff = r.first_failure
    errors = sum(e.severity == "error" for e in r.events)
    warnings = sum(e.severity == "warning" for e in r.events)
    what = f"{ff.kind} at step {ff.step} ({ff.layer or ff.signal})" if ff else "no failure"
    print(f"{label:<22} {errors:3d} errors {warnings:3d} warnings   first failure: {what}")


judge(run, "defaults")
started = time.perf_counter()
loose = run.reclassify(jump=100)
took = time.perf_counter() - started
judge(loose, "jump=100 (loose)")
tight = run.reclassify(jump=3)
judge(tight, "jump=3 (tight)")
strict = run.reclassify(jump_error=10)
judge(strict, "jump_error=10")
print(f"\n(re-judging {run.trace.n_steps} steps x {run.trace.n_layers} layers took "
      f"{1000 * took:.0f} ms)")

# %% [markdown]
# - **Too loose (`jump=100`)**: the 16x jump of the input no longer counts, and
#   the first failure becomes the loss divergence one step later: a symptom. A
#   loose threshold does not make a run healthier; it makes the panel blame the
#   wrong thing.
# - **Too tight (`jump=3`)**: more warnings, ordinary fluctuations among them; the
#   first failure stays the data, because the root-cause order (data first, then
#   layers in forward order, then updates, loss, gradients) does not depend on
#   the count.
# - **`jump_error=10`**: the 16x jump of the input is an error in itself, so it
#   would be a failure even if nothing broke after it. Useful when any sudden
#   change of scale in your data should stop you.
#
# ## Why transitions, not absolute values
#
# Look at what the input did: its largest absolute value went from 1 to 16 in one
# step.

# %%
scale = run.trace.scalar("in_absmax")
for s in range(switch - 3, switch + 3):
    print(f"step {s}: largest |input| {scale[s]:5.1f}")

# %% [markdown]
# An input scale of 16 is nothing unusual in itself: raw digits are 0..16, photos
# 0..255, standardized data a few units. No absolute line on input values could
# flag this run without flagging half the datasets in the world. What is wrong
# is the **change**: 1 one step, 16 the next.
#
# The same holds inside the network. Here is the same training with the second
# export scaled correctly, the healthy run:

# %%
# %%neuraldbg
model = mlp(128, 128, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for xb, yb in data(second_X / 16):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")

# %%
healthy = neuraldbg_nb.last_run()
healthy_acc = accuracy(model)
print(healthy)
print(f"test accuracy {healthy_acc:.1%}\n")
g = healthy.trace.col("grad_norm")
for name in ("fc1", "fc2", "fc3", "out"):
    col = g[:, healthy.trace.layer_index(name)]
    print(f"{name:>4}: gradient norm between {col.min():.3f} and {col.max():.2f} in this healthy run")

# %% [markdown]
# Healthy gradient norms span two orders of magnitude over one run of this small
# model, and other models live at 1e-7 or at 100. An absolute line tight enough to
# see a 16x change in one of them fires on ordinary training of another. Try it:
# an "exploding" line at 2 fires on the healthy run, while the regime-shift
# detector, which measures each layer against its own last steps (in log space,
# over `window` = 20 steps), stays quiet on it and finds the jump in the broken one.

# %%
judge(healthy, "healthy, defaults")
judge(healthy.reclassify(explode=2), "healthy, explode=2")

# %% [markdown]
# The absolute lines are still there, for what has no history to compare with: a
# network born with vanishing gradients (lesson 1) is vanishing from step 0.
# Use the sliders to fit them to a model: move one, and the whole run is judged
# again under it.
#
# ## The lesson, checked

# %%
ff = run.first_failure
assert ff is not None and ff.kind == "data_anomaly" and ff.signal == "input_scale", ff
assert (ff.layer, ff.step) == (None, switch), ff
lf = loose.first_failure
assert lf is not None and lf.kind == "loss_divergence" and lf.step > switch, lf
tf = tight.first_failure
assert (tf.kind, tf.signal, tf.layer, tf.step) == (ff.kind, ff.signal, ff.layer, ff.step), tf
assert sum(e.severity == "warning" for e in tight.events) > \
    sum(e.severity == "warning" for e in run.events)
sf = strict.first_failure
assert sf is not None and sf.kind == "data_anomaly" and sf.severity == "error", sf
assert healthy.first_failure is None, healthy.first_failure
assert healthy.reclassify(explode=2).first_failure.kind == "exploding_gradient"
assert healthy_acc > 0.9, healthy_acc
lesson_ok(f"{ff.kind} ({ff.signal}) step {ff.step}; with jump=100 the first "
          f"failure becomes a symptom ({lf.kind} step {lf.step}); healthy run quiet")
