"""Writes the teaching notebooks (01_...08_*.ipynb) of this folder, without outputs.

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
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent


def md(text: str) -> NotebookNode:
    return new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str) -> NotebookNode:
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


def lesson_ok(text: str) -> NotebookNode:
    """The last cell: asserts the lesson's claim and prints `LESSON OK: ...`."""
    return code(text)


# -- 01 -----------------------------------------------------------------------------------

def nb01() -> list[NotebookNode]:
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
            same in `fc4`, `fc3`, `fc2` and `fc1`, listed after it. In the map the rows of
            `fc1` to `fc4` are red from the first column to the last (`fc5`, right on the
            line, comes back above it for a while and falls under again). Accuracy is
            chance (about 10%).

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
            learning rate most of its ReLUs die within a few dozen steps, the panel warns
            of dead units in nearly every layer, and the network learns nothing.)

            ## The same training, healthy
        '''),
        code('''
            %%neuraldbg -o fixed
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

def nb02() -> list[NotebookNode]:
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
            the same happens to every layer; then the loss jumps by 40x and the ReLUs start
            to die; then the gradients explode (norms of 10^4, a hundred thousand times what
            they were at the start); then the loss and the gradients become NaN, and the
            gradients of the dead layers vanish. "Exploding gradients" is in the list, loud,
            but it came six steps after the first failure.

            Three rules tell cause from symptoms, and the panel applies them for you:

            1. **Earliest first.** Everything that follows a failure may be its consequence;
               nothing that comes before it can be.
            2. **At the same step, the data, then the layers in forward order, then the
               update, then the loss, then the gradients.** A broken input makes every
               layer look broken; a layer whose output jumped makes every gradient
               explode. Gradients come last because they react to everything.
            3. **Transitions, not levels.** Each layer is judged against its own recent
               history, so "jumped 15x at step 5" is found in a layer whatever its scale.

            The numbers behind the first failure, from the trace. At step 5 the gradients
            are a few units: larger than before, nowhere near exploding. The weights, though,
            grow by several times their size in one update (the output layer's norm goes
            from 2.9 to 8.5). The update, `lr x gradient`, is what is too big: the learning
            rate is the cause.
        '''),
        code('''
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

def nb03() -> list[NotebookNode]:
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


# -- 04 -----------------------------------------------------------------------------------

