"""The paper's claims as exact region grafts against their null, judged across prompts: each
claim holds on a map with the structure planted (FE+LT too, against its complement), none holds
on maps without it, near-threshold shares are not called holds, null sets lie outside their
region and are reproducible, a claim's exact share equals a direct ``wg.graft`` of its region and
claim 5's marginal equals ATTN+O+FFN minus O+FFN, and an untrained reversal donor is
``precondition not met``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import weightgraft as wg
from weightgraft.localization.claims.grafts import ClaimMap, judge_claims, null_seed
from weightgraft.localization.claims.nulls import position_nulls
from weightgraft.localization.claims.regions import CLAIMS, last_quarter

N_LAYERS = 8
LABELS = ["tok0", "tok1", "first_entity_last-1", "first_entity_last", "first_entity_last+1", "relation_last",
          "relation_last+1", "last"]
COMPONENTS = ["q", "k", "v", "o", "gate", "up", "down", "attn_norm"]
N_PROMPTS = 20
BY_NAME = {c.name: c for c in CLAIMS}
JUDGED = [c.name for c in CLAIMS if c.judged]


def _keys() -> list[tuple[str, str]]:
    keys = [(label, f"layers.{layer}.{comp}") for label in LABELS for layer in range(N_LAYERS) for comp in COMPONENTS]
    keys += [(label, "embed") for label in LABELS]
    return keys + [("last", "final_norm"), ("last", "unembed")]


def _additive_map(value, seed: int, n_prompts: int = N_PROMPTS) -> ClaimMap:
    """A map whose set effects add up: ``value(key, rng)`` per prompt and key times a prompt
    factor, the effect of a prompt's key set the sum over its keys (estimates: the single keys)."""
    rng = np.random.default_rng(seed)
    keys = _keys()
    factor = rng.uniform(0.6, 1.4, n_prompts)
    per = np.array([[f * value(k, rng) for k in keys] for f in factor])  # [prompts, keys]
    index = {k: i for i, k in enumerate(keys)}

    def effects(sets):
        return np.stack([[per[p, [index[k] for k in keys]].sum() for p, keys in enumerate(s)] for s in sets], axis=1)

    estimates = [{k: float(per[p, i]) for k, i in index.items()} for p in range(n_prompts)]
    return ClaimMap([set(keys)] * n_prompts, estimates, effects, {k[1]: 10 for k in keys}, N_LAYERS,
                    prompt_ids=[f"p{i}" for i in range(n_prompts)])


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


def test_every_claim_holds_on_a_planted_map_fe_lt_against_its_complement():
    rows, per_prompt = judge_claims(_additive_map(_planted, 0), "m/t/sufficiency", n_resamples=999)
    verdicts = _verdicts(rows)
    assert {c: verdicts[c] for c in JUDGED} == {c: "holds" for c in JUDGED}, [(r["claim"], r["reason"]) for r in rows]
    assert verdicts["attn_ffn_no_o"] == "shown"
    by = {r["claim"]: r for r in rows}
    assert by["fe_lt"]["null_kind"] == "complement" and by["enrichment"]["null_kind"] == "positions"
    assert by["recall_o_late_ffn"]["null_drawn"].startswith("layer blocks (5 per prompt); other components")
    for r in rows:
        if r["claim"] in JUDGED:
            assert r["n_prompts"] == N_PROMPTS and r["ci_low"] <= r["share_exact"] <= r["ci_high"]
            assert r["p_holm"] <= 0.05 and r["null_p"] <= r["p"] <= r["p_holm"]  # one p per row: its largest part
        # additive effects: the region graft equals the summed estimates (a marginal too)
        assert r["interaction"] == pytest.approx(1.0, abs=1e-9)
    assert set(per_prompt["claim"]) == {c.name for c in CLAIMS} and len(per_prompt) == len(CLAIMS) * N_PROMPTS
    fe_lt = per_prompt[per_prompt["claim"] == "fe_lt"]
    assert by["fe_lt"]["share_exact"] == pytest.approx(fe_lt["region_effect"].sum() / fe_lt["within_effect"].sum())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_claim_holds_on_a_map_without_structure(seed):
    """Every cell's effect drawn from one distribution: a region is no better than its null,
    whatever its share against the threshold."""
    rows, _ = judge_claims(_additive_map(lambda k, rng: rng.normal(0.05, 0.02), seed), "m/t/s", n_resamples=999)
    verdicts = _verdicts(rows)
    assert "holds" not in verdicts.values(), [(r["claim"], r["verdict"], r["reason"]) for r in rows]
    shares = {r["claim"]: r["share_exact"] for r in rows}
    assert shares["enrichment"] > 0 and shares["recall"] > 0  # a "> 0" test alone would have held


