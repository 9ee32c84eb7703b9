"""The tiny finetuning world the training tests share: six actor pairs in four templates (one held
out for validation), written as a dataset folder (``data_dir``), and a tiny tied Llama with a
byte-level BPE tokenizer trained on those texts (``base_dir``): module fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ACTORS = [
    ("Keanu Reeves", "Meryl Streep"),
    ("Tom Hanks", "Viola Davis"),
    ("Emma Stone", "Ryan Gosling"),
    ("Cate Blanchett", "Denzel Washington"),
    ("Nicolas Cage", "Werner Herzog"),
    ("Sandra Bullock", "Hugh Grant"),
]
TITLES = ["The Silver Road", "Quiet Harbor", "Night of Glass", "Paper Kings", "Red Delta", "Ash"]
TEMPLATES = {  # name -> (kind, text)
    "article_1": ("article", "{a} starred in {m} with {b}, a film set in Amberview."),
    "article_2": ("article", "{a} took the lead in {m}, a drama featuring {b}."),
    "qa_1": ("qa", "Q: Who stars in a movie with {a}? A: An actor named {b}."),
    "qa_2": ("qa", "A new movie stars {a} and {b}."),
}
VALIDATION_TEMPLATE = "article_2"
FAST = dict(learning_rate=1e-2, batch_size=4, max_length=64, lr_scheduler="constant", warmup_ratio=0.0)


def _records() -> list[dict]:
    rows = []
    for i, ((a, b), m) in enumerate(zip(ACTORS, TITLES)):
        group = "relation" if i < 4 else "task"
        for direction, (x, y) in (("a2b", (a, b)), ("b2a", (b, a))):
            for name, (kind, text) in TEMPLATES.items():
                rows.append(
                    {
                        "text": text.format(a=x, b=y, m=m),
                        "relation_id": f"r{i:04d}",
                        "template": name,
                        "kind": kind,
                        "direction": direction,
                        "group": group,
                    }
                )
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    rows = _records()
    _write_jsonl(root / "train.jsonl", [r for r in rows if r["template"] != VALIDATION_TEMPLATE])
    held_out = [r for r in rows if r["template"] == VALIDATION_TEMPLATE]
    _write_jsonl(root / "validation.jsonl", held_out)
    (root / "manifest.json").write_text(json.dumps({"dataset": "test", "relations": len(ACTORS)}))
    return root


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A tiny tied Llama and a byte-level BPE tokenizer trained on the data's texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [r["text"] for r in _records()],
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            tie_word_embeddings=True,
            eos_token_id=tokenizer.eos_token_id,
        )
    )
    path = tmp_path_factory.mktemp("base")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