def nb04() -> list[NotebookNode]:
    return [
        md('''
            # 4. NaN hunting: is it the data or the model?

            A NaN spreads. One NaN in one input makes that example's output NaN in every
            layer; the loss is a mean over the batch, so it is NaN; every gradient is NaN;
            after the update every weight is NaN, and from then on every output of every
            example. One step after it appears, the whole network is NaN and the question
            "where did it come from?" has no answer left in the model.

            It has one at the step it appeared: follow the forward pass, and the first place
            a non-finite value shows up is the origin. If it is **the input batch**, fix the
            data. If the input is finite and **a layer** turns it into NaN, fix the layer.
            `%%neuraldbg --stop-on error` stops the training right there, before the
            optimizer applies the NaN gradients, with the step's tensors captured.

            Two runs below, each with one NaN: one from a batch, one from a layer.
        '''),
        SETUP, DATA_MD, DATA,
        md('''
            ## The model

            A classifier that standardizes each image itself (mean 0, standard deviation 1
            per image) as its first layer, a common way to make a model independent of
            brightness and contrast that also travels with the model when it is deployed.
        '''),
        code('''
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
        '''),
        md('''
            ## Two datasets, one problem each

            - **A missing value.** One pixel of image 1000 is NaN, as a corrupted file or a
              failed sensor read leaves it in a real dataset.
            - **A blank image.** Image 700 is all zeros: a blank scan. Every value is a
              perfectly good number.

            We also work out at which step each image comes in a batch, to check the panel
            against it.
        '''),
        code('''
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
        '''),
        md('''
            ## Run 1: the missing value
        '''),
        code('''
            %%neuraldbg --stop-on error -o run_data
            model = classifier()
            train(model, X_missing, y_train)
        '''),
        code('''
            print(run_data)
        '''),
        md('''
            The training stopped at the step the image came in. The first failure has no
            layer: **the input batch has non-finite values**. Every layer's NaN, the loss's
            and the gradients' are listed after it as symptoms, because at the same step the
            data comes first. The captured batch says which example and which pixel:
        '''),
        code('''
            cap = run_data.inspect(run_data.first_failure)
            batch = cap["batch"]
            rows = torch.isnan(batch).any(dim=1).nonzero().flatten().tolist()
            pixels = torch.isnan(batch[rows[0]]).nonzero().flatten().tolist()
            print(f"step {cap.step}: row {rows[0]} of the batch has NaN at pixel {pixels}")
            same = (X_missing.nan_to_num(-1) == batch[rows[0]].nan_to_num(-1)).all(dim=1)
            print("that row is image", same.nonzero().flatten().tolist(), "of the training set")
        '''),
        md('''
            **Fix: the data.** Check every example once, where the data is loaded, and drop
            (or repair) what is not finite. A model cannot be made robust to a NaN input;
            it can only be kept from seeing one.

            ## Run 2: the blank image
        '''),
        code('''
            %%neuraldbg --stop-on error -o run_model
            model = classifier()
            train(model, X_blank, y_train)
        '''),
        code('''
            print(run_model)
        '''),
        md('''
            This time the first failure names a layer: **`standardize`: activations became
            non-finite**. No data anomaly is reported: the batch was finite (a blank image
            is unusual, not broken). The layer's own captured input and output show the
            mechanism:
        '''),
        code('''
            cap = run_model.inspect(run_model.first_failure)
            x, out = cap["input"], cap["output"]
            print(f"input of standardize at step {cap.step}: finite everywhere: {bool(torch.isfinite(x).all())}")
            bad = (~torch.isfinite(out)).any(dim=1).nonzero().flatten().tolist()
            row = bad[0]
            print(f"output not finite in row {bad}; that row's input: min {x[row].min():.1f}, "
                  f"max {x[row].max():.1f}, std {x[row].std():.1f}")
            print("so the layer computed (0 - 0) / 0 =", (torch.tensor(0.0) / torch.tensor(0.0)).item())
        '''),
        md('''
            A blank image has a standard deviation of 0, and the layer divides by it.
            **Fix: the model.** Every division needs a guard: `std + eps`, as
            `nn.LayerNorm` and `nn.BatchNorm` do internally. The blank image can stay in the
            data; the model must cope with it.

            ## How the first failure told them apart

            | | first failure | layer | what to fix |
            |---|---|---|---|
            | missing value | `data_anomaly` (input non-finite) | none: the data | the data |
            | blank image | `nonfinite_activation` | `standardize` | the layer |

            In both runs the symptoms were the same list: every layer after the origin
            non-finite, the loss non-finite, every gradient non-finite. Only the first
            failure differs, and it is the only thing you need.

            ## Both fixes, and the healthy run

            The data is checked once at load time (the NaN image is dropped); the layer gets
            its `eps`; the blank image stays.
        '''),
        code('''
            X_both = X_missing.clone()
            X_both[700] = 0.0                                 # both problems in one dataset
            finite = torch.isfinite(X_both).all(dim=1)
            print(f"dropping {int((~finite).sum())} example(s) with non-finite values")
            X_clean, y_clean = X_both[finite], y_train[finite]
        '''),
        code('''
            %%neuraldbg --stop-on error -o fixed
            model = classifier(eps=1e-5)
            train(model, X_clean, y_clean)
        '''),
        code('''
            fixed_acc = accuracy(model)
            print(fixed)
            print(f"\\ntest accuracy {fixed_acc:.1%}")
        '''),
        md('''
            ## The lesson, checked
        '''),
        lesson_ok('''
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
            print(f"LESSON OK: data_anomaly (no layer) step {d.step}; "
                  f"nonfinite_activation {m.layer} step {m.step}; fixed run healthy")
        '''),
    ]


# -- 05 -----------------------------------------------------------------------------------

