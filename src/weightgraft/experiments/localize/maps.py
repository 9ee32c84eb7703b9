"""Cell maps of a list of examples as table rows: estimates (gradient, integrated gradients)
from partial grafts, exact effects from the engine."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from weightgraft.experiments.localize.examples import LocalizeExample
from weightgraft.engine.attribution import Metric, graft_attribution
from weightgraft.engine.cells import OUTPUT_ONLY, Cell, exact_effects, example_cells
from weightgraft.engine.partial import PartialGraft

CELL_KEYS = ["example_id", "template", "direction", "position", "slot"]


def slot_parts(name: str) -> tuple[int | None, str]:
    """``layers.3.o`` -> (3, "o"); ``embed`` -> (None, "embed")."""
    if name.startswith("layers."):
        _, layer, component = name.split(".", 2)
        return int(layer), component
    return None, name


def _batch(examples: Sequence[LocalizeExample]):
    """Right-padded ids, mask, scored positions, targets, distractors of one batch."""
    n = max(e.scored.position + 1 for e in examples)
    ids = torch.zeros(len(examples), n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(examples):
        row = e.scored.input_ids[: e.scored.position + 1]
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    pos = torch.tensor([e.scored.position for e in examples])
    targets = torch.tensor([e.scored.target for e in examples])
    distractors = None
    if all(e.scored.distractor is not None for e in examples):
        distractors = torch.tensor([e.scored.distractor for e in examples])
    return ids, mask, pos, targets, distractors


def _cell_frame(examples: Sequence[LocalizeExample], direction: str, slot_names: Sequence[str],
                values: dict[str, list[torch.Tensor]], model) -> pd.DataFrame:
    """One row per cell of every example (the cells of ``example_cells``, in its order), with
    the given per-example ``[seq, n_slots]`` maps."""
    n_slots = len(slot_names)
    parts = [slot_parts(name) for name in slot_names]
    output_only = np.array([name in OUTPUT_ONLY for name in slot_names])
    columns: dict[str, list] = defaultdict(list)
    for i, e in enumerate(examples):
        n = e.scored.position + 1
        t = np.repeat(np.arange(n), n_slots)
        s = np.tile(np.arange(n_slots), n)
        keep = ~output_only[s] | (t == e.scored.position)
        t, s = t[keep], s[keep]
        columns["example_id"].append(np.full(len(t), e.prompt.id, dtype=object))
        columns["template"].append(np.full(len(t), e.prompt.template, dtype=object))
        columns["position"].append(t)
        columns["position_label"].append(np.asarray(e.labels, dtype=object)[t])
        columns["slot"].append(np.asarray(slot_names, dtype=object)[s])
        columns["layer"].append(np.array([parts[k][0] if parts[k][0] is not None else -1 for k in s]))
        columns["component"].append(np.asarray([p[1] for p in parts], dtype=object)[s])
        for col, maps in values.items():
            columns[col].append(maps[i][:n].double().numpy()[t, s])
    frame = pd.DataFrame({k: np.concatenate(v) for k, v in columns.items()})
    frame.insert(2, "direction", direction)
    frame["layer"] = frame["layer"].astype("Int64").mask(frame["layer"] < 0)
    order = ["example_id", "template", "direction", "position", "position_label", "slot", "layer", "component"]
    return frame[order + list(values)]


def estimate_frame(
    pair: PartialGraft, examples: Sequence[LocalizeExample], direction: str, metric: Metric,
    batch_size: int, ig_steps: int = 0,
) -> pd.DataFrame:
    """Gradient estimates (and integrated gradients with ``ig_steps > 1``) of every cell.
    Batches hold examples of one length where possible (sorted by length: little padding)."""
    names = [s.name for s in pair.slots]
    order = sorted(range(len(examples)), key=lambda i: (examples[i].scored.position, i))
    grads: dict[int, torch.Tensor] = {}
    igs: dict[int, torch.Tensor] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        ids, mask, pos, targets, distractors = _batch([examples[i] for i in chunk])
        g = graft_attribution(pair, ids, pos, targets, metric, distractors, mask)
        ig = (graft_attribution(pair, ids, pos, targets, metric, distractors, mask, steps=ig_steps)
              if ig_steps > 1 else None)
        for j, i in enumerate(chunk):
            grads[i] = g[j].float()
            if ig is not None:
                igs[i] = ig[j].float()
    values = {"estimate": [grads[i] for i in range(len(examples))]}
    if igs:
        values["estimate_ig"] = [igs[i] for i in range(len(examples))]
    return _cell_frame(examples, direction, names, values, pair.base)


def exact_frame(
    models: Sequence[torch.nn.Module], examples: Sequence[LocalizeExample], direction: str,
    metric: Metric, pad_id: int, chunk: int = 512,
) -> tuple[pd.DataFrame, list[float]]:
    """Exact single-cell effects of every cell, and each example's base metric."""
    from weightgraft.engine.architectures import model_slots

    names = [s.name for s in model_slots(models[0])]
    cells = [example_cells(models[0], e.scored) for e in examples]
    base, effects = exact_effects(models, [e.scored for e in examples], [[[c] for c in cs] for cs in cells],
                                  pad_id, metric, chunk)
    maps = []
    for e, cs, eff in zip(examples, cells, effects):
        m = torch.full((e.scored.position + 1, len(names)), float("nan"))
        for c, v in zip(cs, eff.tolist()):
            m[c.position, c.slot] = v
        maps.append(m)
    return _cell_frame(examples, direction, names, {"exact": maps}, models[0]), base.tolist()


def cell_map(example: LocalizeExample, slot_index: dict[str, int], model) -> dict[tuple[str, str], Cell]:
    """(position label, slot name) -> the example's cell."""
    names = {v: k for k, v in slot_index.items()}
    return {(example.labels[c.position], names[c.slot]): c for c in example_cells(model, example.scored)}
