"""Where in depth does the finetuned knowledge enter? Graft windows of layers at the first
entity and at the last token (the paper's layer x position view), one preset call.

    python examples/03_layer_windows.py [PRE_SPEC] [SFT_SPEC]
"""

import os
import sys

import weightgraft as wg

pre_spec = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("WG_PRE", "smollm2-135m")
sft_spec = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("WG_SFT", "models/sft")

pre, tok = wg.load(pre_spec)
sft, _ = wg.load(sft_spec)
prompts = ["Keanu Reeves starred in a movie with", "Tom Hanks starred in a movie with"]
answers = ["Nicole Kidman", "Halle Berry"]
spans = [{"actor": "Keanu Reeves"}, {"actor": "Tom Hanks"}]
facts = wg.trained_facts(sft_spec, n=8)  # facts this finetune learned, when it says (manifest)
if facts:
    prompts, answers, spans = [f.prompt for f in facts], [f.answer for f in facts], [f.spans for f in facts]

# %% 4 windows (quarters of the depth, any model size) x 2 position sets
schemes = wg.presets.layer_window(positions=("first_entity", "last"), n_windows=4)
df = wg.compare({"pre": pre, "sft": sft}, tok, prompts, answers, schemes, spans=spans)

# %% mean rank of the answer per (position set, window)
df["positions"] = [s.split("@")[0] for s in df["scheme"]]
df["window"] = [s.split("@")[1] for s in df["scheme"]]
print(df.pivot_table(index="positions", columns="window", values="rank", aggfunc="mean").round(1))
