"""A full finetune quantized is not the finetune: a role loaded ``quantized(...)`` is set beside
its unquantized model on the run's prompts before a sweep trusts it. The check passes a model
that int8 barely moves, records the dense figures so a second run reads them, and stops (one
line) on a quantized role whose answers are not its dense model's (the null: a quantized model
standing in for another model, as a quantization that erased the finetune would)."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

from weightgraft.data.prompts import TestPrompt
from weightgraft.experiments.examples import Prepared
from weightgraft.experiments.quantized_check import (
    MIN_AGREEMENT,
    QuantizedDisagreement,
    answer_scores,
    check_quantized_roles,
)
from weightgraft.models.donors import LoadSettings, load_role
from weightgraft.models.spec import parse_spec

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                                reason="needs the quant extra: pip install 'weightgraft[quant]'")


@pytest.fixture()
def pair_dir(tiny_model_dirs, tmp_path, monkeypatch):
    """The conftest's tiny Llama pair (saved with a tokenizer), the cache in a fresh folder."""
    monkeypatch.setenv("WEIGHTGRAFT_CACHE", str(tmp_path / "cache"))
    return tiny_model_dirs["pre"].parent


def _examples(model: torch.nn.Module, n: int = 24) -> list[Prepared]:
    """Prompts whose answer is the dense model's own top-1 token (so its top-5 accuracy is 100%)."""
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        ids = torch.randint(3, 64, (int(torch.randint(4, 9, (1,), generator=gen)),), generator=gen).tolist()
        with torch.no_grad():
            top = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        prompt = TestPrompt(id=str(i), relation_id=str(i), template="t", prompt="", answer="", spans={})
        out.append(Prepared(prompt=prompt, input_ids=ids, answer_ids=[top], sources={}))
    return out


def _load(roles: dict[str, str]) -> dict:
    specs = {r: parse_spec(s) for r, s in roles.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = {r: load_role(s, LoadSettings(), roles=specs) for r, s in specs.items()}
    return specs, loaded


def test_a_quantized_finetune_near_its_dense_model_passes_and_is_recorded(pair_dir, capsys):
    specs, loaded = _load({"pre": str(pair_dir / "pre"), "sft": f"quantized({pair_dir / 'sft'}, int8)"})
    dense = load_role(str(pair_dir / "sft"), LoadSettings()).model
    examples = _examples(dense)
    top5, _ = answer_scores(dense, examples)
    assert top5.all()  # the dense model's own answers
    first = check_quantized_roles(specs, loaded, examples, LoadSettings())
    assert list(first) == ["sft"]  # PRE is not quantized: not checked
    assert first["sft"]["agreement"] >= MIN_AGREEMENT and first["sft"]["dense"] == "measured now"
    assert 0 < first["sft"]["mean_abs_dlogprob"] < 0.1  # int8 moved the log-probabilities, a little
    again = check_quantized_roles(specs, loaded, examples, LoadSettings())
    assert again["sft"]["dense"].startswith("recorded ")  # read, not measured again
    assert again["sft"]["agreement"] == pytest.approx(first["sft"]["agreement"])
    assert "quantized vs 100% unquantized" in capsys.readouterr().out
    changed = {"pre": specs["pre"], "sft": parse_spec(f"quantized({pair_dir / 'sft'}, nf4)")}  # other weights, same text root
    _, other = _load({"sft": changed["sft"].text})
    # another quantized model is never served the old record (and nf4 moves this tiny model's answers: refused)
    with pytest.raises(QuantizedDisagreement, match=r"\(unquantized: measured now\)"):
        check_quantized_roles(changed, {**loaded, "sft": other["sft"]}, examples, LoadSettings())


def test_a_quantized_role_that_is_not_its_dense_model_stops_the_run(pair_dir):
    specs, loaded = _load({"pre": str(pair_dir / "pre"), "sft": f"quantized({pair_dir / 'sft'}, int8)"})
    dense = load_role(str(pair_dir / "sft"), LoadSettings()).model
    _, stand_in = _load({"x": f"quantized({pair_dir / 'pre'}, int8)"})  # what a quantization that lost the finetune leaves
    with pytest.raises(QuantizedDisagreement, match=r"agreement \d+%.*below the stated agreement.*peft\(pre, DIR\)"):
        check_quantized_roles(specs, {**loaded, "sft": stand_in["x"]}, _examples(dense), LoadSettings())


def test_a_qlora_base_is_not_checked(pair_dir):
    specs = {"pre": parse_spec(f"quantized({pair_dir / 'pre'}, nf4)"), "sft": parse_spec("peft(pre, adapter)")}
    _, loaded = _load({"pre": f"quantized({pair_dir / 'pre'}, nf4)"})
    assert check_quantized_roles(specs, loaded, _examples(loaded["pre"].model), LoadSettings()) == {}