def nb05() -> list[NotebookNode]:
    return [
        md('''
            # 5. Thresholds and regime shifts: re-judging a finished run

            Every detector has a threshold, and no threshold is right for every model. The
            panel lets you move them after the run and see the whole run re-classified at
            once, without training again: the recorded trace is kept, and detection is a
            pure function of the trace and the thresholds.

            This lesson: a training that goes wrong in the middle, the sliders (and their
            code form, `run.reclassify(...)`), what a threshold too loose or too tight does
            to the diagnosis, and why the panel looks at **transitions** (a layer against
            its own recent history) rather than absolute values.
        '''),
        SETUP, DATA_MD, DATA, MLP,
        md('''
            ## The story: new data arrives

            The model is trained on a first export of 1,000 images. Then a second export of
            500 more arrives and training goes on with it. The second export was written by
            another script, which forgot to divide the pixels by 16: its values are 0..16,
            not 0..1.
        '''),
        code('''
            from itertools import chain

            first_X, first_y = X_train[:1000], y_train[:1000]
            second_X, second_y = X_train[1000:] * 16, y_train[1000:]   # the other script: 0..16


            def data(second_export):
                """Four epochs on the first export, then eight on the second."""
                return chain(batches(first_X, first_y, epochs=4),
                             batches(second_export, second_y, epochs=8))


            switch = 4 * (len(first_X) // 64)
            print(f"the second export comes in at step {switch}")
        '''),
        code('''
            %%neuraldbg -o run
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for xb, yb in data(second_X):
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            print(f"last loss {loss.item():.3f}")
        '''),
        code('''
            print(run)
        '''),
        md('''
            The first failure is the data: **the input batch's scale jumped 16x** at the step
            the second export came in. It is only a warning on its own (a 16x jump is below
            the `jump_error` factor of 100 that makes it an error), but it starts the chain
            of errors that follows: the loss diverges the next step, updates and gradients
            explode, the ReLUs die.

            ## The sliders

            When the run has finished, the panel shows five sliders. Dragging one re-judges
            the whole recorded run under the new value, in milliseconds, and redraws the map,
            the events and the first failure:

            | slider | threshold | default | meaning |
            |---|---|---|---|
            | vanishing grad < | `vanish` | 1e-6 | a layer's gradient norm below this has vanished |
            | exploding grad > | `explode` | 1e3 | above this it has exploded |
            | regime jump x | `jump` | 10 | a change by this factor against the layer's recent history is a regime shift |
            | dead units >= | `dead` | 0.5 | fraction of a ReLU layer's units that output 0 for the whole batch |
            | saturated >= | `saturated` | 0.5 | fraction of a sigmoid/tanh layer's outputs stuck at the bounds |

            In code, `run.reclassify(**changes)` does the same and returns a new `Run` over
            the same recorded trace and captures: nothing is trained again. It also takes the
            settings without a slider (`jump_error`, `window`, `patience`, `lookback`, ...;
            see `neuraldbg_nb.Thresholds`). The same options exist on the magic's line,
            e.g. `%%neuraldbg --jump 5`.
        '''),
        code('''
            import time


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
            print(f"\\n(re-judging {run.trace.n_steps} steps x {run.trace.n_layers} layers took "
                  f"{1000 * took:.0f} ms)")
        '''),
        md('''
            - **Too loose (`jump=100`)**: the 16x jump of the input no longer counts, and
              the first failure becomes the loss divergence one step later: a symptom. A
              loose threshold does not make a run healthier; it makes the panel blame the
              wrong thing.
            - **Too tight (`jump=3`)**: more warnings, ordinary fluctuations among them; the
              first failure stays the data, because the root-cause order (data first, then
              layers in forward order, then updates, loss, gradients) does not depend on
              the count.
            - **`jump_error=10`**: the 16x jump of the input is an error in itself, so it
              would be a failure even if nothing broke after it. Useful when any sudden
              change of scale in your data should stop you.

            ## Why transitions, not absolute values

            Look at what the input did: its largest absolute value went from 1 to 16 in one
            step.
        '''),
        code('''
            scale = run.trace.scalar("in_absmax")
            for s in range(switch - 3, switch + 3):
                print(f"step {s}: largest |input| {scale[s]:5.1f}")
        '''),
        md('''
            An input scale of 16 is nothing unusual in itself: raw digits are 0..16, photos
            0..255, standardized data a few units. No absolute line on input values could
            flag this run without flagging half the datasets in the world. What is wrong
            is the **change**: 1 one step, 16 the next.

            The same holds inside the network. Here is the same training with the second
            export scaled correctly, the healthy run:
        '''),
        code('''
            %%neuraldbg -o healthy
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for xb, yb in data(second_X / 16):
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            print(f"last loss {loss.item():.3f}")
        '''),
        code('''
            healthy_acc = accuracy(model)
            print(healthy)
            print(f"test accuracy {healthy_acc:.1%}\\n")
            g = healthy.trace.col("grad_norm")
            for name in ("fc1", "fc2", "fc3", "out"):
                col = g[:, healthy.trace.layer_index(name)]
                print(f"{name:>4}: gradient norm between {col.min():.3f} and {col.max():.2f} in this healthy run")
        '''),
        md('''
            Healthy gradient norms span two orders of magnitude over one run of this small
            model, and other models live at 1e-7 or at 100. An absolute line tight enough to
            see a 16x change in one of them fires on ordinary training of another. Try it:
            an "exploding" line at 2 fires on the healthy run, while the regime-shift
            detector, which measures each layer against its own last steps (in log space,
            over `window` = 20 steps), stays quiet on it and finds the jump in the broken one.
        '''),
        code('''
            judge(healthy, "healthy, defaults")
            judge(healthy.reclassify(explode=2), "healthy, explode=2")
        '''),
        md('''
            The absolute lines are still there, for what has no history to compare with: a
            network born with vanishing gradients (lesson 1) is vanishing from step 0.
            Use the sliders to fit them to a model: move one, and the whole run is judged
            again under it.

            ## The lesson, checked
        '''),
        lesson_ok('''
            ff = run.first_failure
            assert ff is not None and ff.kind == "data_anomaly" and ff.signal == "input_scale", ff
            assert (ff.layer, ff.step) == (None, switch), ff
            lf = loose.first_failure
            assert lf is not None and lf.kind == "loss_divergence" and lf.step > switch, lf
            same = lambda e: (e.kind, e.signal, e.layer, e.step)  # noqa: E731
            assert same(tight.first_failure) == same(ff)
            assert sum(e.severity == "warning" for e in tight.events) > \\
                sum(e.severity == "warning" for e in run.events)
            sf = strict.first_failure
            assert sf is not None and sf.kind == "data_anomaly" and sf.severity == "error", sf
            assert healthy.first_failure is None, healthy.first_failure
            assert healthy.reclassify(explode=2).first_failure.kind == "exploding_gradient"
            assert healthy_acc > 0.9, healthy_acc
            print(f"LESSON OK: {ff.kind} ({ff.signal}) step {ff.step}; with jump=100 the first "
                  f"failure becomes a symptom ({lf.kind} step {lf.step}); healthy run quiet")
        '''),
    ]


