"""The scheme language: position, layer and component selectors, rules and schemes compiled to
the engine's source maps, the registry of graft families (``families``) with the paper's
presets, and the grafting protocols; and the one place a graft is prepared for the engine
(``binding``: inputs checked, schemes compiled against the base model, prompts encoded)."""
