"""DistributedDataParallel on the CPU: two real processes (gloo) under torchrun, each
watching its own replica. Rank 1's input batch holds a NaN at a known step. Not skipped
where gloo is missing: the CPU builds of PyTorch that CI installs all have it, and a
build without it should fail here, not pass quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import neuraldbg_nb as ndbg

pytestmark = pytest.mark.distributed

HERE = Path(__file__).resolve().parent.parent  # tests/, where the helper scripts are


def _torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    """Two processes under torchrun, on this checkout's package."""
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", *args], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    _torchrun(str(HERE / "_ddp_train.py"), str(out))
    return out


def test_the_rank_whose_batch_went_bad_names_its_input_at_the_step(ranks: Path) -> None:
    from _ddp_train import FAULT_STEP, FAULTY_RANK

    run = ndbg.load(ranks / f"rank{FAULTY_RANK}.npz")
    ff = run.first_failure
    assert (ff.kind, ff.layer, ff.step) == ("data_anomaly", None, FAULT_STEP), ff
    story = (ranks / f"rank{FAULTY_RANK}.txt").read_text()
    assert story.startswith(f"neuraldbg [rank {FAULTY_RANK} of 2]: first failure: input batch")
    assert run.rank == (FAULTY_RANK, 2)


def test_layers_are_named_as_in_the_model_inside_the_wrapper(ranks: Path) -> None:
    run = ndbg.load(ranks / "rank0.npz")
    assert [layer.name for layer in run.trace.layers] == ["0", "1", "2"]


def test_a_healthy_rank_points_at_the_others_for_a_failure_of_its_gradients(
        ranks: Path) -> None:
    """Rank 0's batches are healthy; the NaN reaches its gradients through the all-reduce
    at the same step. Its first failure is then in its gradients or update, and the
    story says that another rank may hold the cause."""
    from _ddp_train import FAULT_STEP

    run = ndbg.load(ranks / "rank0.npz")
    ff = run.first_failure
    assert ff.step == FAULT_STEP and ff.kind in ("nonfinite_gradient", "exploding_update"), ff
    assert not [e for e in run.events if e.step <= FAULT_STEP
                and e.kind in ("data_anomaly", "nonfinite_activation")]
    story = str(run)
    assert story.startswith("neuraldbg [rank 0 of 2]: first failure:")
    assert "another rank's batch or forward" in story


def test_under_the_cli_each_rank_saves_its_own_run(tmp_path: Path) -> None:
    """`torchrun -m neuraldbg_nb.cli run train.py`: the watch starts before the script
    makes its process group; each rank still knows its rank (torchrun's variables) and
    saves its own file, where both wrote neuraldbg-run.npz."""
    from _ddp_train import FAULT_STEP, FAULTY_RANK

    done = _torchrun("-m", "neuraldbg_nb.cli", "run", "--save", str(tmp_path / "ddp.npz"),
                     str(HERE / "_ddp_train.py"), "--unwatched")
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["ddp.rank0.npz", "ddp.rank1.npz"]
    bad = ndbg.load(tmp_path / f"ddp.rank{FAULTY_RANK}.npz")
    assert (bad.first_failure.kind, bad.first_failure.step) == ("data_anomaly", FAULT_STEP)
    assert f"neuraldbg [rank {FAULTY_RANK} of 2]: first failure: input batch" in done.stderr


def test_stop_on_error_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    """The bad batch's NaN reaches every rank's gradients in the all-reduce, so each rank
    stops at that step (one rank stopped alone would leave the others waiting in the
    next collective): the job ends, where it would hang."""
    from _ddp_train import FAULT_STEP, FAULTY_RANK

    _torchrun(str(HERE / "_ddp_train.py"), str(tmp_path), "error")
    for rank in (0, 1):
        run = ndbg.load(tmp_path / f"rank{rank}.npz")
        assert run.status == "stopped" and run.trace.n_steps == FAULT_STEP + 1, rank
        kind = run.first_failure.kind
        assert (kind == "data_anomaly") == (rank == FAULTY_RANK), (rank, kind)
