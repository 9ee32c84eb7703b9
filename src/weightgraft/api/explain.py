"""``weightgraft.explain``: which slots each rule grafts on a model, before anything runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from weightgraft.schemes.protocol import DEFAULT_PROTOCOL
from weightgraft.schemes.binding import Rules, as_scheme, compile_for, input_errors



if TYPE_CHECKING:  # annotations only: importing weightgraft does not import transformers
    from torch import nn

def explain(rules: Rules, model: nn.Module, *, protocol: str = DEFAULT_PROTOCOL, base: str = "pre") -> pd.DataFrame:
    """One row per rule: the role it takes weights from, its position selector, and the layers,
    per-layer components and global slots (embed, final_norm, unembed) it selects on ``model``
    (later rules win where they overlap). Nothing runs: this is the rule as compiled.

    A layer selector other than ``all`` keeps only the global slots a rule's components name
    one by one, so ``Rule(layers="29", components="body")`` grafts layer 29 alone."""
    scheme = as_scheme(rules, base, None)
    roles = [scheme.base, *sorted(scheme.named_roles() - {scheme.base}), *scheme.scaled_roles()]
    with input_errors():
        (compiled,) = compile_for([scheme], model, roles, protocol)
    rows = []
    for k, (rule, done) in enumerate(zip(scheme.rules, compiled.rules, strict=True)):
        names = [compiled.slot_names[i] for i in done.slots.tolist()]
        in_layers = [n.split(".", 2) for n in names if n.startswith("layers.")]
        heads = {compiled.slot_names[s]: h.tolist() for s, h in (done.heads or {}).items()}
        rows.append({
            "rule": k, "model": rule.model, "scale": rule.scale, "positions": rule.positions,
            "layers": sorted({int(p[1]) for p in in_layers}),
            "components": sorted({p[2] for p in in_layers}),
            "global_slots": [n for n in names if not n.startswith("layers.")],
            "n_slots": len(names), "heads": heads or None, "slots": names,
        })
    return pd.DataFrame(rows)
