"""A full finetune quantized is not the finetune: PRE and SFT quantized independently each carry
quantization noise, which can be as large as the finetune's weight change. Before a sweep trusts
a role loaded ``quantized(...)``, its answers on the run's prompts are set beside the same model
unquantized; below the stated agreement the run stops in one line.

The unquantized figures are recorded the first time (``$WEIGHTGRAFT_CACHE/quantized-agreement``,
keyed by the quantized model's weights hash and the prompts), so that a later run on the same prompts
reads them instead of loading the dense model again. A QLoRA base (the base of a ``peft(...)``
role) is exactly what its adapter was trained on and is not checked.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from weightgraft import atomic
from weightgraft.experiments.errors import QuantizedDisagreement as QuantizedDisagreement
from weightgraft.experiments.examples import Prepared
from weightgraft.models.donors import LoadSettings, load_role
from weightgraft.models.embedded import cache_root
from weightgraft.models.loaded import LoadedModel
from weightgraft.models.spec import ModelSpec
from weightgraft.resume.manifests import Json

__all__ = ["MIN_AGREEMENT", "MAX_TOP5_DROP", "QuantizedAgreement", "QuantizedDisagreement", "check_quantized_roles",
           "answer_scores"]

MIN_AGREEMENT = 0.90  # prompts on which both put the answer in (or out of) their top 5
MAX_TOP5_DROP = 0.10  # the quantized model's top-5 accuracy at most 10 points below the dense one's


@dataclass(frozen=True)
class QuantizedAgreement:
    """The quantized role beside its unquantized model on the run's prompts (first answer token,
    at the prompt's last position)."""

    role: str
    spec: str
    n: int
    top5_quantized: float
    top5_dense: float
    agreement: float  # share of prompts where both agree on "answer in the top 5"
    mean_abs_dlogprob: float  # mean |log p_quantized - log p_dense| of the answer's first token
    dense: str  # "measured now" or where the recorded figures came from

    def ok(self) -> bool:
        return self.agreement >= MIN_AGREEMENT and self.top5_dense - self.top5_quantized <= MAX_TOP5_DROP

    def line(self) -> str:
        return (f"{self.role} {self.spec}: top-5 {self.top5_quantized:.0%} quantized vs {self.top5_dense:.0%} unquantized "
                f"on {self.n} prompts, agreement {self.agreement:.0%}, mean |d log p| {self.mean_abs_dlogprob:.3f} "
                f"(unquantized: {self.dense})")


@torch.no_grad()
def answer_scores(model: Any, examples: Sequence[Prepared], batch: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example: whether the answer's first token is in the model's top 5 at the prompt's last
    position, and its log-probability there (right-padded batches; each row read at its own end)."""
    device = next(model.parameters()).device
    in_top5, logprob = [], []
    for i in range(0, len(examples), batch):
        chunk = examples[i : i + batch]
        seq = max(len(ex.input_ids) for ex in chunk)
        ids = torch.zeros((len(chunk), seq), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, ex in enumerate(chunk):
            ids[b, : len(ex.input_ids)] = torch.tensor(ex.input_ids)
            mask[b, : len(ex.input_ids)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float().cpu()
        last = logits[torch.arange(len(chunk)), mask.sum(1) - 1].log_softmax(-1)
        answer = torch.tensor([ex.answer_ids[0] for ex in chunk])
        in_top5.append((last.topk(5, dim=-1).indices == answer[:, None]).any(-1))
        logprob.append(last.gather(-1, answer[:, None])[:, 0])
    return torch.cat(in_top5), torch.cat(logprob)


def _record_path(quantized_sha: str, examples: Sequence[Prepared]) -> Path:
    """Keyed by the quantized model's own weights hash (it changes with the weights it was made
    from and with the scheme) and the prompts: a changed model or prompt set is measured anew."""
    h = hashlib.sha256(quantized_sha.encode())
    for ex in examples:
        h.update(json.dumps([ex.input_ids, ex.answer_ids[:1]]).encode())
    return cache_root() / "quantized-agreement" / f"{h.hexdigest()[:24]}.json"


def _dense_scores(spec: ModelSpec, quantized: LoadedModel, examples: Sequence[Prepared],
                  settings: LoadSettings) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The unquantized model's scores: recorded ones when this quantized model and these prompts
    were checked before, else measured now (the dense model loaded, scored and released) and recorded."""
    path = _record_path(quantized.weights_sha256, examples)
    if path.is_file():
        data = json.loads(path.read_text())
        return torch.tensor(data["in_top5"]), torch.tensor(data["logprob"]), f"recorded {data['when']} in {path}"
    dense = load_role(spec.unquantized(), settings)
    in_top5, logprob = answer_scores(dense.model, examples)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, {"spec": spec.text, "dense_weights_sha256": dense.weights_sha256,
                             "when": datetime.date.today().isoformat(),
                             "in_top5": in_top5.tolist(), "logprob": logprob.tolist()})
    del dense
    return in_top5, logprob, "measured now"


def check_quantized_roles(roles_spec: Mapping[str, ModelSpec], loaded: Mapping[str, LoadedModel],
                          examples: Sequence[Prepared], settings: LoadSettings) -> dict[str, Json]:
    """Every quantized role of a model set (not a QLoRA base) beside its unquantized model; a
    :class:`QuantizedDisagreement` line when one falls below the stated bounds. Returns each
    checked role's figures (for the run's manifest)."""
    peft_bases = {lora[0] for s in roles_spec.values() if (lora := s.adapter) is not None}
    out: dict[str, Json] = {}
    usable = [ex for ex in examples if ex.answer_ids]
    for role, lm in loaded.items():
        spec = roles_spec[role]
        if spec.scheme is None or role in peft_bases or not usable:
            continue
        q_top5, q_logprob = answer_scores(lm.model, usable)
        d_top5, d_logprob, where = _dense_scores(spec, lm, usable, settings)
        result = QuantizedAgreement(
            role=role, spec=spec.text, n=len(usable), top5_quantized=q_top5.float().mean().item(),
            top5_dense=d_top5.float().mean().item(), agreement=(q_top5 == d_top5).float().mean().item(),
            mean_abs_dlogprob=(q_logprob - d_logprob).abs().mean().item(), dense=where)
        print(f"[quantized] {result.line()}", flush=True)
        if not result.ok():
            raise QuantizedDisagreement(
                f"{result.line()}: below the stated agreement ({MIN_AGREEMENT:.0%} of prompts, top-5 at most "
                f"{MAX_TOP5_DROP:.0%} below): quantization moved this model's answers; load it unquantized, or give "
                "the finetune as the quantized base plus its adapter (peft(pre, DIR), QLoRA)")
        out[role] = asdict(result)
    return out
