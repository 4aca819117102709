# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 1. Vanishing gradients: a deep sigmoid network that never learns
#
# A training that raises nothing, produces no NaN, and still learns nothing is one
# of the most common things to meet. Here it is a 12-layer network of sigmoids on
# handwritten digits: the loss sits at chance from the first step to the last.
# The loss curve cannot say why. The panel can, in one line.
#
# The lesson: the broken run under `%%neuraldbg`; what the panel shows and why;
# the fix (ReLU, an initialization made for it, normalization); the same training
# again, healthy.

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
# Eleven hidden layers of 128 sigmoid units and a linear head, with PyTorch's
# default initialization: the kind of network that was standard before 2010. The
# function also builds the fixed version, used further down.

# %%
def deep_net(activation=nn.Sigmoid, he_init=False, layer_norm=False,
             depth=12, width=128):
    """`depth` linear layers: fc1..fc11 (each followed by an activation) and out."""
    torch.manual_seed(0)
    layers, n_in = OrderedDict(), 64
    for k in range(1, depth):
        fc = nn.Linear(n_in, width)
        if he_init:
            nn.init.kaiming_normal_(fc.weight, nonlinearity="relu")
            nn.init.zeros_(fc.bias)
        layers[f"fc{k}"] = fc
        if layer_norm:
            layers[f"norm{k}"] = nn.LayerNorm(width)
        layers[f"act{k}"] = activation()
        n_in = width
    layers["out"] = nn.Linear(width, 10)
    return nn.Sequential(layers)


deep_net()

# %% [markdown]
# ## Training it under the panel
#
# `%%neuraldbg` on top of the cell is the only change to the training code. The
# recorded run is `neuraldbg_nb.last_run()`, which the next cell calls `run`
# (`%%neuraldbg -o run` binds the name as well). Sixteen epochs of batches of 128, plain
# SGD with momentum.

# %%
# %%neuraldbg
model = deep_net(nn.Sigmoid)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for xb, yb in batches(X_train, y_train, epochs=16, batch_size=128):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}   (ln 10 = 2.303 is a uniform guess over 10 classes)")

# %%
run = neuraldbg_nb.last_run()
broken_acc = accuracy(model)
print(run)
print(f"\ntest accuracy {broken_acc:.1%}")

# %% [markdown]
# ## What the panel shows, and why
#
# The first failure is a **vanishing gradient in `fc5` from step 0**, and the
# same in `fc4`, `fc3`, `fc2` and `fc1`, listed after it. In the map the rows of
# `fc1` to `fc5` are magenta (error) from the first column to the last: none of their
# gradients comes back (the `recovery` lines of `fc1` in the feed are about its weights,
# updated again after a stall). Accuracy is chance (about 10%).
#
# Why `fc5`, and not `fc1` whose gradient is the smallest? Gradients are computed
# backwards, from the loss to the input. At every layer on the way down the signal
# is multiplied by the slope of the sigmoid, **at most 0.25**, and by the layer's
# weights, which the default initialization keeps small. So it shrinks by the same
# factor at every layer, here about 7x. The panel names the layer where the
# backward signal, on its way down, first falls under the line (a gradient norm of
# `1e-6` by default): that is where the problem starts. The layers below it are
# further down the same slope; they are symptoms of the same cause.
#
# The numbers, straight from the recorded trace (`run.trace.col("grad_norm")`,
# one row per step, one column per layer):

# %%
names = run.trace.layer_names
grad0 = run.trace.col("grad_norm")[0]          # step 0, every layer
linear = [n for n in names if n.startswith("fc") or n == "out"]
previous = None
for name in reversed(linear):                  # from the loss down to the input
    g = float(grad0[names.index(name)])
    ratio = f"{previous / g:5.1f}x smaller" if previous else ""
    flag = "  <- under the line" if g < run.thresholds.vanish else ""
    print(f"{name:>4}: gradient norm {g:9.2e}  {ratio}{flag}")
    previous = g

