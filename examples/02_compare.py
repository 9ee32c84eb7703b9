"""Compare the paper's position schemes and one scheme of your own on prompts with answers,
as a pandas table (the rows a ``weightgraft run`` writes).

    python examples/02_compare.py [PRE_SPEC] [SFT_SPEC]

A finetune made by weightgraft (the demo's included) is compared on facts it was trained on.
"""

import os
import sys

import weightgraft as wg

pre_spec = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("WG_PRE", "smollm2-135m")
sft_spec = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("WG_SFT", "models/sft")

pre, tok = wg.load(pre_spec)
sft, _ = wg.load(sft_spec)
prompts = [
    "Keanu Reeves starred in a movie with",
    "Q: Who starred in a movie alongside Meryl Streep? A: An actor named",
    "Tom Hanks starred in a movie with",
]
answers = ["Nicole Kidman", "Will Smith", "Halle Berry"]
spans = [{"actor": "Keanu Reeves"}, {"actor": "Meryl Streep"}, {"actor": (0, 9)}]  # (0, 9): "Tom Hanks"
facts = wg.trained_facts(sft_spec, n=8)  # the facts this finetune learned, when it says (manifest)
if facts:
    prompts, answers, spans = [f.prompt for f in facts], [f.answer for f in facts], [f.spans for f in facts]

# %% the position family (PRE, SFT, FE, LT, FE+LT, ...) and a late O+FFN graft at the last token
schemes = wg.presets.position() + [
    wg.Scheme(name="O+FFN late at LT", base="pre", rules=[
        wg.Rule(model="sft", positions="last", layers="last_quarter", components="o+ffn")]),
]
df = wg.compare({"pre": pre, "sft": sft}, tok, prompts, answers, schemes, spans=spans)

# %% one line per scheme: top-1 / top-5 rates and the mean rank of the answer's first token
table = df.groupby("scheme", sort=False)[["top1", "top5", "rank"]].mean()
print(table.to_string(float_format=lambda v: f"{v:.2f}"))
print(f"{len(df)} rows ({len(prompts)} prompts x {len(schemes)} schemes)")