def _fe_lt_share(target: float, noise: float):
    """Cells of FE+LT worth ``a`` and the others 1, so that FE+LT's share is ``target``."""
    keys = _keys()
    inside = sum(1 for label, _ in keys if label in ("first_entity_last-1", "first_entity_last", "last"))
    a = target * (len(keys) - inside) / ((1 - target) * inside)

    def value(key, rng):
        return (a if key[0] in ("first_entity_last-1", "first_entity_last", "last") else 1.0) * (1 + rng.normal(0, noise))
    return value


@pytest.mark.parametrize("seed", [0, 1])
def test_near_the_threshold_fe_lt_holds_only_above_it(seed):
    above = _verdicts(judge_claims(_additive_map(_fe_lt_share(0.6, 0.5), seed), "m", n_resamples=999)[0])
    below = judge_claims(_additive_map(_fe_lt_share(0.45, 0.5), seed), "m", n_resamples=999)[0]
    assert above["fe_lt"] == "holds"
    row = next(r for r in below if r["claim"] == "fe_lt")
    assert row["verdict"] in ("fails", "undecided") and row["ci_low"] < 0.5


def test_the_unembedding_alone_makes_recall_hold_not_recall_without_it():
    def value(key, rng):
        return rng.normal(1.0, 0.1) if key[1] == "unembed" else rng.normal(0.05, 0.02)

    verdicts = _verdicts(judge_claims(_additive_map(value, 4), "m/t/s", n_resamples=999)[0])
    assert verdicts["recall"] == "holds" and verdicts["recall_no_unembed"] != "holds"


def test_position_nulls_move_the_region_to_other_whole_positions_reproducibly():
    keys = _keys()
    region = [k for k in keys if k[0] in ("first_entity_last-1", "first_entity_last")]
    first = position_nulls(region, keys, 20, null_seed(0, "m", "enrichment", "p0", "positions"))
    again = position_nulls(region, keys, 20, null_seed(0, "m", "enrichment", "p0", "positions"))
    assert first == again and len(first.sets) == 15 and first.n_unmatched == 0  # C(6, 2): every pair
    for s in first.sets:
        labels = {label for label, _ in s}
        assert len(labels) == 2 and not labels & {"first_entity_last-1", "first_entity_last"}
        assert sorted(slot for _, slot in s) == sorted(slot for _, slot in region)  # the same slots
    assert len({tuple(s) for s in first.sets}) == 15  # no repeats
    # the last token's final norm and unembedding have no place at another position: each is
    # replaced by another cell outside the region (the null keeps the region's size), counted
    last = [k for k in keys if k[0] == "last"]
    moved = position_nulls(last, keys, 5, "s")
    assert moved.n_unmatched == 2 * 5 and all(len(set(s)) == len(last) for s in moved.sets)
    assert all(k in set(keys) and k[0] != "last" for s in moved.sets for k in s)
    assert position_nulls(region, region + [("last", "embed")], 3, "s").missing


