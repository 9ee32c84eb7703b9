"""Scaled grafts (a rule's ``scale``: its cells hold ``base + scale * (donor - base)``) against the
per-token definition with those weights built here, explicitly, on every architecture's tiny
model in float64; scale 1 is today's graft and scale 0 the base, bit for bit."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiny_models import TINY_CONFIGS

import weightgraft as wg
from weightgraft.engine.reference import per_token_forward
from weightgraft.errors import WeightgraftError
from weightgraft.models.derived import lowrank_model
from weightgraft.models.spec import ModelSpecError, ScaledSpec, parse_spec

# two tokens of padding: more would leave a padded query of Gemma 2's 3-token sliding window
# with no key, which HF's eager attention turns into NaN for the whole row
PROMPTS = ["The capital of France is", "Paris is in the north."]
SPANS = [{"subject": "France"}, {"subject": (0, 5)}]
SCALES = (-1.0, 0.5, 2.0, 3.0)
ATOL = 1e-10


def _tol(arch: str) -> float:
    """HF's Gemma and Qwen3.5 RMSNorms compute ``n(x) * (1 + w)`` in float32 even in a float64 model
    (Qwen3.5-MoE's router softmax too, 2.9e-5 measured), OLMo Hybrid's and Falcon-H1's RMSNorms compute in float32 too,
    and Nemotron-H's head returns float32 logits."""
    if arch.startswith(("qwen3_5_moe", "qwen3_next")):
        return 5e-5
    return 2e-5 if arch.startswith(("gemma", "qwen3_5", "nemotron_h", "olmo_hybrid", "falcon_h1")) else ATOL


def _explicit(base: torch.nn.Module, donor: torch.nn.Module, scale: float) -> torch.nn.Module:
    """``base`` with every parameter set to ``base + scale * (donor - base)``, written out here."""
    out = copy.deepcopy(base)
    donor_params = dict(donor.named_parameters())
    with torch.no_grad():
        for name, p in out.named_parameters():
            p.copy_(p + scale * (donor_params[name] - p))
    return out


def _rules(scale: float) -> list[wg.Rule]:
    return [wg.Rule(model="sft", positions="subject", layers="first_half", components="q+k+v+o"),
            wg.Rule(model="sft", positions="last", components="body+unembed", scale=scale)]


def _reference(pre, donor, scaled, tok, scale_cells_last: bool = True) -> torch.Tensor:
    """The per-token definition of :func:`_rules` over ``[pre, donor, scaled]``, by hand: the
    subject's q/k/v/o of layers 0-1 from the donor, every slot of the last token from ``scaled``."""
    names = wg.slots(pre)
    attn = [i for i, n in enumerate(names) if n.startswith(("layers.0.", "layers.1."))
            and n.rsplit(".", 1)[-1] in {"q", "k", "v", "o"}]
    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    source = torch.zeros(len(PROMPTS), enc["input_ids"].shape[1], len(names), dtype=torch.long)
    for b, p in enumerate(PROMPTS):
        start = p.index("France") if b == 0 else 0
        width = 6 if b == 0 else 5
        for t in range(start, start + width):  # character-level tokenizer: token t is character t
            source[b, t, attn] = 1
        source[b, len(p) - 1, :] = 2
    logits = per_token_forward([pre, donor, scaled], enc["input_ids"], source, attention_mask=enc["attention_mask"])
    return logits[torch.arange(len(PROMPTS)), torch.tensor([len(p) - 1 for p in PROMPTS])]


# every architecture at one scale, the scales taken in turn (each on a quarter of them): the scale's arithmetic
# does not depend on the architecture, and every architecture's slots are scaled
@pytest.mark.parametrize(("scale", "arch"), [(SCALES[i % len(SCALES)], a) for i, a in enumerate(TINY_CONFIGS)])
def test_scaled_rule_equals_explicit_weights_per_token(tiny_pair, tiny_tok, arch, scale):
    pre, sft = tiny_pair(arch)
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, _rules(scale), spans=SPANS)
    reference = _reference(pre, sft, _explicit(pre, sft, scale), tiny_tok)
    torch.testing.assert_close(out.logits.to(reference.dtype), reference, rtol=0, atol=_tol(arch))
    plain = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, _rules(1.0), spans=SPANS)
    assert (out.logits - plain.logits).abs().amax() > 1e-3  # the scale did change the answer's logits


@pytest.mark.parametrize("arch", ["llama", "gemma", "gpt2", "phi3"])
def test_scale_one_is_the_graft_and_scale_zero_the_base_bit_for_bit(tiny_pair, tiny_tok, arch):
    pre, sft = tiny_pair(arch)
    models = {"pre": pre, "sft": sft}
    unscaled = [wg.Rule(model="sft", positions="subject", layers="first_half", components="q+k+v+o"),
                wg.Rule(model="sft", positions="last", components="body+unembed")]
    one = wg.graft(models, tiny_tok, PROMPTS, _rules(1.0), spans=SPANS)
    today = wg.graft(models, tiny_tok, PROMPTS, unscaled, spans=SPANS)
    torch.testing.assert_close(one.logits, today.logits, rtol=0, atol=0)
    zero = wg.graft(models, tiny_tok, PROMPTS, _rules(0.0), spans=SPANS)
    base = wg.graft(models, tiny_tok, PROMPTS, unscaled[:1], spans=SPANS)
    torch.testing.assert_close(zero.logits, base.logits, rtol=0, atol=0)
    assert _rules(1.0)[1].model_dump() == unscaled[1].model_dump()  # scale 1 leaves a scheme's identity as it was