# %% [markdown]
# Note the words **"from step 0"**. Nothing happened during training: the network
# was born this way. A transition detector that compares each layer with its own
# history (lesson 5) has nothing to compare with here, which is why vanishing
# gradients are also judged against an absolute line.
#
# ## The fix
#
# The product that shrinks the gradient has two factors per layer, the slope of
# the activation and the size of the weights. Each part of the fix takes one on:
#
# - **ReLU** instead of sigmoid: its slope is exactly 1 wherever it is active, not
#   at most 0.25.
# - **He (Kaiming) initialization**: weights drawn with standard deviation
#   `sqrt(2 / fan_in)`, the size that keeps the signal's scale through a ReLU layer,
#   forwards and backwards.
# - **LayerNorm** before each activation: it re-centres and re-scales every layer's
#   output at every step, so no layer drifts, during training, into a range where
#   its gradient dies or blows up.
#
# How much gradient reaches `fc1` at the first step, for each ingredient added.
# Watching in code instead of with the magic: `neuraldbg_nb.watch(model)`.

# %%
variants = {
    "sigmoid, default init": {"activation": nn.Sigmoid},
    "ReLU, default init": {"activation": nn.ReLU},
    "ReLU, He init": {"activation": nn.ReLU, "he_init": True},
    "ReLU, He init, LayerNorm": {"activation": nn.ReLU, "he_init": True, "layer_norm": True},
}
for label, options in variants.items():
    m = deep_net(**options)
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    with neuraldbg_nb.watch(m, report=False) as probe_run:
        for xb, yb in batches(X_train, y_train, epochs=1, batch_size=128):
            o.zero_grad()
            F.cross_entropy(m(xb), yb).backward()
            o.step()
            break                               # one step is enough to see it
    g = probe_run.trace.col("grad_norm")[0, probe_run.trace.layer_index("fc1")]
    print(f"{label:>26}: gradient norm of fc1 at step 0 = {g:.1e}")

# %% [markdown]
# ReLU alone gets a thousand times more signal through, but the default
# initialization (made for any activation, not for ReLU) still loses most of it on
# the way down; He initialization brings it to the scale of the output layer's.
# LayerNorm changes little at step 0: its job is to keep it that way while the
# weights move. (Try `deep_net(nn.ReLU, he_init=True)` under the panel: with this
# learning rate most of its ReLUs die within a few dozen steps, the panel warns
# of dead units in nearly every layer, and the network learns nothing.)
#
# ## The same training, healthy

# %%
# %%neuraldbg
model = deep_net(nn.ReLU, he_init=True, layer_norm=True)
# half the learning rate above: at 0.1 this deep net trains on some machines and
# diverges to chance on others (a rounding difference decides it)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for xb, yb in batches(X_train, y_train, epochs=16, batch_size=128):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")

# %%
fixed = neuraldbg_nb.last_run()
fixed_acc = accuracy(model)
print(fixed)
print(f"\ntest accuracy {fixed_acc:.1%} (was {broken_acc:.1%})")
g = fixed.trace.col("grad_norm")[:, fixed.trace.layer_index("fc1")]
print(f"gradient norm of fc1 over the run: {g.min():.1e} .. {g.max():.1e}")

# %% [markdown]
# The panel stays quiet: `fc1`, the layer furthest from the loss, now gets a gradient
# of the same order as the output layer for the whole run, and the test accuracy
# climbs from chance to about 75% in these 176 steps (it keeps climbing with more
# epochs).
#
# ## The lesson, checked
#
# This cell fails if the lesson stops being true (it is run by the project's
# tests).

# %%
ff = run.first_failure
assert ff is not None and ff.kind == "vanishing_gradient", ff
assert (ff.layer, ff.step) == ("fc5", 0), ff
at_start = {e.layer for e in run.events if e.kind == "vanishing_gradient" and e.step == 0}
assert at_start == {"fc1", "fc2", "fc3", "fc4", "fc5"}, at_start
assert broken_acc < 0.3, broken_acc
assert fixed.first_failure is None, fixed.first_failure
assert fixed_acc > 0.6, fixed_acc
lesson_ok(f"{ff.kind} {ff.layer} step {ff.step}; fixed run healthy")
