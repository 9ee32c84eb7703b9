"""The paper's claims as tests on a cell map: shares recomputed by hand, verdicts from the CI,
bootstrap seeded, prompts without values counted."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from weightgraft.localize.claims import CLAIMS, check_claims

N_LAYERS = 8
LABELS = ["tok0", "first_entity-1", "first_entity", "first_entity+1", "relation", "last"]
COMPONENTS = ["q", "k", "v", "o", "gate", "up", "down", "attn_norm"]


def _cells(seed: int, n_prompts: int = 12) -> pd.DataFrame:
    """A random map: every label x layer x component, plus unembed at the last token."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        for pos, label in enumerate(LABELS):
            for layer in range(N_LAYERS):
                for comp in COMPONENTS:
                    rows.append({"example_id": f"p{p}", "template": "t", "direction": "sufficiency",
                                 "position": pos, "position_label": label, "slot": f"layers.{layer}.{comp}",
                                 "layer": layer, "component": comp, "estimate": rng.normal(0.05, 0.02)})
        rows.append({"example_id": f"p{p}", "template": "t", "direction": "sufficiency", "position": len(LABELS) - 1,
                     "position_label": "last", "slot": "unembed", "layer": None, "component": "unembed",
                     "estimate": rng.normal(1.0, 0.1)})
    frame = pd.DataFrame(rows)
    frame["layer"] = frame["layer"].astype("Int64")
    return frame


def _by_hand(cells: pd.DataFrame, keep, within) -> float:
    num = den = 0.0
    for _, row in cells.iterrows():
        if within(row):
            den += row["estimate"]
            if keep(row):
                num += row["estimate"]
    return num / den


def test_shares_equal_a_recomputation_by_hand():
    cells = _cells(0)
    out = check_claims(cells, N_LAYERS, n_boot=200).set_index("claim")
    # the entity's own tokens, not the words after it (first_entity+1)
    fe = lambda r: r["position_label"] in ("first_entity", "first_entity-1")  # noqa: E731
    lt = lambda r: r["position_label"] == "last"  # noqa: E731
    lt_layer = lambda r: lt(r) and r["component"] != "unembed"  # noqa: E731
    assert out.loc["enrichment", "share"] == pytest.approx(_by_hand(cells, fe, lambda r: True))
    assert out.loc["recall", "share"] == pytest.approx(_by_hand(cells, lt, lambda r: True))
    assert out.loc["fe_lt", "share"] == pytest.approx(_by_hand(cells, lambda r: fe(r) or lt(r), lambda r: True))
    late = lambda r: r["component"] == "o" or (r["component"] in ("gate", "up", "down") and r["layer"] >= 6)  # noqa: E731
    assert out.loc["recall_o_late_ffn", "share"] == pytest.approx(_by_hand(cells, late, lt_layer))
    assert out.loc["recall_not_qkv", "share"] == pytest.approx(
        _by_hand(cells, lambda r: r["component"] in ("q", "k", "v"), lt_layer))
    assert set(out.index) == {c.name for c in CLAIMS}
    assert (out["ci_low"] <= out["share"]).all() and (out["share"] <= out["ci_high"]).all()
    assert (out["n_prompts"] == 12).all() and (out["n_prompts_without"] == 0).all()
    # the layer count defaults to the map's; unit rows of a units: run are not counted again
    pd.testing.assert_frame_equal(check_claims(cells, n_boot=200).set_index("claim"), out)
    units = cells[cells.component == "o"].assign(unit=0, estimate=9.0)
    with_units = pd.concat([cells.assign(unit=-1), units], ignore_index=True)
    pd.testing.assert_frame_equal(check_claims(with_units, n_boot=200).set_index("claim"), out)


def test_verdicts_follow_the_ci_and_the_bootstrap_is_seeded():
    cells = _cells(1)
    out = check_claims(cells, N_LAYERS, n_boot=300, seed=3).set_index("claim")
    # the unembed carries ~1 of ~4.4 per prompt at the last token: recall > 0 holds
    assert out.loc["recall", "verdict"] == "holds"
    # uniform layer cells: q/k/v are 3 of 8 components at the last token (~0.375 >= 0.25)
    assert out.loc["recall_not_qkv", "verdict"] == "fails"
    # O + late FFN: 1/8 + 3/8 * 2/8 of the last token's layer cells, well under 0.5
    assert out.loc["recall_o_late_ffn", "verdict"] == "fails"
    again = check_claims(cells, N_LAYERS, n_boot=300, seed=3).set_index("claim")
    pd.testing.assert_frame_equal(out, again)
    other = check_claims(cells, N_LAYERS, n_boot=300, seed=4).set_index("claim")
    assert not np.allclose(out["ci_low"], other["ci_low"])
    # make the last token's O dominate: the claim turns to holds
    boosted = cells.copy()
    boosted.loc[(boosted.position_label == "last") & (boosted.component == "o"), "estimate"] = 5.0
    assert check_claims(boosted, N_LAYERS, n_boot=300).set_index("claim").loc["recall_o_late_ffn", "verdict"] == "holds"


def test_prompts_without_values_are_counted_not_mixed():
    cells = _cells(2).assign(exact=lambda f: f["estimate"])
    cells.loc[cells.example_id.isin(["p0", "p1"]) & (cells.position == 0), "exact"] = np.nan
    out = check_claims(cells, N_LAYERS, column="exact", n_boot=100)
    assert (out["n_prompts"] == 10).all() and (out["n_prompts_without"] == 2).all()
    full = check_claims(cells[~cells.example_id.isin(["p0", "p1"])], N_LAYERS, column="exact", n_boot=100)
    np.testing.assert_allclose(out["share"], full["share"])
    with pytest.raises(ValueError, match="no column 'ig'"):
        check_claims(cells, N_LAYERS, column="ig")


def test_a_region_the_prompts_lack_is_no_cells_not_a_failure():
    """Free-form prompts without an entity span have no first-entity cells: the claims on it
    say so instead of failing with a share of 0."""
    cells = _cells(3)
    cells = cells[~cells.position_label.str.startswith("first_entity-")]
    cells = cells.assign(position_label=cells.position_label.replace({"first_entity": "tok2"}))
    out = check_claims(cells, N_LAYERS, n_boot=100).set_index("claim")
    assert out.loc["enrichment", "verdict"] == "no cells" and np.isnan(out.loc["enrichment", "share"])
    assert out.loc["enrichment", "n_cells"] == 0
    assert out.loc["recall", "verdict"] == "holds"
