# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 6. End to end: a small CNN, two subtle bugs, found one after the other
#
# A realistic small project: a convolutional network on the 8x8 digit images, a
# data pipeline that standardizes each pixel, SGD with a learning-rate warmup. It
# has two bugs of the kind that survive code review, because each line looks
# right. We find them the way you would: run, read the first failure, open the
# captured tensors, form a hypothesis, check it, fix, run again.

# %%
# %load_ext neuraldbg_nb
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

import neuraldbg_nb

from lessons import accuracy, batches, images, labels, lesson_ok, test_idx, train_idx

# %% [markdown]
# ## The project
#
# The digits come from `lessons.py`, beside this notebook: `images`, the 1,797 8x8 images
# of `load_digits` (shipped with scikit-learn) as they are, shape `(1797, 1, 8, 8)` and
# pixels 0..16, their `labels`, and a split into 1,500 training images (`train_idx`) and
# 297 test images (`test_idx`). `batches(X, y, epochs)` deals shuffled mini-batches of 64,
# the same ones on every run, and `accuracy(model, X, y)` measures a model in evaluation
# mode.
#
# The data pipeline standardizes each pixel with the mean and the standard
# deviation of that pixel over the training set: the textbook recipe.

# %%
pixel_mean = images[train_idx].mean(dim=0)
pixel_std = images[train_idx].std(dim=0)


def normalize(x):
    return (x - pixel_mean) / pixel_std


X_train, y_train = normalize(images[train_idx]), labels[train_idx]
X_test, y_test = normalize(images[test_idx]), labels[test_idx]


# %% [markdown]
# The model: two 3x3 convolutions, a max-pool, two linear layers. The optimizer:
# SGD with momentum at 0.02, with the learning rate ramped up linearly over the
# first 10 steps (a warmup, so the first updates of a fresh network stay small).

# %%
def cnn():
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(1, 16, 3, padding=1), relu1=nn.ReLU(),
        conv2=nn.Conv2d(16, 32, 3, padding=1), relu2=nn.ReLU(),
        pool=nn.MaxPool2d(2), flatten=nn.Flatten(),
        fc1=nn.Linear(32 * 4 * 4, 64), relu3=nn.ReLU(),
        fc2=nn.Linear(64, 10),
    ))


WARMUP = 10


def warmup(step):
    return (step + 1) / WARMUP


def train(model, X, y, schedule, epochs=13):
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    for xb, yb in batches(X, y, epochs):
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
    return loss.item()


# %% [markdown]
# ## First run
#
# `--stop-on error`: if something breaks, stop there and keep the evidence.

# %%
# %%neuraldbg --stop-on error
model = cnn()
train(model, X_train, y_train, warmup)

# %%
run1 = neuraldbg_nb.last_run()
print(run1)

# %% [markdown]
# Stopped at step 0. The first failure is the data: **the input batch has
# non-finite values**, 192 of them, before any layer did anything. The conv layers,
# the loss and the gradients are NaN too, but they come after.
#
# **Step 1: look at the batch.** Where are the NaNs? Count them per pixel over
# the 64 images of the captured batch:

# %%
cap = run1.inspect(run1.first_failure)
batch = cap["batch"]                                 # (64, 1, 8, 8), as the model got it
print(torch.isnan(batch).sum(dim=0)[0])

# %% [markdown]
# Three pixels, NaN in all 64 images: the top-left corner and the two ends of the
# middle row. Not a broken example, then, but a pattern: something in the
# pipeline, per pixel.
#
# **Step 2: hypothesis.** The pipeline divides by each pixel's standard deviation.
# A pixel that is 0 in every image has a standard deviation of 0, and
# `(0 - 0) / 0` is NaN. Check it:

# %%
print("pixels whose standard deviation is 0:", (pixel_std == 0).nonzero()[:, 1:].tolist())
print("pixels that are NaN in the batch:   ", torch.isnan(batch[0]).nonzero()[:, 1:].tolist())
print("their raw values over all 1797 images:", images[:, 0, 0, 0].unique().tolist(),
      images[:, 0, 4, 0].unique().tolist(), images[:, 0, 4, 7].unique().tolist())

# %% [markdown]
# Confirmed: the digits never touch these three pixels. **Fix 1**: a pixel that
# never varies carries no information; divide it by 1 instead of 0 (it becomes 0
# after centring, in every image).
#
# ## Second run

# %%
safe_std = torch.where(pixel_std > 0, pixel_std, torch.ones_like(pixel_std))


def normalize(x):
    return (x - pixel_mean) / safe_std


X_train, X_test = normalize(images[train_idx]), normalize(images[test_idx])
print("non-finite values left in the training set:", int((~torch.isfinite(X_train)).sum()))

# %%
# %%neuraldbg
model = cnn()
last_loss = train(model, X_train, y_train, warmup)
print(f"last loss {last_loss:.3f}")

# %%
run2 = neuraldbg_nb.last_run()
run2_acc = accuracy(model, X_test, y_test)
print(run2)
print(f"\ntest accuracy {run2_acc:.1%}")

