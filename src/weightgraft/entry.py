"""The process entry (``weightgraft`` and ``python -m weightgraft``): OpenMP reads its wait
policy once, when torch loads, so the default is set here, before anything imports torch."""

from __future__ import annotations

import os


def main() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # waiting threads yield the core
    from weightgraft.cli import main as cli_main

    cli_main()
