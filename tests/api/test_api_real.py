"""The notebook API on the real embedded SmolLM2-135M (a real tokenizer with its own padding
side and special tokens, tied embeddings, 30 layers): the issue's snippet equals a hand-built
engine call. Marked slow; skipped when the embedded model cannot be had."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_donor

import weightgraft as wg
from weightgraft.models import ModelLoadError

pytestmark = pytest.mark.slow


def test_snippet_on_smollm2_equals_hand_built_graft_forward():
    try:
        pre, tok = wg.load("smollm2-135m")
    except ModelLoadError as exc:
        pytest.skip(f"the embedded model is not available here: {exc}")
    sft = make_donor(pre, seed=1, scale=0.05)  # a stand-in finetune: same shapes, other weights
    prompts = ["The capital of France is", "Q: Who starred in a movie alongside Meryl Streep? A: An actor named"]
    out = wg.graft({"pre": pre, "sft": sft}, tok, prompts,
                   wg.Rule(model="sft", positions="last", layers="last_quarter", components="o+ffn"))
    names = wg.slots(pre)
    cols = [i for i, n in enumerate(names) if n.startswith("layers.")
            and int(n.split(".")[1]) >= 22 and n.split(".", 2)[2] in {"o", "gate", "up", "down"}]
    assert len(cols) == 8 * 4  # the last quarter of 30 layers: 22..29
    enc = tok(prompts, padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
    source = torch.zeros(*mask.shape, len(names), dtype=torch.long)
    source[torch.arange(2)[:, None], last[:, None], torch.tensor(cols)] = 1
    with torch.no_grad():
        full = wg.graft_forward([pre, sft], enc["input_ids"], source, attention_mask=mask)
    torch.testing.assert_close(out.logits, full[torch.arange(2), last], rtol=1e-4, atol=1e-4)
    top = out.top(3)
    assert all(isinstance(t, str) and 0 < p <= 1 for row in top for t, p in row)
    plain = wg.graft({"pre": pre, "sft": sft}, tok, prompts[:1], [])  # every slot from pre
    assert plain.top(1)[0][0][0] == " Paris"
