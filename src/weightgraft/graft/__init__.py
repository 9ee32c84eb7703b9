"""Grafting: architecture adapters, the one-pass engine, prefix sharing, the per-token
definition it is held to, and the check that compares them on any models."""
