"""Loss per text token: the validation loss, and the saved model's loss on its own training
texts, template by template.

The validation loss is the mean over every text token (and closing EOS), whatever the
batching; the Trainer's own is a mean of batch means, which moved with how the validation set
was batched.

The Trainer's logged loss is a mean over recent batches, measured before each update: it can
look healthy while the saved model has lost one rendering of the facts (seen on the demo with
a constant learning rate, where a late update left the "Q: ... A: ..." texts at loss 5 and the
articles at 0.2). A grafting study on such a model measures nothing, so the result is recorded
in the training manifest and a template far above the others is named in a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from weightgraft.training.texts import _collator, _TokenizedTexts

# A template is flagged when its loss is above both of these: a clear outlier, not noise.
UNLEARNED_MIN_LOSS = 1.0
UNLEARNED_RATIO = 3.0


def token_mean_loss(
    model: Any, items: Sequence[dict[str, list[int]]], collate: Any, batch_size: int,
) -> float:
    """Mean next-token loss over the labelled tokens of tokenized ``items`` (padding excluded)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for start in range(0, len(items), batch_size):
            batch = {k: v.to(device) for k, v in collate(list(items[start:start + batch_size])).items()}
            with torch.no_grad():
                logits = model(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                ).logits.float()
            labels = batch["labels"][:, 1:]
            total += float(torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum",
            ))
            count += int((labels != -100).sum())
    finally:
        model.train(was_training)
    return total / max(count, 1)


def loss_by_template(
    model: Any,
    tokenizer: Any,
    texts: Mapping[str, Sequence[str]],
    *,
    max_length: int,
    per_template: int | None = 16,
    batch_size: int = 8,
) -> dict[str, float]:
    """:func:`token_mean_loss` of the first ``per_template`` texts of each template (None: all)."""
    collate = _collator(tokenizer)
    return {
        name: token_mean_loss(
            model,
            _TokenizedTexts(list(group if per_template is None else group[:per_template]),
                            tokenizer, max_length).items,
            collate, batch_size,
        )
        for name, group in texts.items()
    }


def unlearned_templates(losses: Mapping[str, float]) -> list[str]:
    """Templates whose loss is above ``UNLEARNED_MIN_LOSS`` and ``UNLEARNED_RATIO`` times the
    median template's."""
    if len(losses) < 2:
        return []
    ordered = sorted(losses.values())
    median = ordered[(len(ordered) - 1) // 2]
    return [name for name, loss in losses.items()
            if loss > UNLEARNED_MIN_LOSS and loss > UNLEARNED_RATIO * median]
