"""The authors' patch configs (toddnief/dynamic-weight-grafting, ``patch_configs`` and
``patch_configs_lt``) as scheme families, for ``protocol: authors``.

They are meant to be compiled under that protocol: ``body`` then means the embedding and every
block weight (never the final norm), quarters are ``n//4`` wide, and the unembedding of tied
models follows the embedding. Positions that are not grafted in full ("other" in their files)
get every body slot except the FFN down-projection.
"""

from __future__ import annotations

from collections.abc import Sequence

from weightgraft.schemes.protocol import PROTOCOLS
from weightgraft.schemes.scheme import BASELINE, Rule, Scheme, baselines

FULL = "body"
OTHER = PROTOCOLS["authors"].complement_components

# scheme name -> (positions, components) rules in order, later wins (their fe.yaml, lt.yaml ...)
AUTHORS_POSITIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "FE": (("first_entity", FULL),),
    "LT": (("last", FULL),),
    "FE+LT": (("first_entity+last", FULL),),
    "(FE+LT)^C": (("~(first_entity+last)", OTHER),),
    "FE^C": (("~first_entity", OTHER), ("last", FULL)),
    "LT^C": (("~last", OTHER), ("first_entity", FULL)),
}
# Span variants (the paper's movie sentence and its relation words); a template without the
# span does not run the scheme.
AUTHORS_SPANS: dict[str, tuple[tuple[str, str], ...]] = {
    "M": (("movie_title", FULL),),
    "M+LT": (("movie_title+last", FULL),),
    "FE+M": (("first_entity+movie_title", FULL),),
    "FE+M+LT": (("first_entity+movie_title+last", FULL),),
    "REL": (("relation", FULL),),
    "REL+RP": (("relation+relation_preposition", FULL),),
    "PREP": (("preposition", FULL),),
}
# Their component files, by their names (q, k, v go together: fused on GPT-2 / GPT-NeoX).
AUTHORS_COMPONENTS: dict[str, str] = {
    "attn_ffn": "q+k+v+ffn",  # no o, despite the name
    "attn_o": "q+k+v+o",
    "attn_o_ffn": "q+k+v+o+ffn",
    "o": "o",
    "o_ffn": "o+ffn",
    "o_ffn_up": "o+up",
    "o_ffn_down": "o+down",
    "ffn": "ffn",
}
# Hybrid first-entity variants (task model, all layers).
AUTHORS_HYBRID_FE: dict[str, str | None] = {
    "none": None, "ATTN": "q+k+v+o", "FFN": "ffn", "O+FFN": "o+ffn", "ALL": FULL,
}


def _scheme(name: str, base: str, donor: str, rules: Sequence[tuple[str, str]],
            labels: dict[str, str]) -> Scheme:
    return Scheme(name=name, base=base, labels=labels,
                  rules=[Rule(model=donor, positions=p, components=c) for p, c in rules])


def authors_position_schemes(base: str = "pre", donor: str = "sft", spans: bool = False) -> list[Scheme]:
    """Position grafting as their fe / lt / fe_lt / complement files (Figs. 2, 3, §4.2)."""
    sets = dict(AUTHORS_POSITIONS, **(AUTHORS_SPANS if spans else {}))
    return baselines(base, donor) + [
        _scheme(name, base, donor, rules, {"positions": name})
        for name, rules in sets.items()
    ]


def authors_component_schemes(
    base: str = "pre", donor: str = "sft", positions: str = "last",
    layer_groups: Sequence[str] = ("fourth_quarter",),
) -> list[Scheme]:
    """Their ``patch_configs_lt``: components at the last token, no embedding, no norms
    (Figs. 4, 14, 15)."""
    return baselines(base, donor) + [
        Scheme(
            name=f"{cname}@{group}", base=base,
            labels={"components": cname, "layers": group, "positions": positions},
            rules=[Rule(model=donor, positions=positions, layers=group, components=comps)],
        )
        for cname, comps in AUTHORS_COMPONENTS.items()
        for group in layer_groups
    ]


def authors_hybrid_schemes(base: str = "pre", task: str = "task", relation: str = "relation") -> list[Scheme]:
    """Their hybrid (Fig. 5): at the last token, on layers ``2*(n//4)..n-1``, the task model's
    q, k, v, gate and the hybrid model's o, up, down, which are the relation model's on layers
    ``n//2..n-1`` and the task model's below; task components on the first entity."""
    lt = [
        Rule(model=task, positions="last", layers="third_quarter+fourth_quarter", components="q+k+v+o+ffn"),
        Rule(model=relation, positions="last", layers="last_half", components="o+up+down"),
    ]
    out = [
        Scheme(name=base.upper(), base=base, family=BASELINE),
        Scheme(name=relation.upper(), base=relation, family=BASELINE),
    ]
    for label, comps in AUTHORS_HYBRID_FE.items():
        fe = [] if comps is None else [Rule(model=task, positions="first_entity", components=comps)]
        out.append(Scheme(name=f"FE:{label}", base=base,
                          labels={"fe_components": label}, rules=fe + lt))
    return out


def authors_unembed_schemes(base: str = "pre", donor: str = "sft", positions: str = "first_entity+last") -> list[Scheme]:
    """Their lm-head modes: ``never`` (the model's own head, which on tied models is the
    donor's wherever the embedding is grafted), ``last_token`` (the same, a bug in their code),
    ``always`` (the donor's head on the base's final-normed hidden state)."""
    body = Rule(model=donor, positions=positions, components=FULL)
    return [
        Scheme(name="lm_head:never", base=base, rules=[body]),
        Scheme(name="lm_head:last_token", base=base, rules=[body]),
        Scheme(name="lm_head:always", base=base,
               rules=[body, Rule(model=donor, positions="all", components="unembed")]),
    ]


def authors_layer_dropout_schemes(
    base: str = "pre", donor: str = "sft", positions: str = "first_entity+last",
    rates: Sequence[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), seeds: Sequence[int] = (0,),
) -> list[Scheme]:
    """FE+LT grafting with ``int(rate * n_layers)`` whole layers re-drawn and left ungrafted at
    every grafted token; the embedding is grafted even at rate 1."""
    return [
        Scheme(
            name=f"dropout{rate:g}#{seed}", base=base,
            labels={"rate": f"{rate:g}", "seed": str(seed)},
            rules=[Rule(model=donor, positions=positions, components=FULL, layer_dropout=rate, seed=seed)],
        )
        for rate in rates for seed in seeds
    ]
