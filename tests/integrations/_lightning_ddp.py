"""Two CPU ranks on gloo through Lightning's own DDP launcher (it starts rank 1 by running
this script again). Rank FAULTY_RANK's batch of step FAULT_STEP holds a NaN (its data does). Each rank's
run is saved into OUT (the trainer's root folder): `_lightning_ddp.py OUT`."""

from __future__ import annotations

import math
import sys
import warnings

import torch
from torch import nn

FAULT_STEP = 12
FAULTY_RANK = 1


def main(out: str) -> None:
    import lightning.pytorch as pl

    from neuraldbg_nb.integrations.lightning import NeuralDbgCallback

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x[:, 0] > 0).long()
    made = [0]

    def collate(rows):  # a bad record in rank FAULTY_RANK's share of the data
        xb, yb = torch.utils.data.default_collate(rows)
        if made[0] == FAULT_STEP and torch.distributed.get_rank() == FAULTY_RANK:
            xb[0, 0] = math.nan
        made[0] += 1
        return xb, yb

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16,
                                         collate_fn=collate)
    warnings.simplefilter("ignore")
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp",
                         callbacks=[NeuralDbgCallback()], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=out)
    trainer.fit(Net(), loader)


if __name__ == "__main__":
    main(sys.argv[1])
