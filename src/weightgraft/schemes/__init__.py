"""The scheme language: position, layer and component selectors, rules and schemes compiled to
the engine's source maps, the paper's preset families and the grafting protocols."""
