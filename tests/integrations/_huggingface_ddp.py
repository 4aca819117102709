"""Two CPU ranks on gloo under torchrun, a transformers Trainer in each, LAYER's weights
multiplied in place at step FAULT on both replicas. `_huggingface_ddp.py OUT`."""

from __future__ import annotations

import sys
import warnings

from test_huggingface import FAULT, Fault, train  # noqa: F401  (FAULT: the test reads it)

from neuraldbg_nb.integrations.huggingface import NeuralDbgCallback

if __name__ == "__main__":
    warnings.simplefilter("ignore")
    train([Fault("weights"), NeuralDbgCallback()], sys.argv[1], steps=24, ddp_backend="gloo")