# -- 06 -----------------------------------------------------------------------------------

def nb06() -> list[NotebookNode]:
    return [
        md('''
            # 6. End to end: a small CNN, two subtle bugs, found one after the other

            A realistic small project: a convolutional network on the 8x8 digit images, a
            data pipeline that standardizes each pixel, SGD with a learning-rate warmup. It
            has two bugs of the kind that survive code review, because each line looks
            right. We find them the way you would: run, read the first failure, open the
            captured tensors, form a hypothesis, check it, fix, run again.
        '''),
        SETUP,
        md('''
            ## The project

            The data pipeline standardizes each pixel with the mean and the standard
            deviation of that pixel over the training set: the textbook recipe.
        '''),
        code('''
            digits = load_digits()
            images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)  # (1797, 1, 8, 8)
            labels = torch.tensor(digits.target)
            split = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
            train_idx, test_idx = split[:1500], split[1500:]

            pixel_mean = images[train_idx].mean(dim=0)
            pixel_std = images[train_idx].std(dim=0)


            def normalize(x):
                return (x - pixel_mean) / pixel_std


            X_train, y_train = normalize(images[train_idx]), labels[train_idx]
            X_test, y_test = normalize(images[test_idx]), labels[test_idx]


            def batches(X, y, epochs, batch_size=64, seed=0):
                order = torch.Generator().manual_seed(seed)
                loader = DataLoader(TensorDataset(X, y), batch_size=batch_size, shuffle=True,
                                    drop_last=True, generator=order)
                for _ in range(epochs):
                    yield from loader


            @torch.no_grad()
            def accuracy(model, X, y):
                model.eval()
                acc = (model(X).argmax(1) == y).float().mean().item()
                model.train()
                return acc
        '''),
        md('''
            The model: two 3x3 convolutions, a max-pool, two linear layers. The optimizer:
            SGD with momentum at 0.02, with the learning rate ramped up linearly over the
            first 10 steps (a warmup, so the first updates of a fresh network stay small).
        '''),
        code('''
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
        '''),
        md('''
            ## First run

            `--stop-on error`: if something breaks, stop there and keep the evidence.
        '''),
        code('''
            %%neuraldbg --stop-on error -o run1
            model = cnn()
            train(model, X_train, y_train, warmup)
        '''),
        code('''
            print(run1)
        '''),
        md('''
            Stopped at step 0. The first failure is the data: **the input batch has
            non-finite values**, 192 of them, before any layer did anything. The conv layers,
            the loss and the gradients are NaN too, but they come after.

            **Step 1: look at the batch.** Where are the NaNs? Count them per pixel over
            the 64 images of the captured batch:
        '''),
        code('''
            cap = run1.inspect(run1.first_failure)
            batch = cap["batch"]                                 # (64, 1, 8, 8), as the model got it
            print(torch.isnan(batch).sum(dim=0)[0])
        '''),
        md('''
            Three pixels, NaN in all 64 images: the top-left corner and the two ends of the
            middle row. Not a broken example, then, but a pattern: something in the
            pipeline, per pixel.

            **Step 2: hypothesis.** The pipeline divides by each pixel's standard deviation.
            A pixel that is 0 in every image has a standard deviation of 0, and
            `(0 - 0) / 0` is NaN. Check it:
        '''),
        code('''
            print("pixels whose standard deviation is 0:", (pixel_std == 0).nonzero()[:, 1:].tolist())
            print("pixels that are NaN in the batch:   ", torch.isnan(batch[0]).nonzero()[:, 1:].tolist())
            print("their raw values over all 1797 images:", images[:, 0, 0, 0].unique().tolist(),
                  images[:, 0, 4, 0].unique().tolist(), images[:, 0, 4, 7].unique().tolist())
        '''),
        md('''
            Confirmed: the digits never touch these three pixels. **Fix 1**: a pixel that
            never varies carries no information; divide it by 1 instead of 0 (it becomes 0
            after centring, in every image).

            ## Second run
        '''),
        code('''
            safe_std = torch.where(pixel_std > 0, pixel_std, torch.ones_like(pixel_std))


            def normalize(x):
                return (x - pixel_mean) / safe_std


            X_train, X_test = normalize(images[train_idx]), normalize(images[test_idx])
            print("non-finite values left in the training set:", int((~torch.isfinite(X_train)).sum()))
        '''),
        code('''
            %%neuraldbg -o run2
            model = cnn()
            last_loss = train(model, X_train, y_train, warmup)
            print(f"last loss {last_loss:.3f}")
        '''),
        code('''
            run2_acc = accuracy(model, X_test, y_test)
            print(run2)
            print(f"\\ntest accuracy {run2_acc:.1%}")
        '''),
        md('''
            No NaN this time, but the network trained well for a while and then broke: the
            first failure is **one layer, long after the start: its activations jumped
            twenty-fold or more in one step**, or half of the units of the ReLU after it
            died a few steps before. (Which layer, and which of the two, depends on the
            machine's rounding: `conv2`'s or `fc1`'s jump on some, `relu3`'s dead units on
            another, with `fc1`'s jump five steps later; the story that follows is the
            same.) After it the training falls apart, and the network ends at chance.

            **Step 1: open the tensors at the first failure**, and compare them with the
            last healthy capture of the same layer (the panel's inspector shows the same
            side by side). A ReLU has no weights of its own: where the first failure is
            one, open the layer that feeds it.
        '''),
        code('''
            first = run2.first_failure
            feeds = {"relu1": "conv1", "relu2": "conv2", "relu3": "fc1"}
            cap = run2.inspect(feeds.get(first.layer, first.layer), first.step)  # the nearest
            ref = run2.last_healthy(cap)
            print(f"{cap.layer}, step {ref.step} (healthy) -> step {cap.step} (first failure)")
            for name in ("input", "output", "weight", "grad"):
                a, b = ref[name], cap[name]
                print(f"  {name:>6}: largest |value| {a.abs().max():9.3g} -> {b.abs().max():9.3g}"
                      f"   norm {a.norm():9.3g} -> {b.norm():9.3g}")
        '''),
        md('''
            The layer's weights are much larger than at its last healthy capture, a few
            dozen steps before, and nothing but the optimizer's updates changes weights. So
            **step 2: how big were the updates?** The trace has every layer's weight norm
            and output size at every step, and the learning rate:
        '''),
        code('''
            layer = run2.trace.layer_index(cap.layer)
            weight_norm = run2.trace.col("param_norm")[:, layer]
            lr = run2.trace.scalar("lr")
            output_size = run2.trace.col("act_absmax")[:, layer]
            for s in (0, 9, 30, 60, 90, 120, *range(cap.step - 6, cap.step, 2), cap.step):
                print(f"step {s:3d}: learning rate {lr[s]:.3f}   largest |output| {output_size[s]:7.1f}"
                      f"   weight norm after the update {weight_norm[s]:6.2f}")
        '''),
        md('''
            The weights grew slowly for a hundred steps, then faster and faster, each update
            bigger than the last. And the learning rate was meant to reach 0.02 at step 10
            and stay there: it **never stopped climbing**. By the first failure it is more than ten times
            the intended value. `warmup(step) = (step + 1) / WARMUP` has no ceiling.

            **Fix 2**: `min(1.0, (step + 1) / WARMUP)`.

            ## Third run: both fixes
        '''),
        code('''
            def warmup(step):
                return min(1.0, (step + 1) / WARMUP)
        '''),
        code('''
            %%neuraldbg -o run3
            model = cnn()
            last_loss = train(model, X_train, y_train, warmup)
            print(f"last loss {last_loss:.3f}")
        '''),
        code('''
            run3_acc = accuracy(model, X_test, y_test)
            print(run3)
            print(f"\\ntest accuracy {run3_acc:.1%} (second run: {run2_acc:.1%})")
        '''),
        md('''
            Healthy from the first step to the last.

            ## What the debugging took

            Neither bug raised an exception. The first made the loss NaN at step 0, which
            everyone notices, but the loss alone does not say whether the data, a layer or
            the optimizer made it. The second looked like a healthy training for over a
            hundred steps. In both, the first failure said where to look (the data; one layer
            at one step), the captured tensors showed what was wrong there (a per-pixel
            pattern of NaN; weights grown far past their healthy size), and the trace gave
            the cause (a zero standard deviation; a learning rate still climbing).

            ## The lesson, checked
        '''),
        lesson_ok('''
            f1 = run1.first_failure
            assert f1 is not None and f1.kind == "data_anomaly" and f1.layer is None, f1
            assert f1.step == 0 and run1.status == "stopped", f1
            assert torch.isnan(run1.inspect(f1)["batch"]).any(dim=0)[0].nonzero().tolist() == \\
                (pixel_std == 0)[0].nonzero().tolist()
            f2 = run2.first_failure
            assert f2 is not None and f2.signal == "activation" and f2.step > 50, f2
            assert f2.kind == "regime_shift" and f2.layer in {"conv1", "conv2", "fc1", "fc2"} \\
                or f2.kind == "dead_units" and f2.layer in {"relu1", "relu2", "relu3"}, f2
            assert cap["weight"].norm() > 1.2 * ref["weight"].norm(), "the weights grew"
            assert run2.trace.scalar("lr")[f2.step] > 5 * 0.02
            assert run2_acc < 0.3, run2_acc
            assert run3.first_failure is None, run3.first_failure
            assert run3_acc > 0.9, run3_acc
            print(f"LESSON OK: {f1.kind} step {f1.step}; then {f2.kind} {f2.layer} step {f2.step}; "
                  f"fixed run healthy")
        '''),
    ]