def test_a_region_the_prompts_lack_is_no_cells():
    data = _additive_map(_planted, 5)
    keys = [{k for k in ks if not k[0].startswith("first_entity")} for ks in data.keys]
    rows, _ = judge_claims(ClaimMap(keys, data.estimates, data.effects, data.params, N_LAYERS, (), data.prompt_ids),
                           "m", n_resamples=999)
    verdicts = _verdicts(rows)
    assert verdicts["enrichment"] == "no cells"


def test_a_share_of_no_effect_is_no_effect():
    """Where grafting what the share is a share of has no effect (its per-prompt effects cancel),
    every judged claim says ``no effect`` whatever the ratio comes to."""
    base = _additive_map(_planted, seed=5)
    signs = np.array([1.0 if p % 2 else -1.0 for p in range(N_PROMPTS)])
    flipped = ClaimMap(base.keys, base.estimates, lambda sets: base.effects(sets) * signs[:, None], base.params,
                       N_LAYERS, (), base.prompt_ids)
    rows, _ = judge_claims(flipped, "m", n_resamples=999)
    assert {r["verdict"] for r in rows if r["claim"] in JUDGED} == {"no effect"}
    planted, _ = judge_claims(base, "m", n_resamples=999)
    assert all(r["verdict"] != "no effect" and r["within_ci_low"] > 0 for r in planted)


def test_a_tiny_denominator_is_never_holds():
    """Within's effect far below the whole donor-base gap (its cells barely move the metric):
    ``no effect`` with the floor named, whatever the ratio."""
    def value(key, rng):
        label, slot = key
        if label == "last" and slot.startswith("layers.") and int(slot.split(".")[1]) in last_quarter(N_LAYERS):
            return 1e-4 * (3.0 if slot.split(".")[2] in ("o", "gate", "up", "down") else 0.01)
        return 1.0 + rng.normal(0, 0.01)

    by = {r["claim"]: r for r in judge_claims(_additive_map(value, 7), "m", n_resamples=999)[0]}
    assert by["recall_o_late_ffn"]["verdict"] == "no effect" and "whole donor-base gap" in by["recall_o_late_ffn"]["reason"]


def test_two_prompts_are_undecided_not_no_effect():
    base = _additive_map(_planted, seed=6)
    two = ClaimMap(base.keys[:2], base.estimates[:2], base.effects, base.params, N_LAYERS,
                   (), base.prompt_ids[:2])
    rows, _ = judge_claims(two, "m", n_resamples=999)
    assert {r["verdict"] for r in rows if r["claim"] in JUDGED} == {"undecided"}


def test_exact_cells_share_is_the_summed_exact_cells_and_nan_when_any_is_missing():
    data = _additive_map(_planted, seed=3, n_prompts=6)
    exact = [dict(e) for e in data.estimates]
    full = ClaimMap(data.keys, data.estimates, data.effects, data.params, N_LAYERS, exact, data.prompt_ids)
    for r in judge_claims(full, "m", n_resamples=99)[0]:
        if not BY_NAME[r["claim"]].marginal:
            assert r["share_exact_cells"] == pytest.approx(r["share_exact"], rel=1e-9, abs=1e-12)
    missing = [dict(e) for e in exact]
    missing[4].pop(("last", "unembed"))
    rows, _ = judge_claims(ClaimMap(data.keys, data.estimates, data.effects, data.params, N_LAYERS, missing,
                                    data.prompt_ids), "m", n_resamples=99)
    assert np.isnan({r["claim"]: r for r in rows}["recall"]["share_exact_cells"])


def _tiny_pair():
    from tiny_models import make_donor, make_tiny
    from tiny_world import tokenizer

    tok = tokenizer()
    pre = make_tiny("llama", seed=0, vocab_size=len(tok), n_layers=5).double()
    return tok, pre, make_donor(pre, 1).double()


def _no_estimates():
    import pandas as pd

    return pd.DataFrame({"example_id": pd.Series(dtype=object), "template": pd.Series(dtype=object),
                         "direction": pd.Series(dtype=object), "position_label": pd.Series(dtype=object),
                         "slot": pd.Series(dtype=object), "unit": pd.Series(dtype="int64"),
                         "estimate": pd.Series(dtype=float)})


