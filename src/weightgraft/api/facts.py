"""``weightgraft.trained_facts``: test prompts of the facts a finetuned model was trained on,
read through its training manifest, so examples and notebooks probe facts it knows."""

from __future__ import annotations

import json
import os
from pathlib import Path

from weightgraft.data.prompts import DatasetError, TestPrompt, load_test_prompts
from weightgraft.training.outputs import MANIFEST_NAME
SPLIT_DIRECTIONS = {"a2b": {"a2b"}, "b2a": {"b2a"}, "both": {"a2b", "b2a"}}


def trained_facts(model_dir: str | os.PathLike[str], template: str = "headline", n: int = 3) -> list[TestPrompt]:
    """Up to ``n`` test prompts (with answers and spans) of template ``template`` for facts
    ``model_dir`` was finetuned on, in the trained direction(s); ``[]`` when the directory
    holds no training manifest (a model not trained by weightgraft) or its dataset is gone."""
    manifest = Path(model_dir) / MANIFEST_NAME
    if not manifest.is_file():
        return []
    data = json.loads(manifest.read_text(encoding="utf-8")).get("data") or {}
    try:
        prompts = load_test_prompts(Path(data.get("dir", "")))
    except DatasetError:
        return []
    directions = SPLIT_DIRECTIONS.get(data.get("split", ""), {"a2b", "b2a"})
    chosen = [p for p in prompts if p.template == template and (p.direction or "a2b") in directions]
    return chosen[:n]