# -- 07 -----------------------------------------------------------------------------------

def nb07() -> list[NotebookNode]:
    return [
        md('''
            # 7. Bugs of the loop: training that runs, and is not the training you wrote

            Not every broken run goes NaN. Three bugs that notebooks make every day leave
            nothing red on the screen: a model left in evaluation mode after an evaluation,
            a layer replaced after the optimizer was made, and an optimizer made for an
            earlier copy of the model. The loss falls (or just sits there), no number
            explodes, and no other tool says a word. A fourth, a loop without
            `zero_grad()`, does break the training, dozens of steps later, in a layer that
            is not to blame.

            The lesson: each bug under `%%neuraldbg`, what the run says about it, and the
            one-line fix.
        '''),
        SETUP, DATA_MD, DATA,
        md('''
            ## The model

            A classifier with BatchNorm and dropout: the two kinds of layer that compute
            differently in training mode (`model.train()`) and in evaluation mode
            (`model.eval()`).
        '''),
        code('''
            def net():
                torch.manual_seed(0)
                return nn.Sequential(OrderedDict(
                    fc1=nn.Linear(64, 128), bn1=nn.BatchNorm1d(128), relu1=nn.ReLU(),
                    drop=nn.Dropout(0.3),
                    fc2=nn.Linear(128, 64), relu2=nn.ReLU(),
                    out=nn.Linear(64, 10),
                ))


            net()
        '''),
        md('''
            ## Bug 1: an evaluation that leaves the model in evaluation mode

            After each epoch we measure the test accuracy. The helper puts the model in
            evaluation mode, as it must, and forgets to put it back.
        '''),
        code('''
            @torch.no_grad()
            def test_accuracy(model):
                model.eval()
                return (model(X_test).argmax(1) == y_test).float().mean().item()
                # model.train() is missing
        '''),
        code('''
            %%neuraldbg -o in_eval
            model = net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for epoch in range(4):
                for xb, yb in batches(X_train, y_train, epochs=1, seed=epoch):
                    opt.zero_grad()
                    F.cross_entropy(model(xb), yb).backward()
                    opt.step()
                print(f"epoch {epoch}: test accuracy {test_accuracy(model):.1%}")
        '''),
        code('''
            print(in_eval)
        '''),
        md('''
            The first epoch (23 steps) trained in training mode. From step 23 on, after the
            first evaluation, the model trained in evaluation mode: dropout off, and
            BatchNorm normalising each batch with running statistics that it no longer
            updates, frozen at what the first epoch left. The run says so at the first step
            it happened, with how many layers it concerns. The evaluations themselves, run
            under `torch.no_grad()`, are not recorded: they train nothing.

            On this small, easy dataset the accuracy hardly shows it, and that is the
            point: the model that trained is not the one you designed (no dropout's
            regularization, BatchNorm fixed after one epoch), and neither the loss nor the
            accuracy tells you. The fix is one line, `model.train()` after evaluating (the
            `accuracy` helper of the data cell does it).

            A model kept in evaluation mode on purpose is not flagged when it has nothing
            to train (a frozen teacher), nor a BatchNorm layer put in evaluation mode inside
            a model that trains (fine-tuning with its statistics kept).

            ## Bug 2: a layer replaced after the optimizer was made

            You try a new first layer, in a cell after the one that made the optimizer. The
            optimizer still holds the old layer's parameters. The new layer gets gradients
            in every backward, and never moves.
        '''),
        code('''
            %%neuraldbg -o left_out
            model = net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            model.fc1 = nn.Linear(64, 128)   # a new first layer, after the optimizer
            for xb, yb in batches(X_train, y_train, epochs=3):
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
            left_out_acc = accuracy(model)
            print(f"test accuracy {left_out_acc:.1%}")
        '''),
        code('''
            print(left_out)
            stuck = next(e for e in left_out.events if e.kind == "weights_not_updated")
            print(stuck.message)
        '''),
        md('''
            The accuracy is fine: the other layers learn to use whatever the random first
            layer computes. What trained is not what you meant to try. The run reads each
            layer's update size on its sampled steps (every 10th): `fc1`'s was exactly 0 at
            steps 0 and 10 although its gradient was not, so from step 10 it says that the
            optimizer leaves `fc1` unchanged. The fix: make the optimizer after the model
            is final.

            ## Bug 3: an optimizer made for an earlier copy of the model

            The cell that makes the model is run again (to start over), but not the cell
            that makes the optimizer. The optimizer trains the old copy; the new one never
            changes. Here both cells are one, in the wrong order:
        '''),
        code('''
            %%neuraldbg -o stale
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
        '''),
        code('''
            print(stale)
        '''),
        md('''
            The loss never falls, and nothing is NaN. The optimizer stepped every time, but
            none of the parameters it trains belong to the model that was watched, so no
            step was recorded: the run says which optimizer problem it is, and what to do.

            ## Bug 4: no `zero_grad()`

            PyTorch adds each backward's gradients to what the parameters already hold, so
            that several backwards can make one step. Without `opt.zero_grad()` in the loop,
            every step's gradient is the sum of all the batches so far.
        '''),
        code('''
            %%neuraldbg -o no_zero
            model = net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for xb, yb in batches(X_train, y_train, epochs=3):
                loss = F.cross_entropy(model(xb), yb)   # opt.zero_grad() is missing
                loss.backward()
                opt.step()
            no_zero_acc = accuracy(model)
            print(f"last loss {loss.item():.3f}, test accuracy {no_zero_acc:.1%}")
        '''),
        code('''
            print(no_zero)
        '''),
        md('''
            The updates grew with every step until the layers broke. Those breakages are
            what a loss curve or a per-layer monitor shows, dozens of steps in; the first
            failure is the loop itself, at step 1, the first step whose gradients still held
            the last one's. (It is told from one weight's gradient: the same tensor as at
            the last step, changed only by this step's backward.)

            ## All four fixed

            Evaluate with `accuracy` (which goes back to training mode), make the optimizer
            from the final model, and zero the gradients in every step:
        '''),
        code('''
            %%neuraldbg -o fixed
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
        '''),
        code('''
            print(fixed)
        '''),
        md('''
            ## The lesson, checked
        '''),
        lesson_ok('''
            quiet = ("eval_mode", "weights_not_updated")
            (e1,) = [e for e in in_eval.events if e.kind == "eval_mode"]
            assert (e1.step, e1.layer, e1.severity, e1.value) == (23, None, "warning", 2), e1
            assert in_eval.first_failure is None
            (e2,) = [e for e in left_out.events if e.kind == "weights_not_updated"]
            assert (e2.layer, e2.step, e2.severity) == ("fc1", 10, "warning"), e2
            assert left_out_acc > 0.9, left_out_acc
            assert stale.trace.n_steps == 1 and stale_acc < 0.3, stale_acc
            assert any("made for another model" in n for n in stale.notes), stale.notes
            e4 = no_zero.first_failure
            assert (e4.kind, e4.step, e4.layer) == ("grads_not_zeroed", 1, None), e4
            assert no_zero.symptoms, "it broke the training"
            assert fixed.first_failure is None, fixed.first_failure
            assert not [e for e in fixed.events if e.kind in quiet], fixed.events
            assert fixed_acc > 0.9, fixed_acc
            print(f"LESSON OK: {e1.kind} step {e1.step}; {e2.kind} {e2.layer} step {e2.step}; "
                  f"an optimizer of an earlier model named; {e4.kind} step {e4.step}; "
                  f"fixed run quiet")
        '''),
    ]


