"""Experiments: selectors, schemes and presets, configs, the sweep runner, its store and metrics."""