@pytest.mark.parametrize("scale", SCALES)
def test_low_rank_donor_scaled(tiny_pair, tiny_tok, scale):
    pre, sft = tiny_pair("llama")
    low = lowrank_model(pre, sft, k=2)
    out = wg.graft({"pre": pre, "sft": low}, tiny_tok, PROMPTS, _rules(scale), spans=SPANS)
    torch.testing.assert_close(out.logits, _reference(pre, low, _explicit(pre, low, scale), tiny_tok), rtol=0, atol=ATOL)


@pytest.mark.parametrize("scale", SCALES)
def test_lora_donor_scaled(tiny_pair, tiny_tok, tmp_path, scale):
    from peft import LoraConfig, get_peft_model

    from weightgraft.models.peft_donor import load_peft, merged_copy

    pre, _ = tiny_pair("llama")
    trained = get_peft_model(copy.deepcopy(pre), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"],
                                                            init_lora_weights=False))
    trained.save_pretrained(tmp_path)
    donor = load_peft(pre, tmp_path)
    merged = merged_copy(donor)  # W + scale * B A, the donor's weights written out
    assert max((a - b).abs().max().item() for a, b in zip(merged.parameters(), pre.parameters(), strict=True)) > 1e-3
    out = wg.graft({"pre": pre, "sft": donor}, tiny_tok, PROMPTS, _rules(scale), spans=SPANS)
    torch.testing.assert_close(out.logits, _reference(pre, merged, _explicit(pre, merged, scale), tiny_tok),
                               rtol=0, atol=ATOL)


def test_scale_in_a_scheme_over_another_base(tiny_pair, tiny_tok):
    """A necessity scheme (base sft, donor pre) scales pre's difference from sft."""
    pre, sft = tiny_pair("qwen2")
    rule = wg.Rule(model="pre", positions="last", components="body+unembed", scale=2.0)
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, wg.Scheme(name="x", base="sft", rules=[rule]))
    enc = tiny_tok(PROMPTS, padding=True, return_tensors="pt")
    source = torch.zeros(len(PROMPTS), enc["input_ids"].shape[1], len(wg.slots(pre)), dtype=torch.long)
    for b, p in enumerate(PROMPTS):
        source[b, len(p) - 1, :] = 1
    ref = per_token_forward([sft, _explicit(sft, pre, 2.0)], enc["input_ids"], source, attention_mask=enc["attention_mask"])
    torch.testing.assert_close(out.logits, ref[torch.arange(2), torch.tensor([len(p) - 1 for p in PROMPTS])],
                               rtol=0, atol=ATOL)


def test_scaled_spec_reads_and_refuses():
    assert parse_spec("scaled(sft, 2)") == ScaledSpec("sft", 2.0)
    assert parse_spec("scaled(sft, -0.5, base=one)") == ScaledSpec("sft", -0.5, "one")
    assert ScaledSpec("sft", 1 / 3).text == "scaled(sft, 0.3333333333333333)"  # reads back as the same float
    assert float(ScaledSpec("sft", 1 / 3).text.split(",")[1].strip(" )")) == 1 / 3
    for bad in ("scaled(sft)", "scaled(sft, x)", "scaled(sft, nan)", "scaled(sft, 2, k=1)", "scaled(sft, 2, base=sft)"):
        with pytest.raises(ModelSpecError, match="scaled"):
            parse_spec(bad)
    with pytest.raises(WeightgraftError, match="finite"):
        wg.Rule(model="sft", scale=float("inf"))