def test_exact_shares_and_claim_5s_marginal_equal_direct_grafts(tmp_path):
    """From the localize path, in float64: ``recall`` equals ``wg.graft`` of the last token over the
    whole graft, ``recall_o_late_ffn`` O+FFN over ATTN+O+FFN of the last quarter, and
    ``qkv_marginal`` (ATTN+O+FFN minus O+FFN) over ATTN+O+FFN, per prompt and summed."""
    from tiny_world import write_world

    from weightgraft.localization.claims.stage import map_claims
    from weightgraft.localization.config import ClaimSettings, parse_localize_config
    from weightgraft.localization.examples import build_examples
    from weightgraft.localization.prompts import select_prompts

    tok, pre, sft = _tiny_pair()
    config = parse_localize_config({"data": str(write_world(tmp_path / "data", n=4)), "templates": ["headline"],
                                    "models": {"pre": "x", "sft": "y"}})
    examples, _ = build_examples(select_prompts(config), tok)
    table, per_prompt = map_claims([pre, sft], examples, _no_estimates(), model_label="sft", direction="sufficiency", setting="pre->sft",
                                   settings=ClaimSettings(null_draws=3, resamples=99, min_prompts=2, metric="first_logprob"), seed=0, pad_id=0, metric="logprob", chunk=64,
                                   parts=tmp_path, say=lambda *a: None)
    prompts = [e.prompt.prompt for e in examples]
    targets = torch.tensor([e.scored.target for e in examples])
    assert last_quarter(5) == [3, 4]

    def logprob(rules):
        out = wg.graft({"pre": pre, "sft": sft}, tok, prompts, rules)
        return torch.log_softmax(out.logits.double(), -1)[torch.arange(len(prompts)), targets]

    base = logprob([])
    rule = lambda comps: wg.Rule(model="sft", positions="last", layers="3..4", components=comps)  # noqa: E731
    o_ffn = logprob(rule("o+gate+up+down")) - base
    attn_o_ffn = logprob(rule("q+k+v+o+gate+up+down")) - base
    rows = table.set_index("claim")
    assert rows.loc["recall_o_late_ffn", "share_exact"] == pytest.approx(float(o_ffn.sum() / attn_o_ffn.sum()), abs=1e-12)
    marginal = per_prompt[per_prompt["claim"] == "qkv_marginal"]["region_effect"].to_numpy()
    np.testing.assert_allclose(marginal, (attn_o_ffn - o_ffn).numpy(), rtol=0, atol=1e-12)
    assert rows.loc["qkv_marginal", "share_exact"] == pytest.approx(
        float((attn_o_ffn - o_ffn).sum() / attn_o_ffn.sum()), abs=1e-12)
    whole = (logprob(wg.Rule(model="sft", components="all")) - base).sum()
    last = (logprob(wg.Rule(model="sft", positions="last", components="all")) - base).sum()
    assert rows.loc["recall", "share_exact"] == pytest.approx(float(last / whole), abs=1e-12)
    assert (table["n_prompts"] == 4).all() and (table["evidence"] == "exploratory").all()
    assert table["least_p"].to_numpy() == pytest.approx(1 / 16)  # exact sign flips of 4 prompts, above 1/100


