"""Experiments: configs, the sweep runner, its store, scoring and metrics, and localization."""