def test_quantized_donor_is_refused_in_one_line(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    packed = copy.deepcopy(sft)
    with torch.no_grad():
        packed.model.layers[0].mlp.down_proj.weight = torch.nn.Parameter(
            torch.zeros_like(packed.model.layers[0].mlp.down_proj.weight, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(WeightgraftError, match="scaled graft needs float weights"):
        wg.graft({"pre": pre, "sft": packed}, tiny_tok, PROMPTS, _rules(2.0), spans=SPANS)


def test_explain_shows_the_scale(tiny_pair):
    pre, _ = tiny_pair("llama")
    table = wg.explain(_rules(2.0), pre)
    assert table["scale"].tolist() == [1.0, 2.0]


@pytest.mark.slow
@pytest.mark.parametrize("lean", [False, True])
def test_a_run_with_scaled_rules_equals_the_per_token_definition(tmp_path, lean):
    """``weightgraft run``'s path: a config's rules with ``scale``; every row's answer probability
    equals the per-token definition with the scaled weights written out; the manifest names the
    scaled role and its hash."""
    import json

    from tiny_world import loader64, tiny_config

    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    scales = (-1.0, 0.5, 2.0)
    schemes = [{"name": f"last x{s:g}", "rules": [{"model": "sft", "positions": "last", "components": "body+unembed",
                                                   "scale": s}]} for s in scales]
    schemes.append({"name": "FE x2 + last", "rules": [
        {"model": "sft", "positions": "first_actor", "components": "q+k+v+o", "scale": 2.0},
        {"model": "sft", "positions": "last", "components": "ffn"}]})
    config = parse_config(tiny_config(tmp_path, "scaled", schemes=schemes, lean_donors=lean, dtype="float32"))
    result = run_experiment(config, load=loader64, progress=False)
    pre, sft = loader64("tiny-llama:pre").model, loader64("tiny-llama:sft").model
    names = wg.slots(pre)
    ffn = [i for i, n in enumerate(names) if n.rsplit(".", 1)[-1] in {"gate", "up", "down"}]
    attn = [i for i, n in enumerate(names) if n.startswith("layers.") and n.rsplit(".", 1)[-1] in {"q", "k", "v", "o"}]
    rows = result.results
    assert len(rows) == 4 * 12 and set(rows.scheme) == {s["name"] for s in schemes}
    tok = loader64("tiny-llama:pre").tokenizer
    spans = {r["id"]: r["spans"] for r in map(json.loads, (tmp_path / "data" / "test_prompts.jsonl").read_text().splitlines())}
    for _, row in rows.iterrows():
        enc = tok(row.prompt)
        ids = torch.tensor([enc["input_ids"]])
        source = torch.zeros(1, ids.shape[1], len(names), dtype=torch.long)
        if row.scheme.startswith("last"):
            scale = float(row.scheme.removeprefix("last x"))
            source[0, -1, :] = 2
        else:
            scale = 2.0
            start, end = spans[row.example_id]["first_actor"]
            fe = [t for t, (a, b) in enumerate(tok(row.prompt, return_offsets_mapping=True)["offset_mapping"])
                  if a < end and b > start and b > a]
            source[0, fe[0]:fe[-1] + 1, attn] = 2
            source[0, -1, ffn] = 1
        logits = per_token_forward([pre, sft, _explicit(pre, sft, scale)], ids, source)[0, -1]
        want = torch.softmax(logits, -1)[int(row.target_token_id)].item()
        assert abs(row.prob - want) < 1e-6, row.scheme  # the answer's first token (rows store float32)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    held = next(iter(manifest["models"].values()))
    assert {"scaled(sft, -1)", "scaled(sft, 0.5)", "scaled(sft, 2)"} <= set(held)
    assert len({held[r]["weights_sha256"] for r in held}) == len(held)


@pytest.mark.slow
def test_the_scale_preset_runs_and_draws_its_lines(tmp_path):
    """``{preset: scale}``: scale 0 is PRE's row and scale 1 the position preset's, example by
    example; the report draws the lines against the scale."""
    from tiny_world import loader64, tiny_config

    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment
    from weightgraft.report import write_report

    schemes = [{"preset": "scale", "scales": [0, 1, 2], "positions": ["FE+LT", "LT"]},
               {"preset": "position", "only": ["FE+LT", "LT"]}]
    result = run_experiment(parse_config(tiny_config(tmp_path, "scale", schemes=schemes)), load=loader64, progress=False)
    rows = result.results.set_index(["scheme", "example_id"])
    names = set(result.results.scheme)
    assert {"FE+LT x0", "FE+LT x1", "FE+LT x2", "LT x0", "LT x1", "LT x2"} <= names
    for scaled, plain in (("FE+LT x0", "PRE"), ("LT x0", "PRE"), ("FE+LT x1", "FE+LT"), ("LT x1", "LT")):
        a, b = rows.loc[scaled], rows.loc[plain]
        np.testing.assert_allclose(a["prob"].to_numpy(), b.loc[a.index, "prob"].to_numpy(), rtol=0, atol=1e-12)
    assert (rows.loc["LT x2", "prob"] - rows.loc["LT x1", "prob"]).abs().max() > 1e-3
    paths = write_report(result.run_dir)
    lines = [f for f in paths.figures if "scale_lines" in f.png.name]
    assert len(lines) == 2 and all(f.png.stat().st_size > 10_000 for f in lines)  # one per template


def test_non_finite_logits_are_flagged_not_returned_silently(tiny_pair, tiny_tok):
    """Gemma 2 (sliding window 3) with a padded tail longer than the window: HF's eager attention
    gives the padded row NaN; ``wg.graft`` says so (and stays quiet when every row is finite)."""
    pre, sft = tiny_pair("gemma2")
    with pytest.warns(RuntimeWarning, match="1 of 2 prompts have non-finite logits"):
        out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, ["The capital of France is", "Paris is in"], [])
    assert bool(out.logits[1].isnan().any()) and bool(torch.isfinite(out.logits[0]).all())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, [])
