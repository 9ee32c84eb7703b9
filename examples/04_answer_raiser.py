"""A donor that knows no fact: the base model with one vector added to the embedding rows of every
answer's first token of a world (a tied model's unembedding rows move with them), so each answer
gains about the same logit whatever the question. A claim about facts must not hold on it
(docs/localize.md: it passes the plain first-token effect, not the fact-specific one).

    python examples/04_answer_raiser.py [DATA_DIR] [OUT_DIR] [BASE_SPEC] [GAIN] [N_PROMPTS]

DATA_DIR: a dataset folder (its test prompts' answers; default: a fresh 8-relation world);
OUT_DIR: where the donor is saved (default: a temporary folder); BASE_SPEC: default $WG_PRE or
smollm2-135m; N_PROMPTS: how many of its test prompts set the direction (default: all).
"""

import os
import sys
import tempfile

import torch

import weightgraft as wg
from weightgraft.data.freeform import load_prompts
from weightgraft.data.prompts import answer_token_ids

scratch = tempfile.mkdtemp(prefix="answer-raiser-")
if len(sys.argv) > 1:
    data = sys.argv[1]
else:
    from weightgraft.data import build_dataset

    data = os.path.join(scratch, "data")
    build_dataset("fake_movies_real_actors", n=8, seed=0, out=data)
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(scratch, "donor")
base = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("WG_PRE", "smollm2-135m")
gain = float(sys.argv[4]) if len(sys.argv) > 4 else 6.0
n_prompts = int(sys.argv[5]) if len(sys.argv) > 5 else None

model, tok = wg.load(base)
prompts = load_prompts(data)
firsts = sorted({answer_token_ids(tok, p.answer)[0] for p in prompts})
rows = model.get_input_embeddings().weight
with torch.no_grad():
    # the direction the last position's final hidden state points on average: every answer row
    # moved along it gains about `gain` logits on the world's prompts
    states = torch.stack([model(**tok(p.prompt, return_tensors="pt"), output_hidden_states=True).hidden_states[-1][0, -1]
                          for p in prompts[:n_prompts]])
    mean = states.mean(0)
    direction = mean / mean.norm()
    before = model(**tok(prompts[0].prompt, return_tensors="pt")).logits[0, -1, firsts]
    rows[firsts] += gain / float(direction @ mean) * direction
    after = model(**tok(prompts[0].prompt, return_tensors="pt")).logits[0, -1, firsts]
print(f"{len(firsts)} answers' first tokens moved; on the first prompt they gain {float((after - before).mean()):.2f} "
      f"logits (sd {float((after - before).std()):.2g} across answers)")
model.save_pretrained(out)
tok.save_pretrained(out)
print(f"saved {out}")
