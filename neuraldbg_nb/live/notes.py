"""What a live run says about what it could not watch (`run.notes`), in the user's terms."""

from __future__ import annotations

import numpy as np

from ..trace.columns import Trace

MAX_NAMED = 6

COMPILED = ("parts of the model ran under torch.compile: their activations are not watched "
            "(hooks do not run inside compiled graphs); gradients, weights, the loss and the "
            "input batch are.")
TRANSFORMED = ("parts of the model ran under torch.func transforms (vmap, grad, jvp): their "
               "activations and input batches are not watched; the gradients and weights at "
               "each optimizer step are.")
EVAL_ONLY = ("every forward of the model ran with gradients off (torch.no_grad() or "
             "torch.inference_mode()), so no activations were recorded: neuraldbg records "
             "the forwards that train, and leaves evaluation passes out.")
ZEROED_BEFORE_STEP = ("the loop zeroed the gradients before it called run.step(), so the "
                      "gradients of those steps were not measured (they read exactly 0): "
                      "call run.step() after the update and before zeroing them.")
"""Each said once per run (a watch entered again does not repeat it)."""


def unstepped(foreign_steps: int, scaled: bool = False) -> tuple[str, str]:
    """A block that never stepped, recorded as one step: (what it means, a clause for the
    story's headline; why, for the run's notes). No optimizer stepped at all, or one that
    trains none of the watched weights did, `foreign_steps` times (`StepOwner`); `scaled`:
    the backwards were a GradScaler's, which skips each step whose gradients overflow."""
    if scaled and not foreign_steps:
        what = "no optimizer step was taken: the GradScaler skipped every one"
        why = ("no optimizer step was taken: the GradScaler skipped every one (the "
               "gradients were not finite at any iteration), so the whole block was "
               "recorded as one step; its diagnosis says why.")
    elif foreign_steps:
        what = ("the model did not train: the optimizer that stepped trains none of its "
                "parameters")
        why = (f"an optimizer stepped {foreign_steps} time"
               f"{'s' * (foreign_steps != 1)}, but none of the parameters it trains "
               f"are the watched model's: the model never changed, and the whole block "
               f"was recorded as one step. The optimizer was made for other tensors: "
               f"most likely an earlier copy of this model (the cell that makes the model "
               f"was run again after the one that makes the optimizer), or weights that "
               f"the loop gives the model from outside it "
               f"(torch.func.functional_call(model, params, x)), which the watch does not "
               f"follow. Make the optimizer again from this model, e.g. "
               f"torch.optim.AdamW(model.parameters()).")
    else:
        what = "no optimizer step was seen, so the block was not judged step by step"
        why = ("no optimizer step was seen, so the whole block was recorded as one step. "
               "Call run.step() once per training step in loops without an optimizer.")
    return what, why


def engine_error(steps: int, where: str, exc: Exception) -> str:
    """The engine's own code failed in the hook `where` after `steps` steps: the watch
    stops, the training goes on."""
    return (f"neuraldbg stopped watching at step {steps}: its own code failed "
            f"({where}: {type(exc).__name__}: {exc}). The training went on, unchanged "
            f"and unwatched; the {steps} steps recorded before are kept. This is a bug "
            f"in neuraldbg: please report it with this message (NEURALDBG_STRICT=1 "
            f"raises it instead, with its traceback).")


def unseen(trace: Trace, activations: bool) -> str | None:
    """What the watch could not see although the loop trained: optimizer steps with no
    layer of any model found, or (`activations`: the layer hooks were on and nothing ran
    compiled) layers whose weights trained but whose forward never ran through PyTorch's
    hooks. Both happen where layers are called as `layer.forward(x)`, which skips the
    hooks (forward-forward training, layers kept in a plain list), or where the module
    that trains is not the one given to the watch. None where every layer was seen."""
    if trace.n_steps and trace.n_layers == 0:
        return (f"no layer of any model was seen in {trace.n_steps} step"
                f"{'s' * (trace.n_steps != 1)}: no module that the optimizer trains was "
                f"called through PyTorch's hooks, so nothing was judged. Layers called as "
                f"layer.forward(x) skip the hooks: call them as layer(x), and pass the "
                f"models to watch([...]) where the loop keeps them in a plain list.")
    if not activations or trace.n_steps == 0:
        return None
    _, grads = trace.history("grad_norm")
    _, acts = trace.history("act_absmax")
    with np.errstate(invalid="ignore"):
        trained = np.isfinite(grads).any(axis=0) & (grads > 0).any(axis=0)
    never = trained & np.isnan(acts).all(axis=0)
    names = [n for n, miss in zip(trace.layer_names, never.tolist()) if miss]
    if not names:
        return None
    listed = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more"
                                              if len(names) > MAX_NAMED else "")
    return (f"the forward of {len(names)} trained layer{'s' * (len(names) != 1)} ({listed}) "
            f"never ran through PyTorch's hooks, so their activations are not watched; "
            f"their gradients and weights are. Layers called as layer.forward(x) skip the "
            f"hooks: call them as layer(x). Weights that another module's forward reads "
            f"(a ParameterList, an embedding tied to an output layer) are that module's "
            f"to run, and its activations are watched.")


def replay_refused(why: str) -> str:
    """A step whose forward could not be replayed (`record.replay`): its layers' numbers
    come from the next sampled step instead."""
    return (f"a step that went wrong could not be replayed to read its layers' outputs "
            f"({why}); its first failure is looked for from the next sampled step on, "
            f"which may name a later step than the one where it began.")