# %% [markdown]
# No NaN this time, but the network trained well for a while and then broke. The
# first failure is **one layer, long after the start: its update moved its weights
# by a tenth of their size in one step, as the loss turned up**, and the sentence
# gives the learning rate's path beside it: it rose more than fiftyfold and was
# still rising. (Which layer comes first depends on floating-point rounding, which
# differs between CPUs: the other layers follow at the same step or a few later;
# the story that follows is the same.) After it the training falls apart:
# activations jump, units die, and the network ends at chance.
#
# **Step 1: open the tensors at the first failure**, and compare them with the
# last healthy capture of the same layer (the panel's inspector shows the same
# side by side).

# %%
first = run2.first_failure
cap = run2.inspect(first.layer, first.step)  # the capture nearest the failure
ref = run2.last_healthy(cap)
print(f"{cap.layer}, step {ref.step} (healthy) -> step {cap.step} (first failure)")
for name in ("input", "output", "weight", "grad"):
    a, b = ref[name], cap[name]
    print(f"  {name:>6}: largest |value| {a.abs().max():9.3g} -> {b.abs().max():9.3g}"
          f"   norm {a.norm():9.3g} -> {b.norm():9.3g}")

# %% [markdown]
# The layer's weights are much larger than at its last healthy capture, a few
# dozen steps before, and so is its gradient. Nothing but the optimizer's updates
# changes weights. So **step 2: check what the sentence says.** The trace has every
# layer's weight norm and output size at every step, and the learning rate:

# %%
layer = run2.trace.layer_index(cap.layer)
weight_norm = run2.trace.col("param_norm")[:, layer]
lr = run2.trace.scalar("lr")
output_size = run2.trace.col("act_absmax")[:, layer]
for s in (0, 9, 30, 60, 90, 120, *range(cap.step - 6, cap.step, 2), cap.step):
    print(f"step {s:3d}: learning rate {lr[s]:.3f}   largest |output| {output_size[s]:7.1f}"
          f"   weight norm after the update {weight_norm[s]:6.2f}")


# %% [markdown]
# The weights grew slowly for a hundred steps, then faster and faster, each update
# bigger than the last. And the learning rate was meant to reach 0.02 at step 10
# and stay there: it **never stopped climbing**. By the first failure it is more than ten times
# the intended value. `warmup(step) = (step + 1) / WARMUP` has no ceiling.
# Without the debugger the run would have looked like a healthy training for over a
# hundred steps, then like exploding activations; the first failure names the
# learning rate at the step where its updates outgrew the weights, before any of it.
#
# **Fix 2**: `min(1.0, (step + 1) / WARMUP)`.
#
# ## Third run: both fixes

# %%
def warmup(step):
    return min(1.0, (step + 1) / WARMUP)


# %%
# %%neuraldbg
model = cnn()
last_loss = train(model, X_train, y_train, warmup)
print(f"last loss {last_loss:.3f}")

# %%
run3 = neuraldbg_nb.last_run()
run3_acc = accuracy(model, X_test, y_test)
print(run3)
print(f"\ntest accuracy {run3_acc:.1%} (second run: {run2_acc:.1%})")

# %% [markdown]
# Healthy from the first step to the last.
#
# ## What the debugging took
#
# Neither bug raised an exception. The first made the loss NaN at step 0, which
# everyone notices, but the loss alone does not say whether the data, a layer or
# the optimizer made it. The second looked like a healthy training for over a
# hundred steps. In both, the first failure said where to look and why (the data;
# one layer at one step, under a learning rate still climbing), the captured tensors
# showed what was wrong there (a per-pixel pattern of NaN; weights grown far past
# their healthy size), and the trace confirmed the cause (a zero standard deviation;
# the learning rate's path).
#
# ## The lesson, checked

# %%
f1 = run1.first_failure
assert f1 is not None and f1.kind == "data_anomaly" and f1.layer is None, f1
assert f1.step == 0 and run1.status == "stopped", f1
assert torch.isnan(run1.inspect(f1)["batch"]).any(dim=0)[0].nonzero().tolist() == \
    (pixel_std == 0)[0].nonzero().tolist()
f2 = run2.first_failure
assert f2 is not None and (f2.kind, f2.signal) == ("lr_change", "rise") and f2.step > 50, f2
assert f2.layer in {"conv1", "conv2", "fc1", "fc2"} and "without stopping" in f2.message, f2
assert f2.step < min(e.step for e in run2.events
                     if e.severity == "error" and e.kind != "lr_change"), run2
assert cap["weight"].norm() > 1.2 * ref["weight"].norm(), "the weights grew"
assert run2.trace.scalar("lr")[f2.step] > 5 * 0.02
assert run2_acc < 0.3, run2_acc
assert run3.first_failure is None, run3.first_failure
assert run3_acc > 0.9, run3_acc
lesson_ok(f"{f1.kind} step {f1.step}; then {f2.kind} {f2.layer} step {f2.step}; "
          f"fixed run healthy")
