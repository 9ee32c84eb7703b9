"""The engine: architecture adapters (model_type -> slots), the one-pass grafted forward, the
forward swaps it makes for a pass (``swaps``, undone on any exit), prefix sharing, the
per-token definition it is held to, the check that compares them on any models, partial
grafts, graft attribution and exact cell effects."""
