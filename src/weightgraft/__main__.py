"""``python -m weightgraft`` (also what ``torchrun -m weightgraft`` runs)."""

from weightgraft.cli import main

main()
