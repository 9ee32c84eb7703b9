"""Exact shares of sets of cell keys over a template's prompts: the one measure that the
minimal graft search, its controls, the missed-effects estimate and the refinement all report.

A key ``(position label, slot)`` names one cell in every prompt that has the label; a prompt
without it gets nothing from that key (``received`` counts what each prompt got). The share
of a set K is ``mean_i [M_i(base + K) - M_i(base)] / mean_i [M_i(donor) - M_i(base)]``; every
call is one batched ``exact_effects`` pass (integer grafts, prefix sharing), never an estimate.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from weightgraft.engine.attribution import Metric
from weightgraft.engine.cells import Cell, ScoredExample, exact_effects, exact_effects_in

CellKey = tuple[str, str]  # (position label, slot name)


class SetVerifier:
    """Exact effects and shares of key sets over one group of prompts."""

    def __init__(self, models: Sequence[nn.Module], examples: Sequence[ScoredExample],
                 cell_maps: Sequence[dict[CellKey, Cell]], pad_id: int, metric: Metric = "first_logprob",
                 chunk: int = 512, total: float | None = None) -> None:
        self.models, self.examples, self.cell_maps = models, examples, cell_maps
        self.pad_id, self.metric, self.chunk = pad_id, metric, chunk
        if total is None:
            total = float(self.effects([self.candidates()])[0])
        self.total = total

    def candidates(self) -> list[CellKey]:
        """Every key some prompt has, in a fixed order (sorted): what controls draw from."""
        return sorted(set().union(*(m.keys() for m in self.cell_maps)))

    def per_prompt(self, sets: Sequence[Sequence[CellKey]]) -> torch.Tensor:
        """``[n_prompts, len(sets)]`` float64: the exact effect of grafting each set in each prompt."""
        if not sets:
            return torch.zeros(len(self.examples), 0, dtype=torch.float64)
        per_example = [[[m[k] for k in keys if k in m] for keys in sets] for m in self.cell_maps]
        _, eff = exact_effects(self.models, self.examples, per_example, pad_id=self.pad_id, metric=self.metric, chunk=self.chunk)
        return torch.stack(eff).double()

    def per_prompt_sets(self, sets: Sequence[Sequence[Sequence[CellKey]]]) -> torch.Tensor:
        """``[n_prompts, len(sets)]`` float64: each set names its keys per prompt (``sets[j][i]``:
        the keys grafted in prompt i), as the claims' per-prompt nulls need."""
        if not sets:
            return torch.zeros(len(self.examples), 0, dtype=torch.float64)
        per_example = [[[m[k] for k in s[i] if k in m] for s in sets] for i, m in enumerate(self.cell_maps)]
        _, eff = exact_effects(self.models, self.examples, per_example, pad_id=self.pad_id, metric=self.metric, chunk=self.chunk)
        return torch.stack(eff).double()

    def per_prompt_sets_in(self, sets: Sequence[Sequence[Sequence[CellKey]]], metrics: Sequence[Metric]) -> torch.Tensor:
        """:meth:`per_prompt_sets` in several metrics from the same passes: ``[n_prompts, len(sets),
        len(metrics)]`` float64."""
        if not sets:
            return torch.zeros(len(self.examples), 0, len(metrics), dtype=torch.float64)
        per_example = [[[m[k] for k in s[i] if k in m] for s in sets] for i, m in enumerate(self.cell_maps)]
        _, eff = exact_effects_in(self.models, self.examples, per_example, pad_id=self.pad_id, metrics=metrics,
                                  chunk=self.chunk)
        return torch.stack(eff).double()

    def effects(self, sets: Sequence[Sequence[CellKey]]) -> torch.Tensor:
        """``[len(sets)]`` float64: the mean over prompts of the exact effect of grafting each set."""
        if not sets:
            return torch.zeros(0, dtype=torch.float64)
        return self.per_prompt(sets).mean(dim=0)

    def shares(self, sets: Sequence[Sequence[CellKey]]) -> list[float]:
        """Each set's exact share of the donor's total effect."""
        if not self.total:
            return [float("nan")] * len(sets)
        return (self.effects(sets) / self.total).tolist()

    def received(self, keys: Sequence[CellKey]) -> list[int]:
        """Per prompt, how many of ``keys`` it has (a key at a label a prompt lacks grafts nothing)."""
        return [sum(k in m for k in keys) for m in self.cell_maps]


def received_summary(verifier: SetVerifier, keys: Sequence[CellKey], example_ids: Sequence[str]) -> dict:
    """How many of a set's cells each prompt actually received, and which prompts got fewer."""
    counts = verifier.received(keys)
    short = {i: c for i, c in zip(example_ids, counts) if c < len(keys)}
    return {"size": len(keys), "min": min(counts, default=0), "max": max(counts, default=0),
            "n_prompts_short": len(short), "short": short}
