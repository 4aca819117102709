"""`%%neuraldbg` as a new user meets it: `--help` alone in a cell, the magic available after
`import neuraldbg_nb`, and a traceback from the cell that shows the user's own lines and not
the magic's frames."""

from __future__ import annotations

import subprocess
import sys

import pytest
from IPython.testing.globalipapp import get_ipython


@pytest.fixture
def ip():
    import IPython

    shell = IPython.get_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "neuraldbg_nb")
    return shell


def test_help_alone_in_a_cell_prints_the_options(ip, capsys) -> None:
    result = ip.run_cell("%%neuraldbg --help\n")
    out = capsys.readouterr().out
    assert result.success, result.error_in_exec or result.error_before_exec
    assert "--stop-on" in out and "--max-update" in out, out[:500]


def test_a_traceback_shows_the_cells_lines_not_the_magics(ip, capsys) -> None:
    result = ip.run_cell("%%neuraldbg --no-panel\nx = 1\ndenominator = 0\ny = x / denominator\n")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "y = x / denominator" in text, text[-2000:]
    assert "magic.py" not in text and "exec(code, shell.user_ns)" not in text, text[-2000:]


def test_importing_the_package_in_a_kernel_makes_the_magic_available() -> None:
    code = ("from IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\n"
            "assert 'neuraldbg' not in ip.magics_manager.magics['cell']\n"
            "import neuraldbg_nb\n"
            "print('neuraldbg' in ip.magics_manager.magics['cell'])\n")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip().endswith("True"), out.stdout + out.stderr
