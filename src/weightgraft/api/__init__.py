"""The notebook front door: load models, graft prompts, compare schemes (``weightgraft.load``,
``weightgraft.graft``, ``weightgraft.compare``, ...), built on the engine and the runner's
pieces; each call's inputs are checked and bound by ``weightgraft.schemes.binding``. The names
are exported from ``weightgraft`` itself; one module per call, plus ``outputs`` (what
``graft`` returns) and ``batch`` (padding)."""
