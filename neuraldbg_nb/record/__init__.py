"""The torch side: hooks that measure one step of training into the trace.

Everything here runs inside the user's training (forward and optimizer hooks, the loss
tap) or at the step boundary; it only records. Classification lives in `detect`.
`probe.Probe` installs and removes the hooks; each part records one thing: the models and
their layers (`discovery`), each layer's output (`forward`), the input batch (`inputs`),
the backwards and the loss (`backward`), the optimizers' steps (`optimizer`), the step's
row (`boundary`), the engine's own time (`timing`).
"""
