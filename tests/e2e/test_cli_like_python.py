"""`neuraldbg run` runs a script as `python` does: the script's folder first on `sys.path`
(sibling imports), `-m package.module`, the script's exit code kept, `sys.exit(0)` and a
normal end a clean finish, and a plain note where it watched no optimizer step. Each case
runs in a subprocess, as a user's shell runs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import neuraldbg_nb as ndbg

TRAIN = """
import torch
from torch import nn

def train(steps=30, fault_step=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        x = torch.randn(16, 8, generator=g)
        if step == fault_step:
            x[0, 0] = float("nan")
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
"""


def neuraldbg(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuraldbg_nb.cli", "run", "--save",
                           str(cwd / "out.npz"), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, check=False)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_script_imports_its_siblings_and_a_normal_end_is_a_clean_finish(tmp_path):
    code = tmp_path / "project"
    write(code, "helpers.py", TRAIN)
    write(code, "main.py", "from helpers import train\ntrain(fault_step=12)\nprint('done')\n")
    done = neuraldbg(tmp_path, str(code / "main.py"))  # run from another folder
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout
    run = ndbg.load(tmp_path / "out.npz")
    assert run.status == "finished"
    assert (run.first_failure.kind, run.first_failure.step) == ("data_anomaly", 12)


def test_a_script_that_changes_folder_finds_its_own_and_the_run_is_saved_where_asked(
        tmp_path):
    """As under `python`, the script's `__file__` is absolute: a script started by a
    relative path that changes its working directory (as Hydra does) still reads a file
    beside it; the run goes where `--save` said, relative to where the command ran."""
    code = tmp_path / "project"
    write(code, "helpers.py", TRAIN)
    write(code, "cfg.txt", "30\n")
    elsewhere = tmp_path / "outputs"
    elsewhere.mkdir()
    write(code, "main.py", f"""
        import os, sys
        sys.path.insert(0, os.path.dirname(__file__))
        from helpers import train
        os.chdir({str(elsewhere)!r})
        steps = int(open(os.path.join(os.path.dirname(__file__), "cfg.txt")).read())
        train(steps=steps, fault_step=12)
        print("absolute", os.path.isabs(__file__))
        """)
    done = subprocess.run([sys.executable, "-m", "neuraldbg_nb.cli", "run", "--save",
                           "kept.npz", "project/main.py"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert "absolute True" in done.stdout
    assert not (elsewhere / "kept.npz").exists()
    run = ndbg.load(tmp_path / "kept.npz")
    assert run.trace.n_steps == 30 and run.first_failure.step == 12
    assert str(tmp_path / "kept.npz") in done.stderr


def test_a_script_that_never_starts_is_said_as_python_says_it_and_keeps_the_last_run(
        tmp_path):
    """A script that does not compile, or a module that is not there: the error as
    `python` gives it, exit code 1, and the run saved before at the same path stays (a
    typo does not cost the last recorded run)."""
    write(tmp_path, "main.py", TRAIN + "train()\n")
    assert neuraldbg(tmp_path, "main.py").returncode == 0
    before = (tmp_path / "out.npz").read_bytes()
    write(tmp_path, "typo.py", "x = (\n")
    done = neuraldbg(tmp_path, "typo.py")
    assert done.returncode == 1 and "SyntaxError" in done.stderr, done.stderr
    assert "typo.py" in done.stderr and "line 1" in done.stderr
    done = neuraldbg(tmp_path, "-m", "no_such_module_here")
    assert done.returncode == 1 and "No module named no_such_module_here" in done.stderr
    assert "Traceback" not in done.stderr
    write(tmp_path, "pkg/__init__.py", "")
    done = neuraldbg(tmp_path, "-m", "pkg.not_there")
    assert done.returncode == 1 and "No module named pkg.not_there" in done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "out.npz").read_bytes() == before


GLOBALS = """
import pickle, sys
class Config:
    pass
def scaled(x: float) -> float:
    return x
seen = {k: type(v).__name__ if k in ("__builtins__", "__loader__") else v
        for k, v in globals().items() if k.startswith("__") and k != "__doc__"}
print(sorted(seen.items()), scaled.__annotations__,
      type(pickle.loads(pickle.dumps(Config()))).__qualname__,
      sys.modules["__main__"].__dict__ is globals())
"""


def test_a_script_sees_the_globals_python_gives_it(tmp_path):
    """`__file__`, `__loader__`, `__package__`, `__spec__`, `__builtins__` and
    `__annotations__` as python sets them, annotations not turned into strings by the
    command's own future imports, a class the script defines pickled by its name in
    `__main__`."""
    script = write(tmp_path, "main.py", GLOBALS)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path, check=True)
    done = neuraldbg(tmp_path, str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout, (done.stdout, plain.stdout)


def test_dash_m_runs_a_module_of_a_package_from_the_current_folder(tmp_path):
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/helpers.py", TRAIN)
    write(tmp_path, "pkg/train.py", """
        import sys
        from pkg.helpers import train
        assert __name__ == "__main__"
        train(fault_step=int(sys.argv[1]))
    """)
    done = neuraldbg(tmp_path, "-m", "pkg.train", "7")
    assert done.returncode == 0, done.stderr
    run = ndbg.load(tmp_path / "out.npz")
    assert run.first_failure.step == 7 and run.trace.n_steps == 30


@pytest.mark.parametrize("ending, code, status", [
    ("sys.exit(0)", 0, "finished"),
    ("sys.exit()", 0, "finished"),
    ("sys.exit(3)", 3, "exited"),
    ("raise ValueError('bad config')", 1, "raised"),
])
def test_the_scripts_exit_code_is_kept_and_the_run_saved(tmp_path, ending, code, status):
    write(tmp_path, "helpers.py", TRAIN)
    write(tmp_path, "main.py", f"import sys\nfrom helpers import train\ntrain()\n{ending}\n")
    done = neuraldbg(tmp_path, "main.py")
    assert done.returncode == code, done.stderr
    assert "training raised an exception" not in done.stderr or code == 1
    if code == 1:
        assert "ValueError: bad config" in done.stderr
        assert 'File "' in done.stderr and "main.py" in done.stderr
        # as python prints it: from the script's own frame on
        tb = done.stderr[done.stderr.index("Traceback"):]
        assert "cli.py" not in tb and "runpy" not in tb, tb
        assert tb.splitlines()[1].strip().startswith('File "') and "main.py" in \
            tb.splitlines()[1], tb
    run = ndbg.load(tmp_path / "out.npz")
    assert run.status == status and run.trace.n_steps == 30


def test_a_script_without_an_optimizer_step_gets_a_note_that_says_so(tmp_path):
    write(tmp_path, "main.py", """
        import torch
        from torch import nn
        model = nn.Linear(4, 1)
        for _ in range(5):
            model(torch.randn(8, 4)).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
    """)
    done = neuraldbg(tmp_path, "main.py")
    assert done.returncode == 0, done.stderr
    run = ndbg.load(tmp_path / "out.npz")
    assert run.unstepped is not None
    assert "optimizer" in (" ".join(run.notes) + run.unstepped)


def test_no_script_and_no_module_is_a_clear_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "neuraldbg_nb.cli", "run"],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 2 and "give a script to run, or -m MODULE" in done.stderr


@pytest.mark.parametrize("end", ["interrupt", "exit 130"])
def test_ctrl_c_ends_the_command_as_it_ends_python(tmp_path, end):
    """A script stopped by Ctrl-C (KeyboardInterrupt at step 5): the command prints its
    traceback and ends by SIGINT, as `python` does (a caller sees the interrupt, a shell
    reads 130), and the run up to it is saved. A script that exits with code 130 itself
    ends with that code, as under `python`."""
    stop = "raise KeyboardInterrupt" if end == "interrupt" else "raise SystemExit(130)"
    script = write(tmp_path, "stopped.py", TRAIN + f"""
import torch.optim
_step = torch.optim.SGD.step
def step(self, *a, _n=[0], **k):
    _n[0] += 1
    if _n[0] == 6:
        {stop}
    return _step(self, *a, **k)
torch.optim.SGD.step = step
train()
""")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path, check=False)
    done = neuraldbg(tmp_path, str(script))
    assert done.returncode == plain.returncode == (-2 if end == "interrupt" else 130), (
        done.stderr)
    assert ("KeyboardInterrupt" in done.stderr) == ("KeyboardInterrupt" in plain.stderr)
    run = ndbg.load(tmp_path / "out.npz")
    assert run.trace.n_steps >= 5 and run.status == ("interrupted" if end == "interrupt"
                                                     else "exited")