# -- 08 -----------------------------------------------------------------------------------

def nb08() -> list[NotebookNode]:
    return [
        md('''
            # 8. Half precision: weights that stop moving

            `model.to(torch.bfloat16)` halves a model's memory in one line, and bfloat16
            has float32's range, so nothing overflows. What it does not have is float32's
            precision: 8 significant bits instead of 24. Next to a weight of 0.1, the
            bfloat16 numbers are 0.00049 apart, so an update smaller than 0.00024 is
            rounded away: the weight stays exactly where it was.

            Adam moves each weight by at most about its learning rate at every step, and
            mostly by less. At 3e-3 the updates land; after a learning-rate decay to 3e-4,
            most of them round away.
            Nothing goes NaN, the gradients look normal, the optimizer steps: the loss just
            stops falling, and the rest of the schedule does nothing.

            The lesson: the same training with bfloat16 weights and with float32 weights
            under `torch.autocast` (mixed precision, the usual fix), and how the run names
            the layers that stopped learning, at the step they stopped.
        '''),
        SETUP, DATA_MD, DATA,
        md('''
            ## Rounding in one line

            Two updates, a large one and a small one, added to a weight of 0.1 in each
            precision:
        '''),
        code('''
            for dtype in (torch.float32, torch.bfloat16):
                w = torch.tensor(0.1, dtype=dtype)
                for update in (3e-3, 1e-4):
                    print(f"{str(dtype):15} 0.1 + {update:g}: "
                          f"{'moved' if w + update != w else 'unchanged'}")
        '''),
        md('''
            ## The model and its schedule

            A small classifier, and AdamW with a step decay: the learning rate is divided by
            10 after 3 epochs (69 steps) and again after 6.
        '''),
        code('''
            def net():
                torch.manual_seed(0)
                return nn.Sequential(OrderedDict(
                    fc1=nn.Linear(64, 128), relu1=nn.ReLU(),
                    fc2=nn.Linear(128, 64), relu2=nn.ReLU(),
                    out=nn.Linear(64, 10),
                ))


            def schedule(opt):
                return torch.optim.lr_scheduler.StepLR(opt, step_size=69, gamma=0.1)


            def epoch_losses(run, steps_per_epoch=23):
                loss = run.trace.scalar("loss")
                return [loss[i:i + steps_per_epoch].mean()
                        for i in range(0, len(loss), steps_per_epoch)]
        '''),
        md('''
            ## Training in bfloat16

            Every weight is bfloat16, and so is the batch the model reads; the loss is
            taken in float32.
        '''),
        code('''
            %%neuraldbg -o half
            model = net().to(torch.bfloat16)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            sched = schedule(opt)
            for xb, yb in batches(X_train, y_train, epochs=8):
                opt.zero_grad()
                F.cross_entropy(model(xb.bfloat16()).float(), yb).backward()
                opt.step()
                sched.step()
            half_acc = accuracy(model, X_test.bfloat16())
            print(f"test accuracy {half_acc:.1%}")
        '''),
        code('''
            print(half)
            stuck = next(e for e in half.events if e.kind == "weights_not_updated")
            print(stuck.message)
        '''),
        md('''
            The run reads, on its sampled steps (every 10th), how many weights of a slice of
            each layer the update left exactly as they were. Before the first decay, a tenth
            to a third of them stood still in an update (Adam's steps are noisy, and the
            largest weights are the first to round). After it, at 3e-4, most of them did:
            `out` crossed the line (nine in ten) at step 70, the first sampled step of the
            new rate, and the others later. After the second decay, at 3e-5, all but about
            one in a hundred, in every layer:
        '''),
        code('''
            unmoved = half.trace.col("update_unmoved")
            names = half.trace.layer_names
            for step in range(0, half.trace.n_steps, 10):
                row = ", ".join(f"{name} {unmoved[step, names.index(name)]:.2%}"
                                for name in ("fc1", "fc2", "out"))
                print(f"step {step:3}: {row}")
        '''),
        md('''
            ## The fix: float32 weights, the forward under autocast

            Mixed precision keeps the weights (and the optimizer's state) in float32, where
            every update lands, and runs the forward's matrix products in bfloat16 under
            `torch.autocast`: most of the speed, none of the rounding. On a GPU, use
            `torch.autocast("cuda", dtype=torch.bfloat16)`.
        '''),
        code('''
            %%neuraldbg -o mixed
            model = net()
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
        '''),
        code('''
            print(mixed)
            print("epoch  bfloat16 weights  float32 weights + autocast")
            for epoch, (a, b) in enumerate(zip(epoch_losses(half), epoch_losses(mixed))):
                print(f"{epoch:5}  {a:16.4f}  {b:26.4f}")
        '''),
        md('''
            The two runs are close until step 69. After it, the loss of the float32 weights
            goes on falling through the low-learning-rate epochs, which is what a decay is
            for; the bfloat16 run's stays about where it was when its weights stopped
            moving.

            The warning's threshold is a fraction of weights left unchanged by one update:
            `unmoved` (0.9 by default). A healthy bfloat16 training leaves a few tenths of
            its weights unchanged in an update; set it lower (`%%neuraldbg --unmoved 0.8`)
            to be told earlier, or re-judge a finished run with
            `half.reclassify(neuraldbg_nb.Thresholds(unmoved=0.8))`.

            ## The lesson, checked
        '''),
        lesson_ok('''
            found = {e.layer: (e.step, e.signal) for e in half.events
                     if e.kind == "weights_not_updated"}
            assert sorted(found) == ["fc1", "fc2", "out"], found
            assert found["out"] == (70, "rounding"), found
            assert all(70 <= step <= 140 and signal == "rounding"
                       for step, signal in found.values()), found
            assert half.first_failure is None, half.first_failure
            assert not [e for e in mixed.events if e.severity != "info"], mixed.events
            half_loss, mixed_loss = epoch_losses(half), epoch_losses(mixed)
            assert abs(half_loss[2] - mixed_loss[2]) < 0.01, (half_loss, mixed_loss)
            fell_half, fell_mixed = half_loss[4] - half_loss[7], mixed_loss[4] - mixed_loss[7]
            assert fell_mixed > 2 * fell_half, (half_loss, mixed_loss)
            assert mixed_acc > 0.9, mixed_acc
            print(f"LESSON OK: weights_not_updated out step {found['out'][0]} (rounding), "
                  f"fc1 and fc2 by step 140; the loss stopped falling; float32 weights with "
                  f"autocast quiet")
        '''),
    ]


NOTEBOOKS = {
    "01_vanishing_gradients.ipynb": nb01,
    "02_exploding_gradients.ipynb": nb02,
    "03_dead_relus.ipynb": nb03,
    "04_nan_hunting.ipynb": nb04,
    "05_thresholds_and_regime_shifts.ipynb": nb05,
    "06_end_to_end.ipynb": nb06,
    "07_bugs_of_the_loop.ipynb": nb07,
    "08_half_precision.ipynb": nb08,
}


def render(name: str) -> str:
    """The text of notebook `name` as this file writes it (the committed notebook must be
    exactly this: `tests/test_notebooks.py` checks, so an edit made in the notebook alone
    is not undone by the next build)."""
    nb = new_notebook(cells=NOTEBOOKS[name]())
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):   # stable ids: rebuilding gives no spurious diff
        cell["id"] = f"{name[:2]}-{i:02d}"
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def build(names: list[str] | None = None) -> list[Path]:
    written = []
    for name in NOTEBOOKS:
        if names and not any(n in name for n in names):
            continue
        path = HERE / name
        path.write_text(render(name), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for p in build(sys.argv[1:]):
        print(f"wrote {p.relative_to(HERE.parent)}")
