"""The paper's claims as exact region grafts against a null: each claim holds on a map with the
structure planted, none holds on maps without it (the null catches them), the null is
reproducible from its seeds and never overlaps its region, and a claim's exact share equals a
direct ``wg.graft`` of its region."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import weightgraft as wg
from weightgraft.localization.claims.grafts import ClaimMap, judge_claims, null_seed
from weightgraft.localization.claims.regions import CLAIMS, empirical_p, holm, key_frame, last_quarter
from weightgraft.localization.draws import draw_outside

N_LAYERS = 8
LABELS = ["tok0", "tok1", "first_entity-1", "first_entity", "first_entity+1", "relation", "relation+1", "last"]
COMPONENTS = ["q", "k", "v", "o", "gate", "up", "down", "attn_norm"]
N_PROMPTS = 12
BY_NAME = {c.name: c for c in CLAIMS}


def _keys() -> list[tuple[str, str]]:
    keys = [(label, f"layers.{layer}.{comp}") for label in LABELS for layer in range(N_LAYERS) for comp in COMPONENTS]
    keys += [(label, "embed") for label in LABELS]
    return keys + [("last", "final_norm"), ("last", "unembed")]


def _additive_map(value, seed: int) -> ClaimMap:
    """A map whose set effects add up: ``value(key, rng)`` per prompt and key, the effect of a
    set the sum over its keys (the estimates equal the single-key effects)."""
    rng = np.random.default_rng(seed)
    keys = _keys()
    per = np.array([[value(k, rng) for k in keys] for _ in range(N_PROMPTS)])  # [prompts, keys]
    index = {k: i for i, k in enumerate(keys)}

    def effects(sets):
        return np.stack([per[:, [index[k] for k in s]].sum(1) for s in sets], axis=1)

    estimates = [{k: float(per[p, i]) for k, i in index.items()} for p in range(N_PROMPTS)]
    return ClaimMap([set(keys)] * N_PROMPTS, estimates, effects, {k[1]: 10 for k in keys}, N_LAYERS)


def _planted(key, rng) -> float:
    """The paper's picture: the first entity's cells and the last quarter's O + FFN at the last
    token carry the effect; q/k/v and everything else carry almost none."""
    label, slot = key
    noise = rng.normal(0, 0.003)
    if label.startswith("first_entity") and "+" not in label:
        return 0.3 + noise
    if label == "last" and slot.startswith("layers."):
        layer, comp = int(slot.split(".")[1]), slot.split(".")[2]
        if layer in last_quarter(N_LAYERS) and comp in ("o", "gate", "up", "down"):
            return 3.0 + 10 * noise
    if slot == "unembed":
        return 1.0 + noise
    return 0.01 + noise


def _verdicts(rows) -> dict[str, str]:
    return {r["claim"]: r["verdict"] for r in rows}


def test_every_claim_holds_on_a_planted_map():
    rows, nulls = judge_claims(_additive_map(_planted, 0), "m/t/sufficiency", n_null=199, n_boot=500)
    assert _verdicts(rows) == {c.name: "holds" for c in CLAIMS}
    for r in rows:  # the smallest attainable p, and Holm over the map's 6 claims
        assert r["null_p"] == pytest.approx(1 / 200) and r["null_p_holm"] == pytest.approx(6 / 200)
        assert r["n_null"] == 199 and (r["ci_low"] <= r["share_exact"] <= r["ci_high"])
        # additive effects: the region graft equals the summed estimates
        assert r["interaction"] == pytest.approx(1.0, abs=1e-12)
    assert {n["claim"] for n in nulls} == {c.name for c in CLAIMS}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_claim_holds_on_a_map_without_structure(seed):
    """Every cell's effect drawn from one distribution: a region is no better than a random
    region of its size, whatever its share against the threshold."""
    rows, _ = judge_claims(_additive_map(lambda k, rng: rng.normal(0.05, 0.02), seed), "m/t/s", n_null=199, n_boot=300)
    verdicts = _verdicts(rows)
    assert "holds" not in verdicts.values(), verdicts
    shares = {r["claim"]: r["share_exact"] for r in rows}
    assert shares["enrichment"] > 0 and shares["recall"] > 0  # the old "> 0" test would have held


def test_the_unembedding_alone_makes_recall_hold_not_recall_without_it():
    """A map where only the unembedding stands out: the last token 'carries a share' through a
    direct logit boost; without the unembedding the last token is chance."""
    def value(key, rng):
        return rng.normal(1.0, 0.1) if key[1] == "unembed" else rng.normal(0.05, 0.02)

    verdicts = _verdicts(judge_claims(_additive_map(value, 4), "m/t/s", n_null=199, n_boot=300)[0])
    assert verdicts["recall"] == "holds" and verdicts["recall_no_unembed"] != "holds"


def test_null_regions_are_outside_the_region_matched_and_reproducible():
    data = _additive_map(_planted, 0)
    rows, nulls = judge_claims(data, "m/t/s", n_null=19, n_boot=100)
    pool = sorted(set().union(*data.keys))
    frame = key_frame(pool)
    for claim, record in zip(CLAIMS, nulls):
        region = [k for k, m in zip(pool, claim.region(frame, N_LAYERS)) if m]
        within = [k for k, m in zip(pool, claim.within(frame, N_LAYERS)) if m]
        null_pool = [k for k, m in zip(pool, claim.pool(frame, N_LAYERS)) if m]
        group = (lambda k: k[1].rsplit(".", 1)[-1]) if claim.match_mix else None
        for j, seed in enumerate(record["seeds"][:5]):
            assert seed == null_seed(0, "m/t/s", claim.name, j)
            draw = draw_outside(null_pool, region, region, seed, group)
            assert len(draw.keys) == len(region) and not set(draw.keys) & set(region)
            assert set(draw.keys) <= set(null_pool)
            eff = data.effects([draw.keys, within])
            assert record["shares"][j] == pytest.approx(eff[:, 0].sum() / eff[:, 1].sum(), abs=1e-12)
    # fe_lt holds unembed/final_norm at the last token, which no other position has: drawn uniformly, counted
    row = next(r for r in rows if r["claim"] == "fe_lt")
    assert row["n_null_unmatched"] == 2 * 19 and row["null_drawn"] == "component mix"
    cells = next(r for r in rows if r["claim"] == "recall")["region_cells_share"]
    assert cells == pytest.approx((len(COMPONENTS) * N_LAYERS + 3) / len(_keys()))


def test_empirical_p_and_holm():
    null = np.array([0.1, 0.2, 0.3, 0.4])
    assert empirical_p(0.35, null, above=True) == pytest.approx(2 / 5)
    assert empirical_p(0.35, null, above=False) == pytest.approx(4 / 5)
    assert empirical_p(0.4, null, above=True) == pytest.approx(2 / 5)  # ties count against the claim
    np.testing.assert_allclose(holm([0.01, 0.04, np.nan, 0.03]), [0.03, 0.06, np.nan, 0.06])


def test_a_region_the_prompts_lack_is_no_cells():
    data = _additive_map(_planted, 5)
    keys = [{k for k in ks if not k[0].startswith("first_entity")} for ks in data.keys]
    rows, _ = judge_claims(ClaimMap(keys, data.estimates, data.effects, data.params, N_LAYERS), "m", n_null=19,
                           n_boot=100)
    verdicts = _verdicts(rows)
    assert verdicts["enrichment"] == "no cells"
    assert np.isnan(next(r for r in rows if r["claim"] == "enrichment")["share_exact"])


def test_exact_region_share_equals_a_direct_graft(tmp_path):
    """``share_exact`` of a claim from the localize path equals the share computed with
    ``wg.graft`` of the region and of its within-set, per prompt, in float64."""
    from tiny_models import make_donor, make_tiny
    from tiny_world import tokenizer, write_world

    from weightgraft.localization.claims.stage import map_claims
    from weightgraft.localization.config import ClaimSettings, parse_localize_config
    from weightgraft.localization.examples import build_examples, select_prompts

    tok = tokenizer()
    pre = make_tiny("llama", seed=0, vocab_size=len(tok), n_layers=5).double()
    sft = make_donor(pre, 1).double()
    config = parse_localize_config({"data": str(write_world(tmp_path / "data", n=4)), "templates": ["headline"],
                                    "models": {"pre": "x", "sft": "y"}})
    examples, _ = build_examples(select_prompts(config), tok)
    settings = ClaimSettings(null_sets=19, bootstrap=100)
    table, _ = map_claims([pre, sft], examples, _no_estimates(), "sft", "sufficiency", "pre->sft", settings, 0, 0,
                          "logprob", 64, tmp_path, lambda *a: None)
    prompts = [e.prompt.prompt for e in examples]
    targets = torch.tensor([e.scored.target for e in examples])
    late = last_quarter(5)
    assert late == [3, 4]

    def logprob(rules):
        out = wg.graft({"pre": pre, "sft": sft}, tok, prompts, rules)
        return torch.log_softmax(out.logits.double(), -1)[torch.arange(len(prompts)), targets]

    base = logprob([])
    rule = lambda comps: wg.Rule(model="sft", positions="last", layers="3..4", components=comps)  # noqa: E731
    region = (logprob(rule("o+gate+up+down")) - base).sum()
    within = (logprob(rule("q+k+v+o+gate+up+down")) - base).sum()
    row = table.set_index("claim").loc["recall_o_late_ffn"]
    assert row["share_exact"] == pytest.approx(float(region / within), abs=1e-12)
    whole = (logprob(wg.Rule(model="sft", components="all")) - base).sum()
    last = (logprob(wg.Rule(model="sft", positions="last", components="all")) - base).sum()
    assert table.set_index("claim").loc["recall", "share_exact"] == pytest.approx(float(last / whole), abs=1e-12)
    assert (table["n_prompts"] == 4).all()


def _no_estimates():
    import pandas as pd

    return pd.DataFrame({"example_id": pd.Series(dtype=object), "template": pd.Series(dtype=object),
                         "direction": pd.Series(dtype=object), "position_label": pd.Series(dtype=object),
                         "slot": pd.Series(dtype=object), "unit": pd.Series(dtype="int64"),
                         "estimate": pd.Series(dtype=float)})


def test_reversal_setting_tests_claims_4_5_where_the_paper_made_them(tmp_path):
    """``reversal:`` grafts the donor (both directions) into the recipient (a2b) on the named
    template's prompts: claims 4-5 only, in their paper setting; a template the data lacks is a
    one-line error before any model loads."""
    import pandas as pd
    from tiny_world import loader, write_world

    from weightgraft.data.prompts import DatasetError
    from weightgraft.localization import run_localize as localize
    from weightgraft.localization.config import parse_localize_config

    raw = {"data": str(write_world(tmp_path / "data", n=4)), "out": str(tmp_path / "run"), "templates": ["headline"],
           "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}, "exact": "none", "report": False,
           "graft_directions": ["sufficiency"], "search": {"enabled": False},
           "claims": {"null_sets": 19, "bootstrap": 100},
           "reversal": {"donor": "tiny-llama:relation", "recipient": "tiny-llama:task", "template": "qa",
                        "direction": "a2b"}}
    result = localize(parse_localize_config(raw), progress=False, load=loader)
    claims = pd.read_csv(result.run_dir / "claims.csv")
    rev = claims[claims["model"] == "reversal"]
    assert set(rev["claim"]) == {"recall_o_late_ffn", "recall_not_qkv"} and set(rev["setting"]) == {"both->a2b"}
    assert rev["in_paper_setting"].all() and (rev["template"] == "qa").all() and (rev["n_prompts"] == 4).all()
    assert set(rev["roles"]) == {"donor: no training manifest; recipient: no training manifest"}
    outside = claims[(claims["model"] == "sft") & claims["claim"].isin(["recall_o_late_ffn", "recall_not_qkv"])]
    assert not outside["in_paper_setting"].any() and outside["note"].str.contains("outside the paper's setting").all()

    def no_load(*a):
        raise AssertionError("a model was loaded")

    raw["reversal"]["template"] = "paper_headline"
    with pytest.raises(DatasetError, match="no a2b prompt of template 'paper_headline'"):
        localize(parse_localize_config({**raw, "out": str(tmp_path / "other")}), progress=False, load=no_load)


def test_exact_cells_share_is_the_summed_exact_cells_and_nan_when_any_is_missing():
    """``share_exact_cells`` (the calibration column) is the region's share of the summed exact
    single-cell effects: on an additive map it equals the region graft's share; with one exact
    cell missing in one prompt it is NaN, never a share of a partial sum."""
    data = _additive_map(_planted, seed=3)
    exact = [dict(e) for e in data.estimates]
    full = ClaimMap(data.keys, data.estimates, data.effects, data.params, N_LAYERS, exact)
    rows, _ = judge_claims(full, "m", n_null=19, n_boot=200)
    for r in rows:
        assert r["share_exact_cells"] == pytest.approx(r["share_exact"], rel=1e-9, abs=1e-12)
        # what the share is a share of: the mean effect of grafting the claim's whole 'within'
        mask = BY_NAME[r["claim"]].within(key_frame(_keys()), N_LAYERS).to_numpy(bool)
        within = [k for k, m in zip(_keys(), mask) if m]
        assert r["within_effect"] == pytest.approx(float(data.effects([within]).mean()), rel=1e-9)
    # exact maps differ from the estimates: the column follows the exact values
    scaled = [{k: (2.0 if k[0] == "last" else 1.0) * v for k, v in e.items()} for e in exact]
    rows_scaled, _ = judge_claims(ClaimMap(data.keys, data.estimates, data.effects, data.params, N_LAYERS, scaled),
                                  "m", n_null=19, n_boot=200)
    by = {r["claim"]: r for r in rows_scaled}
    assert by["recall"]["share_exact_cells"] > by["recall"]["share_exact"] + 0.05
    missing = [dict(e) for e in exact]
    missing[4].pop(("last", "unembed"))
    rows_missing, _ = judge_claims(ClaimMap(data.keys, data.estimates, data.effects, data.params, N_LAYERS, missing),
                                   "m", n_null=19, n_boot=200)
    assert np.isnan({r["claim"]: r for r in rows_missing}["recall"]["share_exact_cells"])
    rows_none, _ = judge_claims(data, "m", n_null=19, n_boot=200)
    assert all(np.isnan(r["share_exact_cells"]) for r in rows_none)


def test_a_share_of_no_effect_is_no_effect():
    """Where grafting what the share is a share of has no effect (its per-prompt effects cancel:
    the planted map with the sign flipped on every other prompt), every claim says ``no effect``
    whatever the ratio comes to; on the planted map itself (an effect to share) none does."""
    base = _additive_map(_planted, seed=5)
    signs = np.array([1.0 if p % 2 else -1.0 for p in range(N_PROMPTS)])
    flipped = ClaimMap(base.keys, [{k: v * s for k, v in e.items()} for e, s in zip(base.estimates, signs)],
                       lambda sets: base.effects(sets) * signs[:, None], base.params, N_LAYERS)
    rows, _ = judge_claims(flipped, "m", n_null=19, n_boot=500)
    assert [r["verdict"] for r in rows] == ["no effect"] * len(rows)
    assert all(r["within_ci_low"] < 0 < r["within_ci_high"] for r in rows)
    planted, _ = judge_claims(base, "m", n_null=19, n_boot=500)
    assert all(r["verdict"] != "no effect" and r["within_ci_low"] > 0 for r in planted)


def test_one_prompt_is_undecided_not_no_effect():
    """With one prompt there is no CI of the within effect: the claims are undecided (no
    bootstrap), never called ``no effect`` for want of one."""
    base = _additive_map(_planted, seed=6)
    one = ClaimMap(base.keys[:1], base.estimates[:1], lambda sets: base.effects(sets)[:1], base.params, N_LAYERS)
    rows, _ = judge_claims(one, "m", n_null=19, n_boot=200)
    assert all(np.isnan(r["within_ci_low"]) for r in rows)
    assert all(r["verdict"] == "undecided" for r in rows)
