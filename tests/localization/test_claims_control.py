"""The control finetune: a fact claim of an SFT model must beat the same region grafted from the
control donor, prompt by prompt (``claims.control.against_control``), as one part of the row's
one p (``verdicts``). A control with the SFT's own weights leaves no fact claim holding; a
control whose region does nothing leaves the verdict to the other parts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_localize_null import copy_loader
from tiny_world import write_world

from weightgraft.api.localize import localize
from weightgraft.experiments.config import ConfigError
from weightgraft.localization.claims.control import FACT_CLAIMS, against_control
from weightgraft.localization.claims.verdicts import decide
from weightgraft.localization.config import parse_localize_config

N = 30


def _row(claim: str, model: str = "sft", **over) -> dict:
    base = {"model": model, "template": "t", "direction": "sufficiency", "setting": "pre->sft", "claim": claim,
            "n_region_keys": 10, "null_kind": "positions", "n_prompts": N, "within_ci_low": 1.0, "within_ci_high": 2.0,
            "within_note": "", "whole_effect": 5.0, "whole_ci_low": 4.0, "whole_ci_high": 6.0, "expected_sign": 1,
            "within_effect": 1.5, "ci_low": 0.3, "ci_high": 0.5, "interval_note": "", "threshold": 0.0, "side": ">",
            "threshold_p": 1e-6, "null_p": 1e-4, "null_drawn": "positions (20 per prompt)", "precondition": ""}
    return {**base, **over}


def _prompts(model: str, effects: np.ndarray, claim: str = "recall", setting: str = "pre->sft") -> pd.DataFrame:
    return pd.DataFrame({"model": model, "template": "t", "direction": "sufficiency", "setting": setting, "claim": claim,
                         "prompt_id": [f"p{i}" for i in range(len(effects))], "region_effect": effects})


@pytest.mark.parametrize("gap, verdict", [(0.0, "undecided"), (1.0, "holds")])
def test_a_fact_claim_must_beat_the_controls_same_region(gap: float, verdict: str) -> None:
    rng = np.random.default_rng(0)
    control = rng.normal(2.0, 0.5, N)
    sft = control + gap + rng.normal(0, 0.3, N) if gap else rng.permutation(control)  # exchangeable with it at gap 0
    table = pd.DataFrame([_row("recall"), _row("recall", model="control", setting="null finetune")])
    prompts = pd.concat([_prompts("sft", sft), _prompts("control", control, setting="null finetune")])
    out = decide(against_control(table, prompts, control="control", seed=0, n_resamples=999))
    row = out.iloc[0]
    assert row["n_control_prompts"] == N and row["control_region_effect"] == pytest.approx(control.mean())
    assert row["verdict"] == verdict, row["reason"]
    if verdict == "undecided":
        assert row["p_largest"] == "control" and "control" in row["reason"]
    assert np.isnan(out.iloc[1]["control_p"])  # the control's own row: judged against its nulls only


def test_only_fact_claims_of_sft_models_take_the_control_test() -> None:
    table = pd.DataFrame([_row(c) for c in (*FACT_CLAIMS, "recall_o_late_ffn")])
    prompts = pd.concat([_prompts("sft", np.ones(N), claim=c) for c in (*FACT_CLAIMS, "recall_o_late_ffn")]
                        + [_prompts("control", np.zeros(N), claim=c, setting="null finetune") for c in FACT_CLAIMS])
    out = against_control(table, prompts, control="control", seed=0, n_resamples=999)
    assert out["control_p"].notna().tolist() == [True] * len(FACT_CLAIMS) + [False]


def _raw(tmp_path, control: str) -> dict:
    return {"name": "control", "data": str(write_world(tmp_path / "data", n=6)), "out": str(tmp_path / "run"),
            "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft", "control": control}, "templates": ["headline"],
            "batch_size": 3, "exact_chunk": 64, "exact": "none", "graft_directions": ["sufficiency"],
            "search": {"enabled": False}, "report": False,
            "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99, "metric": "fact_logprob"}}


@pytest.mark.slow
def test_a_control_with_the_sfts_own_weights_leaves_no_fact_claim_holding(tmp_path) -> None:
    result = localize(parse_localize_config(_raw(tmp_path, "tiny-llama:sft-copy")), progress=False, load=copy_loader)
    claims = pd.read_csv(result.run_dir / "claims.csv")
    mine = claims[(claims["model"] == "sft") & claims["claim"].isin(FACT_CLAIMS)]
    assert len(mine) == len(FACT_CLAIMS) and (mine["n_control_prompts"] == 6).all()
    assert (mine["control_p"] > 1 - 1e-12).all()  # identical effects on every prompt: nothing beats them
    assert not (mine["verdict"] == "holds").any()
    own = claims[claims["model"] == "control"]
    assert len(own) and (own["setting"] == "null finetune").all()
    assert (result.run_dir / "parts" / "control").is_dir()


def test_a_control_that_is_an_sft_model_is_a_one_line_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="models.control is 'tiny-llama:sft'") as err:
        parse_localize_config(_raw(tmp_path, "tiny-llama:sft"))
    assert len(str(err.value).splitlines()) == 1
