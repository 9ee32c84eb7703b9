"""Graft the finetuned model's O and FFN at the last token, in the last quarter of layers, into
the pretrained model, and read the next-token predictions.

    python examples/01_graft.py [PRE_SPEC] [SFT_SPEC]

Specs are anything ``wg.load`` accepts (default: $WG_PRE / $WG_SFT, else ``smollm2-135m`` and
``models/sft``, e.g. what ``weightgraft train`` wrote). A finetune made by weightgraft (the
demo's included) is probed on facts it was trained on, read from its training manifest.
"""

import os
import sys

import weightgraft as wg

pre_spec = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("WG_PRE", "smollm2-135m")
sft_spec = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("WG_SFT", "models/sft")

pre, tok = wg.load(pre_spec)
sft, _ = wg.load(sft_spec)
models = {"pre": pre, "sft": sft}
facts = wg.trained_facts(sft_spec, n=2)  # [] for a model weightgraft did not train
prompts = [f.prompt for f in facts] or [
    "Keanu Reeves starred in a movie with",
    "Q: Who starred in a movie alongside Meryl Streep? A: An actor named",
]
for f in facts:
    print(f"trained fact: {f.prompt} -> {f.answer}")

# %% PRE alone, SFT alone, and SFT's O+FFN late at the last token
plain = wg.graft(models, tok, prompts, [])                       # no rule: every slot from pre
donor = wg.graft(models, tok, prompts, [], base="sft")           # every slot from sft
late = wg.graft(models, tok, prompts,
                wg.Rule(model="sft", positions="last", layers="last_quarter", components="o+ffn"))

for i, prompt in enumerate(prompts):
    print(prompt)
    for name, out in (("PRE", plain), ("SFT", donor), ("O+FFN@LT", late)):
        tops = ", ".join(f"{t!r} {p:.2f}" for t, p in out.top(5)[i])
        print(f"  {name:>9}: {tops}")

# %% the same graft, with the logits at every position
full = wg.graft(models, tok, prompts, wg.Rule(model="sft", positions="last"), full_logits=True)
print("full logits:", tuple(full.full_logits.shape), "padded batch:", tuple(full.input_ids.shape))
