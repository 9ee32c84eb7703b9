"""The notebook front door: load models, graft prompts, compare schemes (``weightgraft.load``,
``weightgraft.graft``, ``weightgraft.compare``), built on the engine and the runner's pieces.
The names are exported from ``weightgraft`` itself; the modules here are ``load``, ``graft``,
``compare``, ``outputs``, ``inputs`` (checks), ``batch`` (padding) and ``presets``."""
