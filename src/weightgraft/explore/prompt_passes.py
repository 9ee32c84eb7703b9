"""The model passes behind a request, per prompt: the first request of a prompt runs its grafted,
PRE and SFT rows in one pass and keeps PRE's and SFT's logits and states (``engine.sharing.
resume``); each later stroke runs its grafted row only from where it first differs from PRE or
SFT (a stroke painted at token p from layer l runs layers l.. at tokens p..). Models that cannot
resume (half precision, unchecked caches) run the grafted row whole. A ``check`` given with a
request is called before the pass and before each decoder layer, so that a stroke the page has
superseded stops within a layer instead of holding the line. A row that uses scaled roles (a
rule's ``scale``) runs whole over the models and those roles' models (``ScaledModels``): kept
states resume rows of the models that kept them only."""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from weightgraft.engine.architectures import model_slots
from weightgraft.engine.sharing.depth import decoder_blocks
from weightgraft.engine.sharing.prefix import GraftItem, prefix_forward
from weightgraft.engine.sharing.resume import KeptStates, keep_states, resumable, resume
from weightgraft.engine.source_map import SourceMap
from weightgraft.engine.swaps import swaps
from weightgraft.errors import WeightgraftError
from weightgraft.explore.requests import RequestError
from weightgraft.models.derived import scaled_model
from weightgraft.models.spec import ScaledSpec

BASELINES = ("pre", "sft")
Check = Callable[[], None]  # raises when the request is no longer wanted


@dataclass
class PromptRows:
    """What one prompt's first pass keeps: PRE's and SFT's last-token logits, and their states."""

    logits: dict[str, torch.Tensor]
    kept: KeptStates | None


class Passes:
    """The passes over ``models`` (``models[0]`` PRE, ``models[1]`` SFT), with per prompt (by
    token ids) the baselines' logits for ``cache_size`` prompts and their states for the
    ``kept_size`` most recent (a few MB per prompt)."""

    def __init__(self, models: Sequence[nn.Module], pad_id: int, cache_size: int = 64, kept_size: int = 4) -> None:
        self.models = list(models)
        self.pad_id = pad_id
        with warnings.catch_warnings():  # (a hybrid's recurrent cache: rows run whole, as the module says)
            warnings.filterwarnings("ignore", message="prefix sharing is not supported", category=UserWarning)
            self.resumable = resumable(self.models[0])
        self.n_slots = len(model_slots(self.models[0]))
        self.blocks = decoder_blocks(self.models[0])
        self.cache: OrderedDict[tuple[int, ...], PromptRows] = OrderedDict()
        self.cache_size, self.kept_size = cache_size, kept_size

    def logits(self, ids: list[int], maps: SourceMap, check: Check | None = None,
               extra: Sequence[nn.Module] = ()) -> dict[str, torch.Tensor]:
        """Last-token logits of the grafted row (``graft``) and of PRE and SFT; ``extra``: the
        models of role indices past ``models`` (scaled roles), the row then run whole."""
        key = tuple(ids)
        item = GraftItem(ids, maps)
        rows = self.cache.get(key)
        with _checked(self.blocks, check):
            if extra:  # (a new prompt's baselines first, without the extra models)
                if rows is None:
                    rows = self.cache[key] = self._baselines(ids)
                graft = _readable(prefix_forward([*self.models, *extra], [item], self.pad_id, share=False)[0, 0])
            elif rows is not None and (rows.kept is not None or not self.resumable):
                graft = self._one(item, rows.kept)
            else:  # a new prompt (or one whose states were let go): the three rows in one pass
                baselines = self._baseline_items(ids)
                if self.resumable:
                    logits, kept = keep_states(self.models, [item, *baselines], kept=[1, 2], pad_id=self.pad_id)
                else:
                    logits, kept = self._whole([item, *baselines]), None
                logits = _readable(logits[:, 0])
                rows = self.cache[key] = PromptRows(dict(zip(BASELINES, logits[1:])), kept)
                graft = logits[0]
        self.cache.move_to_end(key)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        for older in list(self.cache.values())[: -self.kept_size]:
            older.kept = None
        return {**rows.logits, "graft": graft}

    def _baseline_items(self, ids: list[int]) -> list[GraftItem]:
        """PRE's and SFT's rows: every slot of every position from one model."""
        return [GraftItem(ids, SourceMap(torch.full((len(ids), self.n_slots), r, dtype=torch.long)))
                for r in range(len(BASELINES))]

    def _baselines(self, ids: list[int]) -> PromptRows:
        """PRE's and SFT's rows alone, their states kept where the models can resume."""
        items = self._baseline_items(ids)
        if self.resumable:
            logits, kept = keep_states(self.models, items, kept=[0, 1], pad_id=self.pad_id)
        else:
            logits, kept = self._whole(items), None
        return PromptRows(dict(zip(BASELINES, _readable(logits[:, 0]))), kept)

    def _one(self, item: GraftItem, kept: KeptStates | None) -> torch.Tensor:
        """The grafted row alone: resumed from the kept states, or whole."""
        if kept is not None:
            return _readable(resume(self.models, item, kept, self.pad_id)[0, 0])
        return _readable(self._whole([item])[0, 0])

    def _whole(self, items: list[GraftItem]) -> torch.Tensor:
        return prefix_forward(self.models, items, self.pad_id, share=False)  # one batched pass, rows whole


class ScaledModels:
    """The models of scaled roles (``base + scale * (donor - base)``: ``models.derived.
    scaled_model``) by donor, base and scale, built at first use from ``models`` (by role) and
    kept for the ``size`` most recently used. Each is a whole copy of the base model, so only a
    few are kept: a page that goes back and forth between more scales than that rebuilds them."""

    def __init__(self, models: Mapping[str, nn.Module], size: int = 3) -> None:
        self.models = dict(models)
        self.size = size
        self.kept: OrderedDict[tuple[str, str, float], nn.Module] = OrderedDict()

    def __call__(self, specs: Iterable[ScaledSpec]) -> list[nn.Module]:
        """The model of each spec, in order (a request needing more than ``size`` gets them all)."""
        out = []
        for spec in specs:
            key = (spec.donor, spec.base, spec.scale)
            if key not in self.kept:
                try:
                    self.kept[key] = scaled_model(self.models[spec.base], self.models[spec.donor], spec.scale)
                except (WeightgraftError, ValueError) as exc:  # a quantized model: one line, a 400
                    raise RequestError(f"{spec.text}: {' '.join(str(exc).split())}") from None
            self.kept.move_to_end(key)
            out.append(self.kept[key])
        while len(self.kept) > self.size:
            self.kept.popitem(last=False)
        return out


def _readable(logits: torch.Tensor) -> torch.Tensor:
    """On the CPU, and half precision read in float32."""
    logits = logits.cpu()
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


@contextlib.contextmanager
def _checked(blocks: nn.ModuleList, check: Check | None) -> Iterator[None]:
    """``check()`` now and before each decoder layer while the block runs."""
    if check is None:
        yield
        return
    check()
    with swaps() as made:  # the checks come off however the pass ends
        for block in blocks:
            made.hook(block, lambda *_: check(), pre=True)
        yield
