# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. NaN hunting: is it the data or the model?
#
# A NaN spreads. One NaN in one input makes that example's output NaN in every
# layer; the loss is a mean over the batch, so it is NaN; every gradient is NaN;
# after the update every weight is NaN, and from then on every output of every
# example. One step after it appears, the whole network is NaN and the question
# "where did it come from?" has no answer left in the model.
#
# It has one at the step it appeared: follow the forward pass, and the first place
# a non-finite value shows up is the origin. If it is **the input batch**, fix the
# data. If the input is finite and **a layer** turns it into NaN, fix the layer.
# `%%neuraldbg --stop-on error` stops the training right there, before the
# optimizer applies the NaN gradients, with the step's tensors captured.
#
# Two runs below, each with one NaN: one from a batch, one from a layer.

# %%
# %load_ext neuraldbg_nb
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

import neuraldbg_nb

from lessons import X_test, X_train, accuracy, batches, lesson_ok, y_train

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
# A classifier that standardizes each image itself (mean 0, standard deviation 1
# per image) as its first layer, a common way to make a model independent of
# brightness and contrast that also travels with the model when it is deployed.

# %%
class Standardize(nn.Module):
    """Each image to mean 0 and standard deviation 1."""

    def __init__(self, eps=0.0):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return (x - x.mean(dim=1, keepdim=True)) / (x.std(dim=1, keepdim=True) + self.eps)


def classifier(eps=0.0):
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(
        standardize=Standardize(eps),
        fc1=nn.Linear(64, 128), relu1=nn.ReLU(),
        fc2=nn.Linear(128, 64), relu2=nn.ReLU(),
        out=nn.Linear(64, 10),
    ))


def train(model, X, y):
    """The training loop of this lesson (SGD, 7 epochs)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for xb, yb in batches(X, y, epochs=7):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()


# %% [markdown]
# ## Two datasets, one problem each
#
# - **A missing value.** One pixel of image 1000 is NaN, as a corrupted file or a
#   failed sensor read leaves it in a real dataset.
# - **A blank image.** Image 700 is all zeros: a blank scan. Every value is a
#   perfectly good number.
#
# We also work out at which step each image comes in a batch, to check the panel
# against it.

# %%
X_missing = X_train.clone()
X_missing[1000, 27] = float("nan")

X_blank = X_train.clone()
X_blank[700] = 0.0


def step_of(X, index):
    """The first training step whose batch holds image `index` of X."""
    image = X[index].nan_to_num(-1)
    for step, (xb, _) in enumerate(batches(X, y_train, epochs=7)):
        if (xb.nan_to_num(-1) == image).all(dim=1).any():
            return step


missing_step, blank_step = step_of(X_missing, 1000), step_of(X_blank, 700)
print(f"image 1000 (missing value) comes at step {missing_step}; "
      f"image 700 (blank) at step {blank_step}")

# %% [markdown]
# ## Run 1: the missing value

# %%
# %%neuraldbg --stop-on error
model = classifier()
train(model, X_missing, y_train)

# %%
run_data = neuraldbg_nb.last_run()
print(run_data)

# %% [markdown]
# The training stopped at the step the image came in. The first failure has no
# layer: **the input batch has non-finite values**. Every layer's NaN, the loss's
# and the gradients' are listed after it as symptoms, because at the same step the
# data comes first. The captured batch says which example and which pixel:

# %%
cap = run_data.inspect(run_data.first_failure)
batch = cap["batch"]
rows = torch.isnan(batch).any(dim=1).nonzero().flatten().tolist()
pixels = torch.isnan(batch[rows[0]]).nonzero().flatten().tolist()
print(f"step {cap.step}: row {rows[0]} of the batch has NaN at pixel {pixels}")
same = (X_missing.nan_to_num(-1) == batch[rows[0]].nan_to_num(-1)).all(dim=1)
print("that row is image", same.nonzero().flatten().tolist(), "of the training set")

# %% [markdown]
# **Fix: the data.** Check every example once, where the data is loaded, and drop
# (or repair) what is not finite. A model cannot be made robust to a NaN input;
# it can only be kept from seeing one.
#
# ## Run 2: the blank image

# %%
# %%neuraldbg --stop-on error
model = classifier()
train(model, X_blank, y_train)

# %%
run_model = neuraldbg_nb.last_run()
print(run_model)

# %% [markdown]
# This time the first failure names a layer: **`standardize`: activations became
# non-finite**. No data anomaly is reported: the batch was finite (a blank image
# is unusual, not broken). The layer's own captured input and output show the
# mechanism:

# %%
cap = run_model.inspect(run_model.first_failure)
x, out = cap["input"], cap["output"]
print(f"input of standardize at step {cap.step}: finite everywhere: {bool(torch.isfinite(x).all())}")
bad = (~torch.isfinite(out)).any(dim=1).nonzero().flatten().tolist()
row = bad[0]
print(f"output not finite in row {bad}; that row's input: min {x[row].min():.1f}, "
      f"max {x[row].max():.1f}, std {x[row].std():.1f}")
print("so the layer computed (0 - 0) / 0 =", (torch.tensor(0.0) / torch.tensor(0.0)).item())

# %% [markdown]
# A blank image has a standard deviation of 0, and the layer divides by it.
# **Fix: the model.** Every division needs a guard: `std + eps`, as
# `nn.LayerNorm` and `nn.BatchNorm` do internally. The blank image can stay in the
# data; the model must cope with it.
#
# ## How the first failure told them apart
#
# | | first failure | layer | what to fix |
# |---|---|---|---|
# | missing value | `data_anomaly` (input non-finite) | none: the data | the data |
# | blank image | `nonfinite_activation` | `standardize` | the layer |
#
# In both runs the symptoms were the same list: every layer after the origin
# non-finite, the loss non-finite, every gradient non-finite. Only the first
# failure differs, and it is the only thing you need.
#
# ## Both fixes, and the healthy run
#
# The data is checked once at load time (the NaN image is dropped); the layer gets
# its `eps`; the blank image stays.

# %%
X_both = X_missing.clone()
X_both[700] = 0.0                                 # both problems in one dataset
finite = torch.isfinite(X_both).all(dim=1)
print(f"dropping {int((~finite).sum())} example(s) with non-finite values")
X_clean, y_clean = X_both[finite], y_train[finite]

# %%
# %%neuraldbg --stop-on error
model = classifier(eps=1e-5)
train(model, X_clean, y_clean)

# %%
fixed = neuraldbg_nb.last_run()
fixed_acc = accuracy(model)
print(fixed)
print(f"\ntest accuracy {fixed_acc:.1%}")

# %% [markdown]
# ## The lesson, checked

# %%
d, m = run_data.first_failure, run_model.first_failure
assert d is not None and d.kind == "data_anomaly" and d.layer is None, d
assert d.signal == "input_nonfinite" and d.step == missing_step, d
assert run_data.status == "stopped" and run_data.trace.n_steps == missing_step + 1
assert m is not None and m.kind == "nonfinite_activation", m
assert (m.layer, m.step) == ("standardize", blank_step), m
assert not any(e.kind == "data_anomaly" for e in run_model.events)
assert run_model.status == "stopped"
assert fixed.first_failure is None and fixed.status == "finished", fixed
assert fixed_acc > 0.9, fixed_acc
lesson_ok(f"data_anomaly (no layer) step {d.step}; "
          f"nonfinite_activation {m.layer} step {m.step}; fixed run healthy")
