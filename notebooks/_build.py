"""Writes the teaching notebooks (01_...06_*.ipynb) of this folder, without outputs.

The .ipynb files are the deliverable and are committed; this script is their source, so a
change to a lesson is made here and the notebooks are written again:

    .venv/bin/python notebooks/_build.py

Every notebook ends with a cell that asserts its own claim (the first failure it teaches,
and that the fixed run is healthy) and prints one line `LESSON OK: ...`, which
tests/test_notebooks.py reads after executing the notebook headless.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent


def md(text: str):  # noqa: ANN201
    return new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str):  # noqa: ANN201
    return new_code_cell(textwrap.dedent(text).strip("\n"))


# -- pieces shared by the lessons ------------------------------------------------------------

SETUP = code('''
    %load_ext neuraldbg_nb
    from collections import OrderedDict

    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import neuraldbg_nb

    # Small models train fastest on one thread (and shared machines such as Binder
    # advertise more cores than they give you).
    torch.set_num_threads(1)
''')

DATA_MD = md('''
    ## The data

    `load_digits` ships with scikit-learn, so nothing is downloaded: 1,797 handwritten
    digits, 8x8 pixels, each pixel an integer from 0 to 16. We keep 297 of them aside to
    measure accuracy on digits the model never trained on.
''')

DATA = code('''
    digits = load_digits()
    raw = torch.tensor(digits.data, dtype=torch.float32)     # (1797, 64), values 0..16
    labels = torch.tensor(digits.target)
    split = torch.randperm(len(raw), generator=torch.Generator().manual_seed(0))
    train_idx, test_idx = split[:1500], split[1500:]

    X_train, y_train = raw[train_idx] / 16, labels[train_idx]  # pixels scaled to 0..1
    X_test, y_test = raw[test_idx] / 16, labels[test_idx]


    def batches(X, y, epochs, batch_size=64, seed=0):
        """Shuffled mini-batches; the same ones on every run with the same seed."""
        order = torch.Generator().manual_seed(seed)
        loader = DataLoader(TensorDataset(X, y), batch_size=batch_size, shuffle=True,
                            drop_last=True, generator=order)
        for _ in range(epochs):
            yield from loader


    @torch.no_grad()
    def accuracy(model, X=X_test, y=y_test):
        model.eval()
        acc = (model(X).argmax(1) == y).float().mean().item()
        model.train()
        return acc


    print(f"{len(X_train)} training images, {len(X_test)} test images, "
          f"{len(X_train) // 64} steps per epoch")
''')


def lesson_ok(text: str):  # noqa: ANN201
    return code(text)


# -- 01 -----------------------------------------------------------------------------------

def nb01() -> list:
    return [
        md('''
            # 1. Vanishing gradients: a deep sigmoid network that never learns

            A training that raises nothing, produces no NaN, and still learns nothing is one
            of the most common things to meet. Here it is a 12-layer network of sigmoids on
            handwritten digits: the loss sits at chance from the first step to the last.
            The loss curve cannot say why. The panel can, in one line.

            The lesson: the broken run under `%%neuraldbg`; what the panel shows and why;
            the fix (ReLU, an initialization made for it, normalization); the same training
            again, healthy.
        '''),
        SETUP, DATA_MD, DATA,
        md('''
            ## The model

            Eleven hidden layers of 128 sigmoid units and a linear head, with PyTorch's
            default initialization: the kind of network that was standard before 2010. The
            function also builds the fixed version, used further down.
        '''),
        code('''
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
        '''),
        md('''
            ## Training it under the panel

            `%%neuraldbg` on top of the cell is the only change to the training code.
            `-o run` also binds the recorded run to the name `run` (it is
            `neuraldbg_nb.last_run()` as well). Sixteen epochs of batches of 128, plain SGD with
            momentum.
        '''),
        code('''
            %%neuraldbg -o run
            model = deep_net(nn.Sigmoid)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for xb, yb in batches(X_train, y_train, epochs=16, batch_size=128):
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            print(f"last loss {loss.item():.3f}   (ln 10 = 2.303 is a uniform guess over 10 classes)")
        '''),
        code('''
            broken_acc = accuracy(model)
            print(run)
            print(f"\\ntest accuracy {broken_acc:.1%}")
        '''),
        md('''
            ## What the panel shows, and why

            The first failure is a **vanishing gradient in `fc5` from step 0**, and the
            same in `fc4`, `fc3`, `fc2` and `fc1`, listed after it. In the map those five rows
            are red from the first column to the last. Accuracy is chance (about 10%).

            Why `fc5`, and not `fc1` whose gradient is the smallest? Gradients are computed
            backwards, from the loss to the input. At every layer on the way down the signal
            is multiplied by the slope of the sigmoid, **at most 0.25**, and by the layer's
            weights, which the default initialization keeps small. So it shrinks by the same
            factor at every layer, here about 7x. The panel names the layer where the
            backward signal, on its way down, first falls under the line (a gradient norm of
            `1e-6` by default): that is where the problem starts. The layers below it are
            further down the same slope; they are symptoms of the same cause.

            The numbers, straight from the recorded trace (`run.trace.col("grad_norm")`,
            one row per step, one column per layer):
        '''),
        code('''
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
        '''),
        md('''
            Note the words **"from step 0"**. Nothing happened during training: the network
            was born this way. A transition detector that compares each layer with its own
            history (lesson 5) has nothing to compare with here, which is why vanishing
            gradients are also judged against an absolute line.

            ## The fix

            The product that shrinks the gradient has two factors per layer, the slope of
            the activation and the size of the weights. Each part of the fix takes one on:

            - **ReLU** instead of sigmoid: its slope is exactly 1 wherever it is active, not
              at most 0.25.
            - **He (Kaiming) initialization**: weights drawn with standard deviation
              `sqrt(2 / fan_in)`, the size that keeps the signal's scale through a ReLU layer,
              forwards and backwards.
            - **LayerNorm** before each activation: it re-centres and re-scales every layer's
              output at every step, so no layer drifts, during training, into a range where
              its gradient dies or blows up.

            How much gradient reaches `fc1` at the first step, for each ingredient added.
            Watching in code instead of with the magic: `neuraldbg_nb.watch(model)`.
        '''),
        code('''
            variants = {
                "sigmoid, default init": dict(activation=nn.Sigmoid),
                "ReLU, default init": dict(activation=nn.ReLU),
                "ReLU, He init": dict(activation=nn.ReLU, he_init=True),
                "ReLU, He init, LayerNorm": dict(activation=nn.ReLU, he_init=True, layer_norm=True),
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
        '''),
        md('''
            ReLU alone gets a thousand times more signal through, but the default
            initialization (made for any activation, not for ReLU) still loses most of it on
            the way down; He initialization brings it to the scale of the output layer's.
            LayerNorm changes little at step 0: its job is to keep it that way while the
            weights move. (Try `deep_net(nn.ReLU, he_init=True)` under the panel: with this
            learning rate it is the layer outputs that drift.)

            ## The same training, healthy
        '''),
        code('''
            %%neuraldbg -o fixed
            model = deep_net(nn.ReLU, he_init=True, layer_norm=True)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for xb, yb in batches(X_train, y_train, epochs=16, batch_size=128):
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            print(f"last loss {loss.item():.3f}")
        '''),
        code('''
            fixed_acc = accuracy(model)
            print(fixed)
            print(f"\\ntest accuracy {fixed_acc:.1%} (was {broken_acc:.1%})")
            g = fixed.trace.col("grad_norm")[:, fixed.trace.layer_index("fc1")]
            print(f"gradient norm of fc1 over the run: {g.min():.1e} .. {g.max():.1e}")
        '''),
        md('''
            The panel stays quiet: `fc1`, the layer furthest from the loss, now gets a gradient
            of the same order as the output layer for the whole run, and the test accuracy
            climbs from chance to about 75% in these 176 steps (it keeps climbing with more
            epochs).

            ## The lesson, checked

            This cell fails if the lesson stops being true (it is run by the project's
            tests).
        '''),
        lesson_ok('''
            ff = run.first_failure
            assert ff is not None and ff.kind == "vanishing_gradient", ff
            assert (ff.layer, ff.step) == ("fc5", 0), ff
            at_start = {e.layer for e in run.events if e.kind == "vanishing_gradient" and e.step == 0}
            assert at_start == {"fc1", "fc2", "fc3", "fc4", "fc5"}, at_start
            assert broken_acc < 0.3, broken_acc
            assert fixed.first_failure is None, fixed.first_failure
            assert fixed_acc > 0.6, fixed_acc
            print(f"LESSON OK: {ff.kind} {ff.layer} step {ff.step}; fixed run healthy")
        '''),
    ]


MLP = code('''
    def mlp():
        """A plain classifier: three hidden ReLU layers and a linear head."""
        torch.manual_seed(0)
        return nn.Sequential(OrderedDict(
            fc1=nn.Linear(64, 128), relu1=nn.ReLU(),
            fc2=nn.Linear(128, 128), relu2=nn.ReLU(),
            fc3=nn.Linear(128, 64), relu3=nn.ReLU(),
            out=nn.Linear(64, 10),
        ))


    mlp()
''')


# -- 02 -----------------------------------------------------------------------------------

def nb02() -> list:
    return [
        md('''
            # 2. Exploding gradients: a learning rate that blows up

            You sweep learning rates, 0.1, 0.3, 1, 3, and the last one blows up: the loss
            jumps, gradient norms reach 10^4, then everything is NaN. By the time the loss
            curve shows it, every layer looks broken at once. Which of all these alarms is
            the cause, and which are symptoms?

            The lesson: the broken run under `%%neuraldbg`; reading the panel's chain of
            events from the first failure on; why gradient clipping alone does not fix it;
            the fix (a sane learning rate, with clipping as a safety net); the healthy run.
        '''),
        SETUP, DATA_MD, DATA,
        md('''
            ## The model

            A plain classifier, nothing unusual about it. It trains well with SGD at a
            learning rate of 0.1, as we will see at the end.
        '''),
        MLP,
        md('''
            ## The learning rate that blows up: 3.0
        '''),
        code('''
            %%neuraldbg -o run
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=3.0, momentum=0.9)
            for xb, yb in batches(X_train, y_train, epochs=7):
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            print(f"last loss {loss.item():.3f}")
        '''),
        code('''
            broken_acc = accuracy(model)
            print(run)
            print(f"\\ntest accuracy {broken_acc:.1%}")
        '''),
        md('''
            ## Reading the chain: cause first, then symptoms

            The panel names one first failure and groups everything after it as "what
            followed". Here is the run's timeline, the first event of each kind:
        '''),
        code('''
            first_of_kind = {}
            for e in run.events:
                if e.severity != "info":
                    first_of_kind.setdefault(e.kind, e)
            for e in first_of_kind.values():
                print(f"step {e.step:3d}  {e.kind:<20} {e.message}")
        '''),
        md('''
            Read it from the top. At step 5, **one update moved the output layer's weights
            by about twice their own size**: that is the first failure. Three steps later
            the same happens to every layer; then the loss jumps by 40x; then the
            gradients explode (norms of 10^4, a hundred thousand times what they were);
            then the loss and the gradients become NaN; in the end the ReLUs are dead and
            the gradients vanish. "Exploding gradients" is in the list, loud, but it is the
            fourth thing that went wrong, not the first.

            Three rules tell cause from symptoms, and the panel applies them for you:

            1. **Earliest first.** Everything that follows a failure may be its consequence;
               nothing that comes before it can be.
            2. **At the same step, the data, then the layers in forward order, then the
               update, then the loss, then the gradients.** A broken input makes every
               layer look broken; a layer whose output jumped makes every gradient
               explode. Gradients come last because they react to everything.
            3. **Transitions, not levels.** Each layer is judged against its own recent
               history, so "jumped 15x at step 5" is found in a layer whatever its scale.

            The numbers behind the first failure, from the trace. At step 5 the gradients are
            ordinary in size (a few units); the weights, though, grow by several times
            their size from one step to the next. The update `lr x gradient` is what is too
            big: the learning rate is the cause.
        '''),
        code('''
            names = run.trace.layer_names
            cols = [names.index(n) for n in ("fc1", "fc2", "fc3", "out")]
            grad = run.trace.col("grad_norm")[:, cols]
            weight = run.trace.col("param_norm")[:, cols]
            loss_col = run.trace.scalar("loss")
            print("step   loss       gradient norm (fc1 fc2 fc3 out)      weight norm (fc1 fc2 fc3 out)")
            for s in range(3, 13):
                g = " ".join(f"{v:8.2g}" for v in grad[s])
                w = " ".join(f"{v:7.3g}" for v in weight[s])
                print(f"{s:4d} {loss_col[s]:9.3g}   {g}    {w}")
        '''),
        md('''
            ## Why clipping alone does not fix it

            Gradient clipping (`torch.nn.utils.clip_grad_norm_`) rescales the gradient when
            its norm is above a limit. It removes the loudest symptom, the exploding
            gradient. But with a learning rate of 3 every step is still `3 x` a gradient of
            norm up to 1: the updates are still far too big for these weights. Watched in
            code with `neuraldbg_nb.watch` (no panel):
        '''),
        code('''
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=3.0, momentum=0.9)
            with neuraldbg_nb.watch(model, report=False) as clipped:
                for xb, yb in batches(X_train, y_train, epochs=7):
                    opt.zero_grad()
                    F.cross_entropy(model(xb), yb).backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                    opt.step()
            clipped_acc = accuracy(model)
            print(clipped)
            print(f"\\ntest accuracy {clipped_acc:.1%}")
        '''),
        md('''
            No NaN any more, and no exploding gradient: the symptom is gone. The network
            died instead: the oversized steps pushed the ReLUs into the region where they
            output zero for every input (lesson 3). Treating a symptom moved the damage
            elsewhere.

            ## The fix

            - **A sane learning rate**, the real fix: 0.1 here, thirty times smaller. A quick
              sweep over a few values on a short run, watched by the panel, finds it.
            - **Clipping as a safety net**: harmless when gradients are ordinary, it caps
              the rare spike (an unusual batch) before it becomes a blown-up step.
        '''),
        code('''
            %%neuraldbg -o fixed
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for xb, yb in batches(X_train, y_train, epochs=7):
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                opt.step()
            print(f"last loss {loss.item():.3f}")
        '''),
        code('''
            fixed_acc = accuracy(model)
            print(fixed)
            print(f"\\ntest accuracy {fixed_acc:.1%} (was {broken_acc:.1%})")
        '''),
        md('''
            ## The lesson, checked
        '''),
        lesson_ok('''
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
            print(f"LESSON OK: {ff.kind} {ff.layer} step {ff.step}; "
                  f"exploding gradients from step {min(e.step for e in exploding)} are symptoms; "
                  f"fixed run healthy")
        '''),
    ]


# -- 03 -----------------------------------------------------------------------------------

def nb03() -> list:
    return [
        md('''
            # 3. Dead ReLUs: units that stop firing and never come back

            A ReLU outputs `max(0, x)`. If a unit's input `x` is negative for every example,
            the unit outputs 0 for every example, and its gradient is 0 for every example:
            nothing will ever move its weights again. The unit is dead. Nothing crashes and
            nothing is NaN: the network keeps training with what is left of it, and you get
            a worse model without being told.

            Here two small mistakes, each of which you could survive alone, kill 90% of a
            layer in the first few steps: the pixels are fed raw (0..16, not scaled to
            0..1), and Adam runs with a learning rate of 0.03, ten times the usual.
        '''),
        SETUP, DATA_MD, DATA,
        md('''
            ## The model and the mistake
        '''),
        code('''
            def classifier():
                torch.manual_seed(0)
                return nn.Sequential(OrderedDict(
                    fc1=nn.Linear(64, 128), relu1=nn.ReLU(),
                    fc2=nn.Linear(128, 128), relu2=nn.ReLU(),
                    out=nn.Linear(128, 10),
                ))


            Xraw_train, Xraw_test = X_train * 16, X_test * 16   # the mistake: pixels 0..16
        '''),
        code('''
            %%neuraldbg -o run
            model = classifier()
            opt = torch.optim.Adam(model.parameters(), lr=0.03)
            for xb, yb in batches(Xraw_train, y_train, epochs=7):
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            print(f"last loss {loss.item():.3f}")
        '''),
        code('''
            broken_acc = accuracy(model, Xraw_test, y_test)
            print(run)
            print(f"\\ntest accuracy {broken_acc:.1%}")
        '''),
        md('''
            ## What the panel shows

            **`relu1`: about 90% of its units dead (zero for the whole batch), was 5%**, and
            the row stays red to the end. It is the only failure. The test accuracy is
            not even bad, which is exactly the danger: the network works with the ten or so
            first-layer units it has left out of 128, and nothing but the panel says so.

            **When did they die?** The panel computes the full activation statistics, dead
            units among them, on sampled steps: every 10 steps by default
            (`--sample-every`), less often when they would cost more than 2% of the training
            time. So it dates the death at the first sampled step that saw it. The tensors
            captured for reference at steps 0, 1, 2, 4 and 8 pin it down; `run.inspect`
            opens them, the same as a click on the map:
        '''),
        code('''
            def dead_fraction(out):
                """Units that output 0 for every example of the batch."""
                return (out.amax(dim=0) <= 0).float().mean().item()


            for step in (0, 1, 2, 4, 8):
                cap = run.inspect("relu1", step)
                print(f"step {step}: {dead_fraction(cap['output']):4.0%} of relu1 dead in the batch")
        '''),
        md('''
            Most of the layer died within four steps.

            ## Why it happened

            Adam moves every weight by about `lr` per step, whatever the size of its
            gradient. A unit's input is `w . x + b`: one step can shift it by up to
            `lr x sum(|x|)`. With raw pixels that sum is in the hundreds. Compare with how
            far from zero the units' inputs were at step 0 (the input of `relu1` is the
            output of `fc1`, captured at step 0):
        '''),
        code('''
            start = run.inspect("relu1", 0)["input"]               # fc1's output at step 0
            print(f"inputs of relu1 at step 0: typically {start.abs().mean():.1f} away from zero")
            for label, data in (("raw pixels 0..16", Xraw_train), ("pixels scaled to 0..1", X_train)):
                reach = 0.03 * data.abs().sum(dim=1).mean()
                print(f"{label:>22}: one Adam step at lr 0.03 can move them by up to {reach:.1f}")
        '''),
        md('''
            One step can carry a unit's input far past zero, for every image at once.

            ## Why they never come back

            Look at the first failure's capture: for each dead unit, its input (`fc1`'s
            output) is negative for every image of the batch. On the whole training set
            it is the same, and so the gradient reaching those units' weights is exactly
            zero. To prove the point, train three more epochs with a gentle learning rate:
        '''),
        code('''
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
        '''),
        md('''
            ## The fix

            Take away what made the steps too big for the units:

            - **Scale the inputs** (to 0..1 here, or standardize them): the same weight step
              then moves a unit's input 16 times less.
            - **A learning rate in the usual range** for Adam: 3e-3.

            Other remedies you will meet: **LeakyReLU** (a small slope below zero, so a
            unit always gets some gradient and can come back), an initialization and a
            **normalization layer** (BatchNorm/LayerNorm before the ReLU) that keep the
            inputs centred around zero, and a **learning-rate warmup**, since units mostly
            die in the first, largest steps.
        '''),
        code('''
            %%neuraldbg -o fixed
            model = classifier()
            opt = torch.optim.Adam(model.parameters(), lr=3e-3)
            for xb, yb in batches(X_train, y_train, epochs=7):
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            print(f"last loss {loss.item():.3f}")
        '''),
        code('''
            fixed_acc = accuracy(model)
            with torch.no_grad():
                fixed_dead = model.relu1(model.fc1(X_train)).amax(dim=0) <= 0
            print(fixed)
            print(f"\\ntest accuracy {fixed_acc:.1%} (was {broken_acc:.1%}); "
                  f"relu1 units dead on all training images: {int(fixed_dead.sum())} of 128 "
                  f"(was {int(dead.sum())})")
        '''),
        md('''
            ## The lesson, checked
        '''),
        lesson_ok('''
            ff = run.first_failure
            assert ff is not None and ff.kind == "dead_units" and ff.layer == "relu1", ff
            assert ff.step <= 40, ff                     # found at a sampled step soon after
            assert dead_fraction(run.inspect("relu1", 0)["output"]) < 0.2
            assert dead_fraction(run.inspect("relu1", 8)["output"]) > 0.8
            assert dead.float().mean() > 0.8 and bool(still_dead[dead].all())
            assert grad_rows.abs().max() == 0
            assert fixed.first_failure is None, fixed.first_failure
            assert fixed_dead.float().mean() < 0.3 and fixed_acc > 0.9, (fixed_dead.sum(), fixed_acc)
            print(f"LESSON OK: {ff.kind} {ff.layer} step {ff.step}; they stay dead; fixed run healthy")
        '''),
    ]


NOTEBOOKS = {
    "01_vanishing_gradients.ipynb": nb01,
    "02_exploding_gradients.ipynb": nb02,
    "03_dead_relus.ipynb": nb03,
}


def build(names: list[str] | None = None) -> list[Path]:
    written = []
    for name, make in NOTEBOOKS.items():
        if names and not any(n in name for n in names):
            continue
        nb = new_notebook(cells=make())
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                     "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        for i, cell in enumerate(nb.cells):   # stable ids: rebuilding gives no spurious diff
            cell["id"] = f"{name[:2]}-{i:02d}"
        nbformat.validate(nb)
        path = HERE / name
        path.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for p in build(sys.argv[1:]):
        print(f"wrote {p.relative_to(HERE.parent)}")
