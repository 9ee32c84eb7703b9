"""The builders of the paper's scheme families (position, component, hybrid, unembedding, layer
dropout, layer windows, heads) and of ours built on them (scaled position grafts): parameters give a list of schemes. A builder leaves its schemes'
``family`` to the registry (``weightgraft.schemes.families``), which names them; only the
baselines it includes say ``baseline``."""

from __future__ import annotations

from collections.abc import Sequence

from weightgraft.models.spec import scale_text
from weightgraft.schemes.scheme import BASELINE, Rule, Scheme, baselines
from weightgraft.schemes.selectors import SelectorError

POSITION_SETS: dict[str, str] = {
    "FE": "first_entity",
    "LT": "last",
    "FE+LT": "first_entity+last",
    "(FE+LT)^C": "~(first_entity+last)",
    "FE^C": "~first_entity",
    "LT^C": "~last",
}
SPAN_SETS: dict[str, str] = {
    "MOVIE": "movie_title",
    "REL": "relation",
    "PREP": "preposition",
    "REL+PREP": "relation+preposition",
}
COMPONENT_SETS: dict[str, str] = {
    "ATTN+O+FFN": "attn+o+ffn",
    "O+FFN": "o+ffn",
    "FFN": "ffn",
    "O": "o",
    "O+FFN-UP": "up+o",
    "O+FFN-DOWN": "down+o",
}
LAYER_GROUPS: tuple[str, ...] = (
    "all", "first_half", "last_half",
    "first_quarter", "second_quarter", "third_quarter", "last_quarter",
)


def position_schemes(base: str = "pre", donor: str = "sft", spans: bool = False) -> list[Scheme]:
    """Position grafting (Fig. 2): every slot but the unembedding at the chosen positions.

    As in the paper, grafted positions use the donor's embeddings and the base's unembedding.
    """
    sets = dict(POSITION_SETS, **(SPAN_SETS if spans else {}))
    return baselines(base, donor) + [
        Scheme(
            name=name, base=base, labels={"positions": name},
            rules=[Rule(model=donor, positions=expr, components="body")],
        )
        for name, expr in sets.items()
    ]


SCALES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)


def scale_schemes(base: str = "pre", donor: str = "sft", positions: Sequence[str] = ("FE+LT", "LT", "FE"),
                  scales: Sequence[float] = SCALES) -> list[Scheme]:
    """Scaled position grafts (ours, not the paper's): each position set of Fig. 2 (every slot
    but the unembedding) served by ``base + scale * (donor - base)`` at each scale, so a
    figure draws the answer's probability and its fact-specific log-probability against the
    scale (0 is the base, 1 the paper's graft)."""
    unknown = [p for p in positions if p not in POSITION_SETS]
    if unknown:
        raise ValueError(f"positions {unknown} are not position sets ({', '.join(POSITION_SETS)})")
    return baselines(base, donor) + [
        Scheme(name=f"{name} x{scale_text(s)}", base=base, labels={"positions": name, "scale": scale_text(s)},
               rules=[Rule(model=donor, positions=POSITION_SETS[name], components="body", scale=s)])
        for name in positions for s in scales
    ]


def component_schemes(
    base: str = "pre", donor: str = "sft", positions: str = "last",
    layer_groups: Sequence[str] = LAYER_GROUPS,
) -> list[Scheme]:
    """Component grafting at the last token by layer group (Figs. 4, 14, 15)."""
    out = baselines(base, donor)
    for cname, comps in COMPONENT_SETS.items():
        for group in layer_groups:
            out.append(
                Scheme(
                    name=f"{cname}@{group}", base=base,
                    labels={"components": cname, "layers": group, "positions": positions},
                    rules=[Rule(model=donor, positions=positions, layers=group, components=comps)],
                )
            )
    return out


HYBRID_FE_COMPONENTS: dict[str, str | None] = {
    "none": None, "ATTN": "attn", "O": "o", "FFN": "ffn", "ATTN+O": "attn+o",
    "ATTN+FFN": "attn+ffn", "O+FFN": "o+ffn", "ALL": "body",
}