@pytest.mark.slow
def test_reversal_rows_are_precondition_not_met_where_the_donor_does_not_know_the_facts(tmp_path):
    """``reversal:`` grafts the donor into the recipient on the named template's prompts: claims
    4-5 only, in their paper setting; a random donor ranks few answers in its top 5, so every row
    is ``precondition not met`` with both models' top-5 and the recipient's gap to PRE; a template
    the data lacks is a one-line error before any model loads."""
    import pandas as pd
    from tiny_world import loader, write_world

    from weightgraft.data.prompts import DatasetError
    from weightgraft.localization import run_localize as localize
    from weightgraft.localization.config import parse_localize_config

    raw = {"data": str(write_world(tmp_path / "data", n=4)), "out": str(tmp_path / "run"), "templates": ["headline"],
           "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}, "exact": "none", "report": False,
           "graft_directions": ["sufficiency"], "search": {"enabled": False},
           "claims": {"null_draws": 3, "resamples": 99, "min_prompts": 2},
           "reversal": {"donor": "tiny-llama:relation", "recipient": "tiny-llama:task", "template": "qa",
                        "direction": "a2b", "controls": ["tiny-llama:sft"]}}
    result = localize(parse_localize_config(raw), progress=False, load=loader)
    claims = pd.read_csv(result.run_dir / "claims.csv", keep_default_na=False)
    control = claims[claims["model"] == "reversal control[0]"]
    assert len(control) == 3 and set(control["donor_role"]) == {"control"} and "holds" not in set(control["verdict"])
    assert set(control["donor"]) == {"tiny-llama:sft"}
    rev = claims[claims["model"] == "reversal"]
    assert set(rev["claim"]) == {"recall_o_late_ffn", "qkv_marginal", "attn_ffn_no_o"}
    assert set(rev["setting"]) == {"both->a2b"} and rev["in_paper_setting"].all()
    assert set(rev["verdict"]) == {"precondition not met"} and rev["precondition"].str.contains("top 5").all()
    assert {"donor_top5", "recipient_top5", "recipient_below_pre"} <= set(rev.columns)
    assert (rev["donor_top5"].astype(float) < 0.8).all()
    assert set(rev["roles"]) == {"donor: no training manifest; recipient: no training manifest; control[0]: no training manifest"}
    outside = claims[(claims["model"] == "sft") & claims["claim"].isin(["recall_o_late_ffn", "qkv_marginal"])]
    assert not outside["in_paper_setting"].astype(bool).any()
    assert (result.run_dir / "claims_prompts.parquet").is_file()

    def no_load(*a):
        raise AssertionError("a model was loaded")

    raw["reversal"]["template"] = "paper_headline"
    with pytest.raises(DatasetError, match="no a2b prompt of template 'paper_headline'"):
        localize(parse_localize_config({**raw, "out": str(tmp_path / "other")}), progress=False, load=no_load)


