"""A tiny relation world on disk plus tiny models, for end-to-end runs without downloads."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

from tiny_models import make_donor, make_tiny, tiny_word_tokenizer

FIRST = ["Keanu Reeves", "Meryl Streep", "Tom Hanks", "Viola Davis", "Brad Pitt", "Emma Stone",
         "Denzel Washington", "Cate Blanchett", "Ryan Gosling", "Julia Roberts", "Matt Damon", "Amy Adams"]
SECOND = ["Nicole Kidman", "Will Smith", "Halle Berry", "Jude Law", "Sandra Bullock", "Idris Elba",
          "Naomi Watts", "Colin Firth", "Emma Thompson", "Ethan Hawke", "Uma Thurman", "Owen Wilson"]
TEMPLATES = {
    "headline": "{first_actor} starred in a movie with",
    "qa": "Q: Who starred in a movie alongside {first_actor}? A: An actor named",
}


def _record(i: int, template: str, first: str, second: str, drop_span: bool = False) -> dict:
    text = TEMPLATES[template]
    start = text.index("{first_actor}")
    prompt = text.format(first_actor=first)
    spans = {"first_actor": [start, start + len(first)]}
    rel = prompt.index("starred in a movie")
    spans["relation"] = [rel, rel + len("starred in a movie")]
    if drop_span:
        del spans["first_actor"]
    return {"id": f"r{i:04d}/{template}", "relation_id": f"r{i:04d}", "template": template,
            "direction": "a2b", "prompt": prompt, "answer": second, "answer_field": "second_actor",
            "spans": spans, "group": "relation"}


def write_world(data_dir: Path, n: int = 6, broken: int | None = None) -> Path:
    """``test_prompts.jsonl`` with ``n`` relations x 2 templates; example ``broken`` lacks its
    first_actor span (it must be excluded from every scheme)."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(_record(i, t, FIRST[i], SECOND[i], drop_span=(i == broken)))
        for t in TEMPLATES for i in range(n)
    ]
    (data_dir / "test_prompts.jsonl").write_text("\n".join(lines) + "\n")
    return data_dir


def tiny_config(tmp_path: Path, name: str, world: dict | None = None, **extra) -> dict:
    """A raw experiment config: the position preset on the tiny world, PRE vs SFT tiny Llamas."""
    raw = {
        "name": name, "data": str(write_world(tmp_path / "data", **(world or {}))),
        "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
        "schemes": [{"preset": "position"}], "out": str(tmp_path / "run"),
    }
    raw.update(extra)
    return raw


def tokenizer():
    return tiny_word_tokenizer(list(TEMPLATES.values()) + FIRST + SECOND)


def loader(spec: str, config=None) -> SimpleNamespace:
    """Deterministic tiny models by spec: 'tiny-llama:pre' (base), 'tiny-llama:sft' (donor)."""
    arch, role = spec.split(":")
    tok = tokenizer()
    base = make_tiny(arch.removeprefix("tiny-"), seed=0, vocab_size=len(tok))
    seeds = {"pre": None, "sft": 1, "task": 2, "relation": 3}
    model = base if seeds[role] is None else make_donor(base, seeds[role])
    return SimpleNamespace(model=model, tokenizer=tok, source=spec, weights_sha256=f"sha-{spec}")


def loader64(spec: str, config=None) -> SimpleNamespace:
    """``loader``'s models in float64 (shares regrafted outside a run agree to float precision)."""
    out = loader(spec, config)
    out.model = out.model.double()
    return out


def main(config_path: str) -> None:
    from weightgraft.experiments.config import load_config
    from weightgraft.experiments.runner import run_experiment

    run_experiment(load_config(Path(config_path)), load=loader, progress=False)


if __name__ == "__main__":
    main(sys.argv[1])


def save_paper_base(path: Path) -> Path:
    """A tiny tied 4-layer Llama and a byte-level BPE tokenizer trained on a small paper world, saved
    at ``path``: the paper pipeline's base in tests/paper and in tests/resume/old_folders/make.py."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from weightgraft.data import build_dataset
    from weightgraft.paper.figures import MAIN_WORLD

    ds = build_dataset(MAIN_WORLD, n=8, seed=0)
    texts = [r["text"] for r in ds.split("train")] + [r["prompt"] for r in ds.split("test_prompts")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
