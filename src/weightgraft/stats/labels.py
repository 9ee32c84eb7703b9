"""Are the models of one group (training seeds) more alike than they are like the others (null
finetunes)? A permutation test over the models' labels, not over pairs: pairs that share a model
are not exchangeable, models are."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from math import comb


def _stat(sim: Mapping[frozenset, float], group: set[str], others: set[str]) -> float:
    inside = [v for pair, v in sim.items() if pair <= group]
    across = [v for pair, v in sim.items() if len(pair & group) == 1 and len(pair & others) == 1]
    if not inside or not across:
        return float("nan")
    return sum(inside) / len(inside) - sum(across) / len(across)


def model_label_p(similarity: Mapping[tuple[str, str], float], group: Sequence[str],
                  others: Sequence[str]) -> float:
    """p that ``group``'s within-group mean similarity exceeds its mean similarity to ``others``
    by as much as observed, over every relabeling of the models as ``len(group)`` of one kind
    (exact: ``C(m, len(group))`` labelings; least p ``1 / C(m, len(group))``). ``similarity``:
    a value per unordered pair of models (either order)."""
    sim = {frozenset(pair): float(v) for pair, v in similarity.items()}
    models = list(dict.fromkeys([*group, *others]))
    observed = _stat(sim, set(group), set(others))
    if observed != observed:
        return float("nan")
    tol = 1e-12 * max(1.0, abs(observed))
    count = total = 0
    for chosen in itertools.combinations(models, len(group)):
        g = set(chosen)
        value = _stat(sim, g, set(models) - g)
        total += 1
        count += value == value and value >= observed - tol
    return count / total


def models_needed(n_others: int, alpha: float = 0.05) -> int:
    """The fewest group models whose least label-permutation p reaches ``alpha`` beside
    ``n_others`` other models."""
    s = 2
    while 1 / comb(s + n_others, s) > alpha:
        s += 1
    return s
