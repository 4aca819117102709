"""A throwaway Jupyter server for the real-browser test, and what differs between the two
front ends it serves: JupyterLab 4 (`/lab`) and Notebook 7 (`/notebooks`, `/tree`; the
`notebook` server extension, enabled when the package is installed).

Loopback only, a free port, a token, and every Jupyter/IPython directory isolated in a
temporary folder (nothing is written to ~/.local, ~/.jupyter or ~/.ipython). The kernel is
this interpreter (`sys.executable`): a kernelspec naming it is written into the private
data dir, so it wins over any other `python3` kernelspec. The server runs in its own
process group, and `stop()` ends the group, kernels included.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# JupyterLab settings for a test: every cell stays in the DOM (no virtual windowing), and
# no news or update popups cover the cells.
SETTINGS_OVERRIDES = {
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension:notification": {
        "checkForUpdates": False,
        "fetchNews": "false",
    },
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class UI:
    """One Jupyter front end: where it serves a notebook, and how its page shows that the
    notebook's kernel is connected and idle (each selector must match)."""

    name: str  # a short id: artifact folders, test ids
    title: str  # for messages
    path: str  # URL of a notebook, formatted with `notebook` and `token`
    app_name: str  # page config `appName`
    min_version: int  # lowest major `appVersion`
    kernel_ready: tuple[str, ...]


LAB = UI(
    name="lab", title="JupyterLab 4",
    path="/lab/tree/{notebook}?token={token}&reset",
    app_name="JupyterLab", min_version=4,
    # The status bar reads "Python 3 (ipykernel) | Idle" once the kernel is connected.
    kernel_ready=("#jp-main-statusbar >> text=/Idle/",),
)

NOTEBOOK7 = UI(
    name="notebook7", title="Notebook 7",
    path="/notebooks/{notebook}?token={token}",
    app_name="Jupyter Notebook", min_version=7,
    # No status bar. The top bar's kernel status gets `-fade` alone only for an idle or busy
    # (connected) kernel; `-info` while starting or connecting. The toolbar's execution
    # indicator reads idle before any kernel exists, hence both.
    kernel_ready=(
        ".jp-NotebookKernelStatus-fade:not(.jp-NotebookKernelStatus-info)",
        '.jp-Notebook-ExecutionIndicator[data-status="idle"]',
    ),
)


def notebook7_version() -> str | None:
    """The installed `notebook` package's version, or None."""
    try:
        return importlib.metadata.version("notebook")
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_requirements(ui: UI | None = None) -> list[str]:
    """What the browser test (of `ui`, or of what both UIs share) needs and this machine
    lacks, each with how to install it."""
    out = []
    if ui is NOTEBOOK7:
        version = notebook7_version()
        if version is None or int(version.split(".")[0]) < 7:
            have = f"notebook {version} is installed" if version else "not installed"
            out.append(f"Notebook 7 ({have}): pip install 'notebook>=7' (or pip install -e "
                       f"'.[test]')")
        return out
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        out.append("JupyterLab: pip install 'jupyterlab>=4' (or pip install -e '.[test]')")
    try:
        import ipykernel  # noqa: F401
    except ImportError:
        out.append("ipykernel: pip install ipykernel (or pip install -e '.[test]')")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        out.append("Playwright for Python: pip install playwright (or pip install -e "
                   "'.[test]'); do NOT run `playwright install`, the test uses the system "
                   "Chromium")
    return out


