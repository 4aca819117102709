# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 8. Half precision: weights that stop moving
#
# `model.to(torch.bfloat16)` halves a model's memory in one line, and bfloat16
# has float32's range, so nothing overflows. What it does not have is float32's
# precision: 8 significant bits instead of 24. Next to a weight of 0.1, the
# bfloat16 numbers are 0.00049 apart, so an update smaller than 0.00024 is
# rounded away: the weight stays exactly where it was.
#
# Adam moves each weight by at most about its learning rate at every step, and
# mostly by less. At 3e-3 the updates land; after a learning-rate decay to 3e-4,
# most of them round away.
# Nothing goes NaN, the gradients look normal, the optimizer steps: the loss just
# stops falling, and the rest of the schedule does nothing.
#
# The lesson: the same training with bfloat16 weights and with float32 weights
# under `torch.autocast` (mixed precision, the usual fix), and how the run names
# the layers that stopped learning, at the step they stopped.

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
# ## Rounding in one line
#
# Two updates, a large one and a small one, added to a weight of 0.1 in each
# precision:

# %%
for dtype in (torch.float32, torch.bfloat16):
    w = torch.tensor(0.1, dtype=dtype)
    for update in (3e-3, 1e-4):
        print(f"{dtype!s:15} 0.1 + {update:g}: "
              f"{'moved' if w + update != w else 'unchanged'}")


# %% [markdown]
# ## The model and its schedule
#
# A small classifier, `mlp(128, 64)` from `lessons.py` (hidden ReLU layers of 128 and 64
# units, `fc1` and `fc2`, and a linear head `out`), and AdamW with a step decay: the
# learning rate is divided by 10 after 3 epochs (69 steps) and again after 6.

# %%
def schedule(opt):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=69, gamma=0.1)


def epoch_losses(run, steps_per_epoch=23):
    loss = run.trace.scalar("loss")
    return [loss[i:i + steps_per_epoch].mean()
            for i in range(0, len(loss), steps_per_epoch)]


# %% [markdown]
# ## Training in bfloat16
#
# Every weight is bfloat16, and so is the batch the model reads; the loss is
# taken in float32.

# %%
# %%neuraldbg
model = mlp(128, 64).to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sched = schedule(opt)
for xb, yb in batches(X_train, y_train, epochs=8):
    opt.zero_grad()
    F.cross_entropy(model(xb.bfloat16()).float(), yb).backward()
    opt.step()
    sched.step()
half_acc = accuracy(model, X_test.bfloat16())
print(f"test accuracy {half_acc:.1%}")

# %%
half = neuraldbg_nb.last_run()
print(half)
stuck = next(e for e in half.events if e.kind == "weights_not_updated")
print(stuck.message)

# %% [markdown]
# The run reads, on its sampled steps (every 10th), how many weights of a slice of
# each layer the update left exactly as they were. Before the first decay, a tenth
# to a third of them stood still in an update (Adam's steps are noisy, and the
# largest weights are the first to round). After it, at 3e-4, most of them did:
# `out` crossed the line (nine in ten) at step 70, the first sampled step of the
# new rate, and the others later. After the second decay, at 3e-5, all but about
# one in a hundred, in every layer:

# %%
unmoved = half.trace.col("update_unmoved")
names = half.trace.layer_names
for step in range(0, half.trace.n_steps, 10):
    row = ", ".join(f"{name} {unmoved[step, names.index(name)]:.2%}"
                    for name in ("fc1", "fc2", "out"))
    print(f"step {step:3}: {row}")

# %% [markdown]
# ## The fix: float32 weights, the forward under autocast
#
# Mixed precision keeps the weights (and the optimizer's state) in float32, where
# every update lands, and runs the forward's matrix products in bfloat16 under
# `torch.autocast`: most of the speed, none of the rounding. On a GPU, use
# `torch.autocast("cuda", dtype=torch.bfloat16)`.

# %%
# %%neuraldbg
model = mlp(128, 64)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sched = schedule(opt)
for xb, yb in batches(X_train, y_train, epochs=8):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    sched.step()
mixed_acc = accuracy(model)
print(f"test accuracy {mixed_acc:.1%}")

# %%
mixed = neuraldbg_nb.last_run()
print(mixed)
print("epoch  bfloat16 weights  float32 weights + autocast")
for epoch, (a, b) in enumerate(zip(epoch_losses(half), epoch_losses(mixed))):
    print(f"{epoch:5}  {a:16.4f}  {b:26.4f}")

# %% [markdown]
# The two runs are close until step 69. After it, the loss of the float32 weights
# goes on falling through the low-learning-rate epochs, which is what a decay is
# for; the bfloat16 run's stays about where it was when its weights stopped
# moving. Once every layer's updates round away, the whole model has stopped
# learning: that is an error, and the run's first failure.
#
# The warning's threshold is a fraction of weights left unchanged by one update:
# `unmoved` (0.9 by default). A healthy bfloat16 training leaves a few tenths of
# its weights unchanged in an update; set it lower (`%%neuraldbg --unmoved 0.8`)
# to be told earlier, or re-judge a finished run with
# `half.reclassify(neuraldbg_nb.Thresholds(unmoved=0.8))`.
#
# ## The lesson, checked

# %%
found = {e.layer: (e.step, e.signal) for e in half.events
         if e.kind == "weights_not_updated" and e.layer is not None}
assert sorted(found) == ["fc1", "fc2", "out"], found
assert found["out"] == (70, "rounding"), found
assert all(70 <= step <= 140 and signal == "rounding"
           for step, signal in found.values()), found
whole = half.first_failure
assert (whole.kind, whole.signal, whole.layer) == ("weights_not_updated", "model", None), whole
assert whole.step == max(step for step, _ in found.values()), (whole, found)
assert not [e for e in mixed.events if e.severity != "info"], mixed.events
half_loss, mixed_loss = epoch_losses(half), epoch_losses(mixed)
assert abs(half_loss[2] - mixed_loss[2]) < 0.01, (half_loss, mixed_loss)
fell_half, fell_mixed = half_loss[4] - half_loss[7], mixed_loss[4] - mixed_loss[7]
assert fell_mixed > 2 * fell_half, (half_loss, mixed_loss)
assert mixed_acc > 0.9, mixed_acc
lesson_ok(f"weights_not_updated out step {found['out'][0]} (rounding), "
          f"fc1 and fc2 by step 140, the whole model at step {whole.step}; the loss "
          f"stopped falling; float32 weights with "
          f"autocast quiet")