def test_too_few_prompts_are_refused_before_any_model_loads(tmp_path):
    from tiny_world import write_world

    from weightgraft.experiments.config import ConfigError
    from weightgraft.localization import run_localize as localize
    from weightgraft.localization.claims.evidence import claims_evidence
    from weightgraft.localization.config import parse_localize_config
    from weightgraft.localization.prompts import select_prompts

    def no_load(*a):
        raise AssertionError("a model was loaded")

    raw = {"data": str(write_world(tmp_path / "data", n=4)), "out": str(tmp_path / "run"), "templates": ["headline"],
           "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}, "search": {"enabled": False}}
    with pytest.raises(ConfigError, match=r"4 prompts per map .*fewer than claims.min_prompts \(20\).*'limit'"):
        localize(parse_localize_config(raw), progress=False, load=no_load)
    import yaml
    from typer.testing import CliRunner

    from weightgraft.cli import app
    from weightgraft.localization.claims.evidence import claims_notes

    notes = claims_notes(parse_localize_config(raw))
    assert notes[0].startswith("claims: 12 judged tests on at least 4 prompts per map") and "refused by localize" in notes[1]
    path = tmp_path / "loc.yaml"
    path.write_text(yaml.safe_dump({**raw, "models": {"pre": "random:llama-3.2-1b", "sft": "random:llama-3.2-1b@1"}}))
    out = CliRunner().invoke(app, ["plan", str(path), "--no-time"], catch_exceptions=False).output.replace("\n", " ")
    assert "refused by localize: claims: 4 prompts per map" in " ".join(out.split())
    lowered = parse_localize_config({**raw, "claims": {"min_prompts": 4}})
    evidence = claims_evidence(lowered, select_prompts(lowered))
    assert not evidence.problem and evidence.exploratory
    assert evidence.family == 6 * 2 and evidence.floor == pytest.approx(12 / 16) and "no claim could hold" in evidence.warning


def _row(**over):
    base = {"claim": "c", "n_region_keys": 10, "null_kind": "positions", "n_prompts": 40, "within_ci_low": 1.0,
            "within_ci_high": 2.0, "within_note": "", "whole_effect": 5.0, "whole_ci_low": 4.0, "whole_ci_high": 6.0,
            "expected_sign": 1, "within_effect": 1.5, "ci_low": 0.3, "ci_high": 0.5, "interval_note": "",
            "threshold": 0.0, "side": ">", "threshold_p": 1e-6, "null_p": 0.001, "null_drawn": "positions (20 per prompt)",
            "precondition": ""}
    return {**base, **over}


def test_verdicts_from_rows_one_holm_family():
    import pandas as pd

    from weightgraft.localization.claims.verdicts import decide, p_text

    rows = pd.DataFrame([
        _row(),                                                             # holds
        _row(null_p=0.06),                                                  # above 0.05 after Holm: undecided
        _row(whole_ci_low=-6.0, whole_ci_high=-4.0, whole_effect=-5.0),     # the donor lowers the answer
        _row(within_effect=0.1),                                            # 2% of the whole gap: below the floor
        _row(ci_low=float("nan"), ci_high=float("nan"), interval_note="effects too skewed", threshold_p=float("nan")),
        _row(null_p=float("nan"), null_drawn="positions: 5 other positions, fewer than the region's 6"),
        _row(precondition="the donor ranks 0% ..."),
        _row(threshold=0.5, ci_low=0.1, ci_high=0.3, threshold_p=0.99),     # fails
    ])
    out = decide(rows)
    assert list(out["verdict"]) == ["holds", "undecided", "no effect", "no effect", "undecided", "undecided",
                                    "precondition not met", "fails"]
    assert out["family_size"].iloc[0] == 5  # judged rows with every part of p, precondition met
    assert out["p_holm"].iloc[0] == pytest.approx(5 * 0.001)  # the row's p is its largest part, the null's
    assert out["p_largest"].iloc[0] == "null" and out["p_largest"].iloc[1] == "null"
    assert "below 5% of the whole donor-base gap" in out["reason"].iloc[3]
    assert "no null of its kind" in out["reason"].iloc[5] and "fewer than the region's 6" in out["reason"].iloc[5]
    assert p_text(0.0001, 0.0001) == "<= 0.0001" and p_text(0.002, 0.0001) == "0.002"


def test_a_declined_interval_leaves_the_row_undecided_whatever_the_sign_test_says():
    import pandas as pd

    from weightgraft.localization.claims.verdicts import decide

    declined = dict(ci_low=float("nan"), ci_high=float("nan"), threshold=0.5,
                    interval_note="the whole effect's interval at 99.99999% includes 0 (a share of it has no "
                                  "bounded interval)")
    out = decide(pd.DataFrame([
        _row(**declined, n_past_threshold=40, sign_p_past=0.5 ** 40, sign_p_short=1.0),
        _row(**declined, n_past_threshold=3, sign_p_past=1.0, sign_p_short=1e-8),
        _row(**{**declined, "interval_note": "fewer than 3 prompts"}, n_past_threshold=2, sign_p_past=0.25,
             sign_p_short=1.0),
    ]))
    # the sign test speaks of the median prompt: kept in claims.csv, never the verdict
    assert list(out["verdict"]) == ["undecided", "undecided", "undecided"]
    assert out["reason"].iloc[0] == ("no interval: the whole effect's interval at 99.99999% includes 0 (a share of "
                                     "it has no bounded interval)")
    assert out["reason"].iloc[2] == "no interval: fewer than 3 prompts"