def hybrid_schemes(
    base: str = "pre", task: str = "task", relation: str = "relation",
    last_layers: str = "last_half",
) -> list[Scheme]:
    """Three-model hybrid (Fig. 5): at the last token the task model's ATTN and the relation
    model's O+FFN on ``last_layers``; at the first entity, task components on all layers."""
    lt_rules = [
        Rule(model=task, positions="last", layers=last_layers, components="attn"),
        Rule(model=relation, positions="last", layers=last_layers, components="o+ffn"),
    ]
    out = [
        Scheme(name=base.upper(), base=base, family=BASELINE),
        Scheme(name=relation.upper(), base=relation, family=BASELINE),
    ]
    for label, comps in HYBRID_FE_COMPONENTS.items():
        fe = [] if comps is None else [Rule(model=task, positions="first_entity", components=comps)]
        out.append(
            Scheme(
                name=f"FE:{label}", base=base,
                labels={"fe_components": label}, rules=fe + lt_rules,
            )
        )
    return out


def unembed_schemes(base: str = "pre", donor: str = "sft", positions: str = "first_entity+last") -> list[Scheme]:
    """Where the unembedding comes from: base (the paper's default), donor, donor at LT only."""
    body = Rule(model=donor, positions=positions, components="body")
    return [
        Scheme(name="unembed:base", base=base, rules=[body]),
        Scheme(name="unembed:donor", base=base,
               rules=[body, Rule(model=donor, positions="all", components="unembed")]),
        Scheme(name="unembed:donor@LT", base=base,
               rules=[body, Rule(model=donor, positions="last", components="unembed")]),
    ]


def layer_dropout_schemes(
    base: str = "pre", donor: str = "sft", positions: str = "first_entity+last",
    rates: Sequence[float] = (0.25, 0.5), seeds: Sequence[int] = (0, 1, 2),
) -> list[Scheme]:
    """Position grafting with a seeded random subset of layers left ungrafted."""
    return [
        Scheme(
            name=f"dropout{rate:g}#{seed}", base=base,
            labels={"rate": f"{rate:g}", "seed": str(seed)},
            rules=[Rule(model=donor, positions=positions, components="layer",
                        layer_dropout=rate, seed=seed),
                   Rule(model=donor, positions=positions, components="embed+final_norm")],
        )
        for rate in rates for seed in seeds
    ]


def layer_window_schemes(
    base: str = "pre", donor: str = "sft", positions: Sequence[str] = ("first_entity", "last"),
    n_windows: int = 8, components: str = "layer",
) -> list[Scheme]:
    """Windows of layers (the k-th of ``n_windows`` equal groups, so any depth works) at each
    position set: the data of layer x position heatmaps."""
    if n_windows < 1:
        raise SelectorError("n_windows must be at least 1")
    return [
        Scheme(
            name=f"{pos}@{k}/{n_windows}", base=base,
            labels={"positions": pos, "layer_start": str(k - 1), "window": f"1/{n_windows}"},
            rules=[Rule(model=donor, positions=pos, layers=f"{k}/{n_windows}", components=components)],
        )
        for pos in positions for k in range(1, n_windows + 1)
    ]


def head_schemes(
    base: str = "pre", donor: str = "sft", n_heads: int | None = None, positions: str = "last",
    layers: str | Sequence[str] = "last_quarter", components: str = "o",
) -> list[Scheme]:
    """One scheme per attention head: that head of ``components`` (q/k/v/o) on ``layers`` at
    ``positions`` from the donor, everything else from the base. ``n_heads`` is the model's
    number of heads (``k``/``v`` with fewer KV heads refuse head indices they lack). A list of
    layer selectors (``["-4", "-3", "-2", "-1"]``) gives one scheme per (layers, head), which
    the report draws as a layer x head grid."""
    if not n_heads or n_heads < 1:
        raise SelectorError("preset 'heads' needs n_heads (the model's number of attention heads)")
    layer_sets = [layers] if isinstance(layers, str) else [str(x) for x in layers]
    if not layer_sets:
        raise SelectorError("preset 'heads' got an empty list of layers")
    return baselines(base, donor) + [
        Scheme(
            name=f"{components}[{h}]@{where}", base=base,
            labels={"components": components, "head": str(h), "layers": where, "positions": positions},
            rules=[Rule(model=donor, positions=positions, layers=where, components=components, heads=str(h))],
        )
        for where in layer_sets
        for h in range(n_heads)
    ]
