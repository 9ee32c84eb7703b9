"""The explore app's models and requests. A request's rules go through the same checks and
compilation as ``wg.graft``; explicit cells become the engine's source map directly, each one
validated; the passes (the grafted row, and PRE and SFT once per prompt) are ``passes``'. A
rule's ``scale`` (or a cell's scaled role) is served by a scaled role's model, built once and
kept for the next strokes (``passes.ScaledModels``)."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, TypedDict

import torch

from weightgraft.api.explain import tokens as token_table
from weightgraft.data.prompts import answer_token_ids
from weightgraft.data.spans import SpanError, resolve_spans
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.source_map import SourceMap
from weightgraft.explore.anchor import Anchoring, anchoring
from weightgraft.explore.cells import UnitRows, cell_maps, is_scaled, scaled_cells, split_of, unit_rows
from weightgraft.explore.layout import Layout, layout
from weightgraft.explore.prompt_passes import BASELINES, Check, Passes, ScaledModels
from weightgraft.explore.requests import GraftRequest, Limits, PromptRequest, RequestError, TokensRequest
from weightgraft.explore.schemes import PageSchemes, page_schemes
from weightgraft.models.spec import ScaledSpec
from weightgraft.schemes.binding import GraftInputError, check_tokenizer, prepare_graft
from weightgraft.schemes.protocol import ProtocolName
from weightgraft.schemes.scheme import Scheme
from weightgraft.schemes.selectors import first_entity, token_span


class TokenRow(TypedDict):
    """One token of a prompt as the page shows it (``/api/tokens``): ``wg.tokens``' row and the
    position selectors that pick it."""

    position: int
    token: str
    token_id: int
    start: int
    end: int
    label: str
    selectors: list[str]


class UnitSplit(TypedDict):
    """What a slot splits into for the page (``explore.cells.split_of``) and how many."""

    kind: str  # head | neuron | expert
    n: int


class PageInfo(TypedDict):
    """What the page needs before the first prompt (``/api/info``, beside the server's own keys)."""

    roles: list[str]
    slots: list[str]
    layout: Layout
    units: list[UnitSplit | None]  # per slot
    limits: dict[str, int]
    schemes: PageSchemes


class TopToken(TypedDict):
    token: str
    token_id: int
    prob: float


class AnswerView(TypedDict):
    """The answer's first token and its probability and 0-based rank under each pass."""

    text: str
    token: str
    token_id: int
    prob: dict[str, float]
    rank: dict[str, int]


class MapView(TypedDict):
    """The source map the grafted pass ran, as the page draws and resends it."""

    base: str
    roles: list[str]
    source: list[list[int]]  # [position][slot] -> role index
    heads: list[str]
    neurons: list[str]
    experts: list[str]
    units: dict[str, UnitRows]  # heads', experts' and neurons' together


class GraftView(TypedDict):
    """``/api/graft``: top-k of PRE, SFT and the grafted pass, the answer under each, the map."""

    tokens: list[TokenRow]
    top: dict[str, list[TopToken]]
    answer: AnswerView | None
    protocol: ProtocolName
    map: MapView
    ms: float


class Explorer:
    """Models by role (``pre`` and ``sft`` required, more allowed) and their tokenizer. Calls
    are serialized: the engine swaps module forwards for the duration of a pass."""

    def __init__(self, models: Mapping[str, torch.nn.Module], tokenizer: Any, limits: Limits | None = None,
                 cache_size: int = 64) -> None:
        missing = [r for r in BASELINES if r not in models]
        if missing:
            raise GraftInputError(f"explore needs models named 'pre' and 'sft' (missing: {', '.join(missing)})")
        check_tokenizer(tokenizer)
        self.roles = [*BASELINES, *(r for r in models if r not in BASELINES)]
        self.models = [models[r] for r in self.roles]
        self.tokenizer = tokenizer
        self.limits = limits or Limits()
        self.slot_list = model_slots(self.models[0])
        self.slot_names = [s.name for s in self.slot_list]
        self.slot_index = {n: i for i, n in enumerate(self.slot_names)}
        self.banks = {s.name for s in self.slot_list if s.experts}  # their maps ride with the head maps
        self.layout = layout(self.slot_names)
        self._lock = threading.Lock()
        self.passes = Passes(self.models, pad_id=tokenizer.pad_token_id or 0, cache_size=cache_size)
        self.scaled = ScaledModels(dict(zip(self.roles, self.models)))  # the last 3 scaled roles' models (used under _lock)
        self._tokens: OrderedDict[tuple[str, str], list[TokenRow]] = OrderedDict()  # by prompt and spans
        self._tokens_size = cache_size
        self._tokens_lock = threading.Lock()  # /api/tokens and /api/graft read it from their threads

    def info(self) -> PageInfo:
        """What the page needs before the first prompt: roles, slots, grids, limits, presets."""

        return {
            "roles": self.roles, "slots": self.slot_names, "layout": self.layout,
            # per slot, what it splits into (a found set of heads or neurons paints them; a bank, its experts)
            "units": [UnitSplit(kind=split[0], n=split[1]) if (split := split_of(s)) else None for s in self.slot_list],
            "limits": {"max_prompt_chars": self.limits.max_prompt_chars,
                       "max_tokens": self.limits.max_tokens, "max_k": self.limits.max_k},
            "schemes": page_schemes(),
        }

    # ------------------------------------------------------------------ requests

    def anchor(self, request: TokensRequest, tokens: list[TokenRow]) -> Anchoring | None:
        """Where the tokens of ``request.previous`` are in ``tokens`` (``anchor.anchoring``)."""
        if request.previous is None:
            return None
        if len(request.previous) > self.limits.max_tokens:
            raise RequestError(f"previous: {len(request.previous)} tokens; this server takes at most {self.limits.max_tokens}")
        return anchoring(request.previous, [t["token"] for t in tokens])

    def tokens(self, request: PromptRequest) -> list[TokenRow]:
        """The prompt's tokens with position labels and selectors (``wg.tokens``), kept per
        prompt and spans (a page sends the same ones with every stroke)."""
        self._check_prompt(request.prompt)
        key = (request.prompt, json.dumps(request.spans, sort_keys=True))
        with self._tokens_lock:
            rows = self._tokens.get(key)
            if rows is not None:
                self._tokens.move_to_end(key)
                return rows
        rows = self._token_rows(request)
        with self._tokens_lock:
            self._tokens[key] = rows
            while len(self._tokens) > self._tokens_size:
                self._tokens.popitem(last=False)
        return rows

    def _token_rows(self, request: PromptRequest) -> list[TokenRow]:
        try:
            table = token_table(self.tokenizer, request.prompt, request.spans)
            chars = resolve_spans(request.prompt, request.spans)
        except (GraftInputError, SpanError) as exc:
            raise RequestError(_one_line(exc)) from None
        if len(table) > self.limits.max_tokens:
            raise RequestError(f"the prompt has {len(table)} tokens; this server takes at most {self.limits.max_tokens}")
        offsets = list(zip(table["start"].tolist(), table["end"].tolist()))
        selectors: list[list[str]] = [[] for _ in offsets]  # the position selectors that pick each token
        first = first_entity(chars, None)
        for name, (start, end) in chars.items():
            for i in token_span(offsets, start, end):
                selectors[i] += [name, "first_entity"] if name == first else [name]
        selectors[-1].append("last")
        return [TokenRow(position=int(r["position"]), token=r["token"], token_id=int(r["id"]), start=int(r["start"]),
                         end=int(r["end"]), label=r["label"], selectors=sel)
                for r, sel in zip(table.to_dict("records"), selectors, strict=True)]

    def graft(self, request: GraftRequest, check: Check | None = None) -> GraftView:
        """Top-k of PRE, SFT and the grafted pass at the prompt's last token, the answer's
        probability and rank under each, and the source map the grafted pass ran. ``check``
        (if given) raises once the request is no longer wanted: it is called between steps."""
        t0 = time.perf_counter()
        if request.k > self.limits.max_k:
            raise RequestError(f"k: at most {self.limits.max_k}")
        if request.answer is not None and len(request.answer) > self.limits.max_answer_chars:
            raise RequestError(f"answer: {len(request.answer)} characters; this server takes at most {self.limits.max_answer_chars}")
        if request.rules is not None and request.cells is not None:
            raise RequestError("give rules or cells, not both")
        toks = self.tokens(request)
        ids = [t["token_id"] for t in toks]
        base = request.base if request.base is not None else "pre"
        if base not in self.roles and (request.cells is None or not is_scaled(base)):
            raise RequestError(f"base {base!r} is not one of the models ({', '.join(self.roles)})")
        if request.cells is not None:  # (cells over a scaled role: a map most of whose cells a scaled rule set)
            cells, base, scaled = scaled_cells(request.cells, self.roles, base)
            maps = cell_maps(cells, len(ids), self.slot_list, [*self.roles, *scaled], base)
        else:
            maps, scaled = self.rule_source(request, base)
        answer_id = self._answer_id(request.answer)
        with self._lock:
            if scaled and check is not None:
                check()  # (before building a scaled model for a stroke already superseded)
            logits = self.passes.logits(ids, maps, check, self.scaled(scaled.values()))
        logp = {name: torch.log_softmax(row, dim=-1)
                for name, row in logits.items()}
        top = {name: self._top(row, request.k) for name, row in logp.items()}
        answer = (None if answer_id is None or request.answer is None
                  else self._answer(request.answer, answer_id, logits, logp))
        view = MapView(base=base, roles=[*self.roles, *scaled], source=maps.slots.tolist(),
                       heads=sorted(set(maps.heads) - self.banks), neurons=sorted(maps.neurons),
                       experts=sorted(set(maps.heads) & self.banks),
                       units={**unit_rows(maps.slots, maps.heads, self.slot_index,
                                          {n: "expert" if n in self.banks else "head" for n in maps.heads}),
                              **unit_rows(maps.slots, maps.neurons, self.slot_index, "neuron")})
        return GraftView(tokens=toks, top=top, answer=answer, protocol=request.protocol, map=view,
                         ms=round(1000 * (time.perf_counter() - t0), 2))

    # ------------------------------------------------------------------ source maps

    def rule_source(self, request: GraftRequest, base: str) -> tuple[SourceMap, dict[str, ScaledSpec]]:
        """``[n_tokens, n_slots]`` role indices (and per-head maps) that ``rules`` give this
        prompt, and the scaled roles they use (by text, indices after the models' roles): the
        checks and compilation of ``wg.graft`` (``binding.prepare_graft``), in this app's role
        order, without building the scaled models (``self.scaled`` keeps them)."""
        try:  # the app's role order (pre first) whatever the base: its source values index self.models
            scheme = Scheme(name="graft", base=base, rules=list(request.rules or []))
            prepared = prepare_graft(dict(zip(self.roles, self.models, strict=True)), scheme, prompts=[request.prompt],
                                     spans=[request.spans], protocol=request.protocol, build_scaled=False)
            scaled = scheme.scaled_roles()
            (encoded,) = prepared.encode(self.tokenizer, [request.prompt])
        except (GraftInputError, ValueError) as exc:
            raise RequestError(_one_line(exc)) from None
        return SourceMap(encoded.source, dict(encoded.heads)), scaled

    def _top(self, logp: torch.Tensor, k: int) -> list[TopToken]:
        values, idx = logp.topk(min(k, logp.numel()))
        return [TopToken(token=self.tokenizer.decode([int(i)]), token_id=int(i), prob=float(p))
                for i, p in zip(idx.tolist(), values.exp().tolist(), strict=True)]

    def _answer_id(self, answer: str | None) -> int | None:
        """The answer's first token, as runs score it (``" " + answer``)."""
        if answer is None or not answer.strip():
            return None
        ids = answer_token_ids(self.tokenizer, answer)
        if not ids:
            raise RequestError(f"answer {answer!r} tokenizes to nothing")
        return int(ids[0])

    def _answer(self, text: str, token_id: int, logits: Mapping[str, torch.Tensor],
                logp: Mapping[str, torch.Tensor]) -> AnswerView:
        prob, rank = {}, {}
        for name, row in logits.items():
            prob[name] = float(logp[name][token_id].exp())
            rank[name] = int((row > row[token_id]).sum())  # 0-based, as in a run's results
        return AnswerView(text=text, token=self.tokenizer.decode([token_id]), token_id=token_id, prob=prob, rank=rank)

    def _check_prompt(self, prompt: str) -> None:
        if len(prompt) > self.limits.max_prompt_chars:
            raise RequestError(f"prompt: {len(prompt)} characters; this server takes at most {self.limits.max_prompt_chars}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
