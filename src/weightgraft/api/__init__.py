"""The notebook front door: load models, graft prompts, compare schemes (``weightgraft.load``,
``weightgraft.graft``, ``weightgraft.compare``, ...), built on the engine and the runner's
pieces; each call's inputs are checked and bound by ``weightgraft.schemes.binding``. The names
are exported from ``weightgraft`` itself: ``graft`` (logits and what they come in), ``grafted``
(the model itself, grafted), ``generate``, ``compare``, ``explain`` (what to read before a graft
runs: its slots, a prompt's tokens, a model's trained facts), ``activations``, ``load``,
``localize``, ``presets``."""
