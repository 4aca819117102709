"""One rank of a 2-process DistributedDataParallel training on the CPU (gloo), watched;
run by `tests/test_distributed.py` under `python -m torch.distributed.run`.

Rank 1's input batch holds a NaN at step FAULT_STEP. `_ddp_train.py OUT [STOP_ON]`:
each rank saves its run to OUT/rank<r>.npz and its story to OUT/rank<r>.txt; `_ddp_train.py
--unwatched`: the training alone, for `neuraldbg run`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import neuraldbg_nb as ndbg

FAULT_STEP = 12
FAULTY_RANK = 1
STEPS = 20


def train() -> None:
    """The training loop, as a user writes it (`dist.init_process_group` included)."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same weights on every rank, as DDP expects
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    batches = [(torch.randn(32, 8, generator=g), torch.randint(0, 4, (32,), generator=g))
               for _ in range(4)]
    for step in range(STEPS):
        x, y = batches[step % 4]
        if rank == FAULTY_RANK and step == FAULT_STEP:
            x = x.clone()
            x[3, 5] = float("nan")
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def main(out: Path, stop_on: Literal["error", "never"]) -> None:
    """Watched from inside the script: `watch()` with no model watches the DDP wrapper
    that runs in the block (entered before the process group exists, as the CLI's is)."""
    try:
        with ndbg.watch(report=False, stop_on=stop_on) as run:
            train()
    except ndbg.TrainingFailure:
        pass  # run.status says so
    rank = dist.get_rank()
    run.save(out / f"rank{rank}")
    (out / f"rank{rank}.txt").write_text(str(run))
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:] == ["--unwatched"]:  # under `neuraldbg run`, which watches it
        train()
        dist.destroy_process_group()
    else:
        main(Path(sys.argv[1]), "error" if sys.argv[2:] == ["error"] else "never")
