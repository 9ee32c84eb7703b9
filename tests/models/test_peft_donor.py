"""LoRA donors (``wg.load_peft``): the engine serving an unmerged peft adapter equals the
per-token definition on a separately merged copy (``merge_and_unload``), on every
architecture; the base is never modified and the donor holds only the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft.utils import load_peft_weights
from tiny_models import TINY_CONFIGS, make_lora_adapter, make_tiny
from tiny_world import loader

import weightgraft as wg
from weightgraft.engine.architectures import Fused, adapter_for, model_slots
from weightgraft.engine.attribution import graft_attribution
from weightgraft.engine.cells import ScoredExample, exact_effects, example_cells
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.models import weights_sha256
from weightgraft.models.errors import PeftError
from weightgraft.models.lean import memory_report
from weightgraft.models.peft_donor import adapter_info, merged_copy

ARCHS = sorted(TINY_CONFIGS)
TOL = 1e-10
FUSED = ["gpt2", "gpt_neox", "phi3"]  # q, k and v are column groups of one projection


def _targets(arch: str, components=("q", "k", "v", "o", "gate", "up", "down")) -> list[str]:
    """The module names peft should wrap for ``components``, from the architecture table."""
    names = set()
    for comp in components:
        spec = adapter_for(TINY_CONFIGS[arch]).components.get(comp)
        if spec is not None:
            names.add((spec.module if isinstance(spec, Fused) else spec).rsplit(".", 1)[-1])
    return sorted(names)


def _lm_targets(arch: str, targets: list[str]) -> list[str] | str:
    """On a vision-language checkpoint, the language model's modules only (a vision tower has
    projections of the same names): peft's regex form."""
    adapter = adapter_for(TINY_CONFIGS[arch])
    if not adapter.outside:
        return targets
    lm = adapter.layers.rsplit(".", 1)[0].replace(".", r"\.")
    return rf"({lm}\..*\.({'|'.join(t for t in targets if t != 'lm_head')})|lm_head)" if "lm_head" in targets else \
        rf"{lm}\..*\.({'|'.join(targets)})"


def _head_slots(heads: dict[str, int]) -> tuple[str, str, str]:
    """q of the first attention layer, v and o of the last (a hybrid's mixer layers have no heads)."""
    of = {c: [n for n in heads if n.endswith(f".{c}")] for c in "qvo"}
    return of["q"][0], of["v"][-1], of["o"][-1]