@dataclass
class Server:
    """A running Jupyter server (JupyterLab, plus Notebook 7 when installed). `root` is its
    root dir (put notebooks there)."""

    root: Path
    port: int
    token: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    dirs: dict[str, Path] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, notebook: str, ui: UI = LAB) -> str:
        return self.base_url + ui.path.format(notebook=notebook, token=self.token)

    def api(self, path: str, method: str = "GET") -> Any:
        """Call the server's REST API; the decoded JSON answer (None when empty)."""
        req = urllib.request.Request(f"{self.base_url}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def shut_down_sessions(self) -> None:
        """End every notebook session and its kernel (between tests sharing the server)."""
        for session in self.api("sessions"):
            self.api(f"sessions/{session['id']}", method="DELETE")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_until_serving(self, timeout: float = 60.0) -> None:
        """Wait until the server answers on its port; stop it and raise if it does not."""
        try:
            _wait_until_serving(self, timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """End the server's process group (server and kernels): TERM, then KILL."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        # Kernels live in the same group and may outlive the server by a moment.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - should not happen
            pass


def start_server(tmp: Path, timeout: float = 60.0) -> Server:
    """Start the server with its root and all its state under `tmp`; wait until it serves."""
    server = launch_server(tmp)
    server.wait_until_serving(timeout)
    return server


def launch_server(tmp: Path) -> Server:
    """Start JupyterLab (and Notebook 7, when installed: one server serves both) with its
    root and all its state under `tmp`, without waiting for it (do something else
    meanwhile, then `server.wait_until_serving()`)."""
    root = tmp / "root"
    root.mkdir(parents=True, exist_ok=True)
    dirs = {
        name: tmp / sub
        for name, sub in [
            ("JUPYTER_CONFIG_DIR", "config"),
            ("JUPYTER_DATA_DIR", "data"),
            ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("IPYTHONDIR", "ipython"),
            ("JUPYTERLAB_SETTINGS_DIR", "user-settings"),
            ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
        ]
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    # The overrides go in as user settings of the private settings dir: same effect as an
    # overrides.json, without writing into the environment's share/jupyter/lab/settings.
    for plugin, values in SETTINGS_OVERRIDES.items():
        package, name = plugin.split(":")
        path = dirs["JUPYTERLAB_SETTINGS_DIR"] / package / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=1))
    # Both front ends named, not left to what the environment's config happens to enable.
    # Notebook 7 reads the same user settings dir as JupyterLab, so the overrides hold there.
    extensions = {"jupyterlab": True}
    if importlib.util.find_spec("notebook") is not None:
        extensions["notebook"] = True
    (dirs["JUPYTER_CONFIG_DIR"] / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": extensions}}, indent=1))

    # The kernel is this very interpreter, named explicitly (no "python" resolved via PATH).
    spec = dirs["JUPYTER_DATA_DIR"] / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "metadata": {"debugger": False},
    }, indent=1))

    env = dict(os.environ)
    env.update({k: str(v) for k, v in dirs.items()})
    env["HOME"] = str(tmp / "home")  # anything else that writes to ~ writes here
    (tmp / "home").mkdir(exist_ok=True)
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_TOKEN", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MPLBACKEND", "Agg")

    port = free_port()
    token = secrets.token_hex(16)
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser", "--allow-root",
        "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--MappingKernelManager.cull_idle_timeout=0",
    ]
    log_path = tmp / "jupyter-server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the child holds it; closed with the process
    try:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()
    return Server(root=root, port=port, token=token, proc=proc, log_path=log_path, dirs=dirs)


def _wait_until_serving(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"The Jupyter server exited with code "
                               f"{server.proc.returncode} before serving:\n"
                               f"{server.log()[-4000:]}")
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=1):
                pass
            url = f"{server.base_url}/api/status?token={server.token}"
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"The Jupyter server did not serve on port {server.port} "
                               f"within {timeout:.0f} s:\n{server.log()[-4000:]}")
        time.sleep(0.25)


def write_notebook(path: Path, sources: list[str]) -> None:
    """A notebook of code cells with these sources, no outputs, for this interpreter's
    kernel (`python3`: the kernelspec the server's data dir holds)."""
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
              "outputs": [], "source": src} for i, src in enumerate(sources)]
    path.write_text(json.dumps({
        "cells": cells, "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)",
                                    "language": "python", "name": "python3"},
                     "language_info": {"name": "python"}}}, indent=1))


TWO_RUNS_SETUP = """\
import neuraldbg_nb as ndbg
import torch
from torch import nn
torch.set_num_threads(1)

def recipe(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)

g = torch.Generator().manual_seed(0)
X, Y = torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g)

def train(model, opt, fault_at=None):
    for step in range(60):
        if step == fault_at:
            with torch.no_grad():
                model[2].weight.mul_(1000)
        opt.zero_grad()
        nn.functional.cross_entropy(model(X[step % 8::8]), Y[step % 8::8]).backward()
        opt.step()
print("READY")"""
"""The setup cell of the notebooks that train a recipe healthy and broken: `recipe(seed)`
makes a five-layer MLP and its Adam; `train(model, opt, fault_at)` trains 60 steps, layer
"2"'s weights multiplied by 1000 in place at `fault_at`."""
