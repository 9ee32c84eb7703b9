"""``python -m weightgraft`` (also what ``torchrun -m weightgraft`` runs)."""

from weightgraft.entry import main

main()