def _batch(seq: int = 7, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (3, seq), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    mask[2, -1] = 0  # right padding
    return ids, mask


def _maps(base: torch.nn.Module, ids: torch.Tensor, seed: int = 0) -> list[torch.Tensor]:
    """Random per-cell maps, and maps grafting whole positions (every slot of a row/position)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (*ids.shape, len(wg.slots(base)))
    cells = torch.randint(0, 2, shape, generator=gen)
    rows = torch.randint(0, 2, ids.shape, generator=gen)[..., None].expand(shape).clone()
    return [cells, rows, torch.ones(shape, dtype=torch.long)]


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    real = mask.bool()
    return (a[real] - b[real]).abs().max().item()


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_lora_donor_equals_the_definition_on_the_merged_model(arch, tmp_path):
    base = make_tiny(arch, seed=0).double()
    tied = base.get_input_embeddings().weight is base.get_output_embeddings().weight
    targets = _lm_targets(arch, _targets(arch) + ([] if tied else ["lm_head"]))
    path, merged = make_lora_adapter(base, targets, tmp_path / "lora")
    if json.loads((Path(path) / "adapter_config.json").read_text()).get("target_parameters"):
        # peft adds the expert banks' bare parameters itself (Qwen3-Next): refused in one line, to be merged
        with pytest.raises(PeftError, match="target_parameters is set"):
            wg.load_peft(base, path)
        return
    donor = wg.load_peft(base, path)
    ids, mask = _batch()
    heads = {s.name: s.heads for s in model_slots(base) if s.heads}
    gen = torch.Generator().manual_seed(5)
    head_source = {name: torch.randint(0, 2, (*ids.shape, heads[name]), generator=gen)
                   for name in _head_slots(heads)}
    with float64_exact([base, donor, merged]):
        plain = wg.graft_forward([base], ids, torch.zeros(*ids.shape, len(wg.slots(base)), dtype=torch.long),
                                 attention_mask=mask)
        for source in _maps(base, ids):
            fast = wg.graft_forward([base, donor], ids, source, attention_mask=mask)
            ref = per_token_forward([base, merged], ids, source, attention_mask=mask)
            assert _max_diff(fast, ref, mask) <= TOL
            assert _max_diff(fast, plain, mask) > 1e-2  # the graft moved the logits
        fast = wg.graft_forward([base, donor], ids, _maps(base, ids, 1)[0], attention_mask=mask, head_source=head_source)
        ref = per_token_forward([base, merged], ids, SourceMap(_maps(base, ids, 1)[0], head_source), attention_mask=mask)
        assert _max_diff(fast, ref, mask) <= TOL
        # the LoRA donor as the base, the plain model as the donor
        source = _maps(base, ids, 2)[0]
        fast = wg.graft_forward([donor, base], ids, source, attention_mask=mask)
        ref = per_token_forward([merged, base], ids, source, attention_mask=mask)
        assert _max_diff(fast, ref, mask) <= TOL


@pytest.mark.parametrize("arch", FUSED)
@torch.no_grad()
def test_grafting_only_q_of_a_fused_lora_projection_is_exact(arch, tmp_path):
    base = make_tiny(arch, seed=0).double()
    path, merged = make_lora_adapter(base, _targets(arch, ("q", "k", "v")), tmp_path / "lora")
    donor = wg.load_peft(base, path)
    assert adapter_info(donor).slots_touched == [f"layers.{i}.{c}" for i in range(2) for c in "qkv"]
    ids, mask = _batch()
    names = wg.slots(base)
    gen = torch.Generator().manual_seed(3)
    only = {c: torch.zeros(*ids.shape, len(names), dtype=torch.long) for c in ("q", "qkv")}
    rows = torch.randint(0, 2, ids.shape, generator=gen).bool()
    for c, source in only.items():
        for s, name in enumerate(names):
            if name.rsplit(".", 1)[-1] in c:
                source[..., s][rows] = 1
    with float64_exact([base, donor, merged]):
        fast = {c: wg.graft_forward([base, donor], ids, m, attention_mask=mask) for c, m in only.items()}
        for c, m in only.items():
            assert _max_diff(fast[c], per_token_forward([base, merged], ids, m, attention_mask=mask), mask) <= TOL
        plain = wg.graft_forward([base], ids, torch.zeros_like(only["q"]), attention_mask=mask)
    assert _max_diff(fast["q"], plain, mask) > 1e-2
    assert _max_diff(fast["q"], fast["qkv"], mask) > 1e-2  # q alone is not q, k and v


@torch.no_grad()
def test_an_adapter_on_q_and_v_only_leaves_every_other_slot_to_the_base(tmp_path):
    base = make_tiny("llama", seed=0).double()
    path, merged = make_lora_adapter(base, ["q_proj", "v_proj"], tmp_path / "lora")
    donor = wg.load_peft(base, path)
    info = adapter_info(donor)
    assert info.slots_touched == [f"layers.{i}.{c}" for i in range(2) for c in "qv"]
    assert info.target_modules == ["q_proj", "v_proj"] and info.rank == 4
    names = wg.slots(base)
    ids, mask = _batch()
    untouched = torch.tensor([n not in info.slots_touched for n in names])
    source = torch.zeros(*ids.shape, len(names), dtype=torch.long)
    source[..., untouched] = 1  # every slot the adapter does not touch, from the donor
    with float64_exact([base, donor, merged]):
        plain = wg.graft_forward([base], ids, torch.zeros_like(source), attention_mask=mask)
        assert _max_diff(wg.graft_forward([base, donor], ids, source, attention_mask=mask), plain, mask) <= 1e-12
        touched = 1 - source
        fast = wg.graft_forward([base, donor], ids, touched, attention_mask=mask)
        assert _max_diff(fast, per_token_forward([base, merged], ids, touched, attention_mask=mask), mask) <= TOL
        assert _max_diff(fast, plain, mask) > 1e-2


@torch.no_grad()
def test_loading_leaves_the_base_untouched_and_shares_its_tensors(tmp_path):
    base = make_tiny("llama", seed=0).double()
    base.model.layers[0].mlp.up_proj.weight.requires_grad_(False)  # flags are kept as they were
    path, _ = make_lora_adapter(base, _targets("llama") + ["lm_head"], tmp_path / "lora")  # peft saves lm_head too
    ids, mask = _batch()
    zeros = torch.zeros(*ids.shape, len(wg.slots(base)), dtype=torch.long)
    before_logits = wg.graft_forward([base], ids, zeros, attention_mask=mask)
    before = {n: (p, p.detach().clone(), p.requires_grad) for n, p in base.named_parameters()}
    modules = [(n, type(m)) for n, m in base.named_modules()]
    donor = wg.load_peft(base, path)
    assert [(n, type(m)) for n, m in base.named_modules()] == modules  # nothing wrapped in the base
    for n, p in base.named_parameters():
        obj, value, flag = before[n]
        assert p is obj and torch.equal(p, value) and p.requires_grad == flag, n
    assert torch.equal(wg.graft_forward([base], ids, zeros, attention_mask=mask), before_logits)
    # every tensor of the donor but the adapter's is the base's tensor (same storage)
    base_params = dict(base.named_parameters())
    adapter_bytes = 0
    for name, p in donor.named_parameters():
        if "lora_" in name:
            assert all(p.data_ptr() != q.data_ptr() for q in base_params.values())
            adapter_bytes += p.numel() * p.element_size()
        else:
            assert p.data_ptr() == base_params[name.replace(".base_layer", "")].data_ptr(), name
    stored = {k: t for k, t in load_peft_weights(str(path)).items() if "lora_" in k}
    assert adapter_bytes == sum(t.numel() * t.element_size() for t in stored.values())
    assert adapter_info(donor).sha256 == weights_sha256(stored)
    held = memory_report(donor, base)
    full = sum(p.numel() * p.element_size() for p in base.parameters())
    assert held.bytes_held == adapter_bytes == adapter_info(donor).bytes_held
    assert held.tensors_held == len(stored)
    print(f"LoRA donor holds {held.bytes_held} bytes of its own; the base model is {full} bytes")
    assert held.bytes_held < full / 4


@torch.no_grad()
def test_hash_covers_base_and_adapter_and_merged_copy_is_peft_merge(tmp_path):
    base = make_tiny("gpt2", seed=0).double()
    path, merged = make_lora_adapter(base, _targets("gpt2"), tmp_path / "a")
    other, _ = make_lora_adapter(base, _targets("gpt2"), tmp_path / "b", seed=2)
    donor = wg.load_peft(base, path)
    assert weights_sha256(donor) == weights_sha256(wg.load_peft(base, path))
    assert weights_sha256(donor) != weights_sha256(wg.load_peft(base, other))
    assert weights_sha256(donor) != weights_sha256(base)
    mine = merged_copy(donor)
    theirs = dict(merged.named_parameters())
    for name, p in mine.named_parameters():
        assert (p - theirs[name]).abs().max().item() <= 1e-14, name
    assert not any("lora" in n for n, _ in mine.named_parameters())
    with pytest.raises(ValueError, match="merged copy"):
        ids, _ = _batch()
        per_token_forward([base, donor], ids, torch.ones(*ids.shape, len(wg.slots(base)), dtype=torch.long))


def _pair_with_tokenizer(tmp_path: Path, targets: list[str]):
    tok = loader("tiny-llama:pre").tokenizer
    base = make_tiny("llama", seed=0, vocab_size=len(tok), n_layers=4).double()
    path, merged = make_lora_adapter(base, targets, tmp_path / "lora")
    return tok, base, wg.load_peft(base, path), merged


@torch.no_grad()
def test_graft_and_compare_with_a_lora_donor_equal_the_merged_model(tmp_path):
    tok, base, donor, merged = _pair_with_tokenizer(tmp_path, _targets("llama"))
    prompts = ["Keanu Reeves starred in a movie with", "Q: Who starred in a movie alongside Meryl Streep? A: An actor named"]
    answers = ["Nicole Kidman", "Will Smith"]
    rules = [wg.Rule(model="sft", positions="last", layers="last_half", components="o+ffn"),
             wg.Rule(model="sft", positions="first_entity", components="attn")]
    spans = [{"actor": "Keanu Reeves"}, {"actor": "Meryl Streep"}]
    with float64_exact([base, donor, merged]):
        out = {k: wg.graft({"pre": base, "sft": m}, tok, prompts, rules, spans=spans, full_logits=True)
               for k, m in (("lora", donor), ("merged", merged))}
        plain = wg.graft({"pre": base, "sft": base}, tok, prompts, rules, spans=spans)
        assert (out["lora"].logits - out["merged"].logits).abs().max().item() <= TOL
        real = out["lora"].attention_mask.bool()
        assert (out["lora"].full_logits[real] - out["merged"].full_logits[real]).abs().max().item() <= TOL
        assert (out["lora"].logits - plain.logits).abs().max().item() > 1e-2
        schemes = wg.presets.position()
        df = {k: wg.compare({"pre": base, "sft": m}, tok, prompts, answers, schemes, spans=spans)
              for k, m in (("lora", donor), ("merged", merged))}
    assert df["lora"]["rank"].tolist() == df["merged"]["rank"].tolist()
    assert [list(t) for t in df["lora"]["top_tokens"]] == [list(t) for t in df["merged"]["top_tokens"]]
    for col in ("prob", "answer_logprob"):
        assert (df["lora"][col] - df["merged"][col]).abs().max() <= TOL
    sft = df["lora"]["scheme"] == "SFT"
    assert (df["lora"][sft]["answer_logprob"].values != df["lora"][df["lora"]["scheme"] == "PRE"]["answer_logprob"].values).all()


@pytest.mark.slow
@torch.no_grad()
def test_attribution_and_exact_cell_maps_on_a_lora_donor_equal_the_merged_models(tmp_path):
    base = make_tiny("gpt2", seed=0).double()  # fused c_attn: q, k and v are column groups
    path, merged = make_lora_adapter(base, _targets("gpt2"), tmp_path / "lora")
    donor = wg.load_peft(base, path)
    ids, mask = _batch()
    mask[:, :] = 1
    mask[1, -1] = 0
    positions, targets = torch.tensor([6, 5, 6]), torch.tensor([5, 9, 11])
    with float64_exact([base, donor, merged]):
        for lora_pair, merged_pair in (
            (PartialGraft(base, donor), PartialGraft(base, merged)),  # sufficiency
            (PartialGraft(donor, base), PartialGraft(merged, base)),  # necessity
            (PartialGraft(base, donor).swapped(), PartialGraft(base, merged).swapped()),
        ):
            for metric in ("first_logprob", "neg_kl_donor"):
                got = graft_attribution(lora_pair, ids, positions, targets=targets, metric=metric, attention_mask=mask)
                want = graft_attribution(merged_pair, ids, positions, targets=targets, metric=metric, attention_mask=mask)
                assert (got - want).abs().max().item() <= TOL
                assert got.abs().max().item() > 1e-3
            alpha = torch.rand(*ids.shape, len(wg.slots(base)), generator=torch.Generator().manual_seed(0),
                               dtype=torch.float64)
            assert (lora_pair(ids, alpha, mask) - merged_pair(ids, alpha, mask))[mask.bool()].abs().max() <= TOL
        examples = [ScoredExample(tuple(ids[0].tolist()), 6, 5), ScoredExample(tuple(ids[1, :6].tolist()), 5, 9)]
        sets = [[[c] for c in example_cells(base, ex)] for ex in examples]
        for order in ((0, 1), (1, 0)):  # sufficiency, necessity
            lora_models, merged_models = [(base, donor)[i] for i in order], [(base, merged)[i] for i in order]
            b1, e1 = exact_effects(lora_models, examples, sets, pad_id=0)
            b2, e2 = exact_effects(merged_models, examples, sets, pad_id=0)
            assert (b1 - b2).abs().max().item() <= TOL
            for x, y in zip(e1, e2):
                assert (x - y).abs().max().item() <= TOL
            assert max(float(e.abs().max()) for e in e1) > 1e-2


def test_partial_deltas_of_a_lora_donor_are_its_adapters_not_dense_matrices(tmp_path):
    base = make_tiny("llama", seed=0).double()
    path, merged = make_lora_adapter(base, ["q_proj", "v_proj"], tmp_path / "lora")

    def dense_bytes(pair: PartialGraft) -> int:
        """Bytes of tensors the projections' delta functions keep (materialized weight deltas)."""
        total = 0
        for plan in pair.plans:
            if "proj" in plan.path or "lm_head" in plan.path:
                for cell in plan.delta.__closure__ or ():
                    if isinstance(cell.cell_contents, torch.Tensor):
                        total += cell.cell_contents.numel() * cell.cell_contents.element_size()
        return total

    assert dense_bytes(PartialGraft(base, wg.load_peft(base, path))) == 0
    assert dense_bytes(PartialGraft(base, merged)) > 0  # a plain donor: one delta per projection


@torch.no_grad()
def test_on_tied_embeddings_an_lm_head_adapter_moves_the_unembedding_only(tmp_path):
    """As in peft's unmerged forward: the embedding lookup keeps W, the unembedding is W + BA."""
    base = make_tiny("gemma", seed=0).double()
    path, _ = make_lora_adapter(base, ["lm_head", "q_proj"], tmp_path / "lora")
    donor = wg.load_peft(base, path)
    touched = adapter_info(donor).slots_touched
    assert "unembed" in touched and "embed" not in touched
    names = wg.slots(base)
    ids, mask = _batch()
    zeros = torch.zeros(*ids.shape, len(names), dtype=torch.long)
    embed, unembed = zeros.clone(), zeros.clone()
    embed[..., names.index("embed")] = 1
    unembed[..., names.index("unembed")] = 1
    with float64_exact([base, donor]):
        plain = wg.graft_forward([base], ids, zeros, attention_mask=mask)
        assert _max_diff(wg.graft_forward([base, donor], ids, embed, attention_mask=mask), plain, mask) <= 1e-12
        moved = wg.graft_forward([base, donor], ids, unembed, attention_mask=mask)
        hidden = base(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        head = donor.lm_head
        extra = head.lora_B["default"](head.lora_A["default"](hidden)) * head.scaling["default"]
        assert _max_diff(moved, plain + extra, mask) <= 1e-9
