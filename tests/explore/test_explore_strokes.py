"""``weightgraft explore``'s strokes after the first of a prompt: the grafted row resumes from
the prompt's kept PRE and SFT states and still equals ``graft_forward`` of the whole row (float64,
<= 1e-12); a stroke the page supersedes stops at its next layer and leaves the models as they
were; superseded strokes waiting in line are answered at once, not when the running one ends."""

from __future__ import annotations

import copy
import random

import anyio
import pytest
import torch

import weightgraft as wg
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.sharing.depth import decoder_blocks
from weightgraft.engine.sharing.prefix import GraftItem
from weightgraft.engine.sharing.resume import resume_start
from weightgraft.explore.cells import cell_maps
from weightgraft.explore.requests import Cell, GraftRequest, RequestError
from weightgraft.explore.session import Explorer
from weightgraft.explore.stroke_line import StrokeLine

PROMPT = "Keanu Reeves starred in a movie with"


@pytest.fixture()
def explorer(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    return Explorer({"pre": pre, "sft": sft}, tiny_tok)


def _strokes(explorer: Explorer, n: int) -> list[tuple[list[dict], str]]:
    """Painted maps as a page sends them: cells late in the prompt and high in the model (they
    resume), anywhere, over base sft, and heads and neurons."""
    slots, rng = explorer.slot_names, random.Random(0)
    late = [{"position": n - 1 - rng.randrange(3), "slot": rng.choice(slots[len(slots) // 2:]), "model": "sft"} for _ in range(4)]
    anywhere = [{"position": rng.randrange(n), "slot": rng.choice(slots), "model": "sft"} for _ in range(6)]
    back = [{"position": n - 2, "slot": rng.choice(slots[1:-2]), "model": "pre"} for _ in range(3)]
    units = [{"position": n - 3, "slot": "layers.2.o/h1", "model": "sft"}, {"position": n - 2, "slot": "layers.3.up/n5", "model": "sft"}]
    return [(late, "pre"), (anywhere, "pre"), (back, "sft"), (units, "pre"), ([], "pre")]


def _whole(explorer: Explorer, ids: list[int], maps) -> torch.Tensor:
    return wg.graft_forward(explorer.models, torch.tensor([ids]), maps.batch_of_one())[0, -1]


@torch.no_grad()
def test_strokes_resume_from_kept_states_and_equal_the_whole_row(explorer):
    ids = [t["token_id"] for t in explorer.tokens(GraftRequest(prompt=PROMPT))]
    strokes = _strokes(explorer, len(ids))
    starts = []
    with float64_exact(explorer.models):
        for i, (cells, base) in enumerate(strokes * 2):  # the first is a new prompt, the rest resume
            maps = cell_maps([Cell(**c) for c in cells], len(ids), explorer.slot_list, explorer.roles, base)
            got = explorer.passes.logits(ids, maps)
            kept = explorer.passes.cache[tuple(ids)].kept
            assert kept is not None
            if i:
                starts.append(resume_start(explorer.models[0], GraftItem(ids, maps), kept))
            assert (got["graft"] - _whole(explorer, ids, maps)).abs().max().item() <= 1e-12
            for r, name in enumerate(("pre", "sft")):
                full = torch.full_like(maps.slots, r)
                assert (got[name] - wg.graft_forward(explorer.models, torch.tensor([ids]), full[None])[0, -1]).abs().max().item() <= 1e-12
    # the resumed strokes skipped work: later tokens, higher layers, and SFT as reference for base sft
    assert any(s.position > 0 and s.layer > 0 for s in starts)
    assert {s.reference for s in starts} == {0, 1}


@torch.no_grad()
def test_the_api_numbers_of_a_resumed_stroke_equal_wg_graft(explorer, tiny_tok):
    """Through ``Explorer.graft`` (probabilities and rank as the page shows them)."""
    cells = [{"position": 6, "slot": "layers.2.o", "model": "sft"}, {"position": 7, "slot": "layers.3.up", "model": "sft"}]
    explorer.graft(GraftRequest(prompt=PROMPT, cells=[], answer="Tom", k=5))  # the prompt's first pass
    got = explorer.graft(GraftRequest(prompt=PROMPT, cells=cells, answer="Tom", k=5))
    ids = [t["token_id"] for t in got["tokens"]]
    source = torch.tensor(got["map"]["source"])
    assert int(source.sum()) == 2
    logits = wg.graft_forward(explorer.models, torch.tensor([ids]), source[None])[0, -1]
    probs = torch.softmax(logits, -1)
    values, top = probs.topk(5)
    assert [e["token_id"] for e in got["top"]["graft"]] == top.tolist()
    assert [e["prob"] for e in got["top"]["graft"]] == pytest.approx(values.tolist(), abs=1e-12)
    answer = got["answer"]["token_id"]
    assert got["answer"]["prob"]["graft"] == pytest.approx(float(probs[answer]), abs=1e-12)
    assert got["answer"]["rank"]["graft"] == int((logits > logits[answer]).sum())


def test_a_stroke_superseded_while_it_runs_stops_at_the_next_layer(explorer):
    blocks = decoder_blocks(explorer.models[0])
    ran: list[int] = []
    handles = [b.register_forward_pre_hook(lambda *_, j=j: ran.append(j)) for j, b in enumerate(blocks)]
    calls = []

    def check() -> None:  # the page sends a newer stroke while layer 1 runs
        calls.append(len(ran))
        if len(ran) >= 2:
            raise RequestError("superseded", 409)

    cells = [{"position": 0, "slot": "embed", "model": "sft"}]  # from the first token and layer: every layer
    key = tuple(t["token_id"] for t in explorer.tokens(GraftRequest(prompt=PROMPT)))
    try:
        for resumed in (False, True):  # a new prompt (three rows), then a stroke resumed from kept states
            ran.clear()
            with pytest.raises(RequestError, match="superseded"):
                explorer.graft(GraftRequest(prompt=PROMPT, cells=cells), check)
            assert ran == [0, 1]  # layers 2 and 3 never ran
            assert (key in explorer.passes.cache) == resumed  # a stopped first pass keeps nothing
            if not resumed:
                explorer.graft(GraftRequest(prompt=PROMPT, cells=[]))
    finally:
        for h in handles:
            h.remove()
    # nothing was left swapped, and the stopped pass cached nothing wrong
    got = explorer.graft(GraftRequest(prompt=PROMPT, cells=cells, k=3))
    ids = [t["token_id"] for t in got["tokens"]]
    source = torch.tensor(got["map"]["source"])
    want = torch.softmax(wg.graft_forward(explorer.models, torch.tensor([ids]), source[None])[0, -1], -1).topk(3).values
    assert [e["prob"] for e in got["top"]["graft"]] == pytest.approx(want.tolist(), abs=1e-12)
    # the null: a check that never raises lets every layer run
    ran.clear()
    handles = [b.register_forward_pre_hook(lambda *_, j=j: ran.append(j)) for j, b in enumerate(blocks)]
    try:
        explorer.graft(GraftRequest(prompt=PROMPT, cells=cells), lambda: None)
    finally:
        for h in handles:
            h.remove()
    assert ran == [0, 1, 2, 3]


def test_work_stops_a_running_stroke_and_drops_waiting_ones_at_once():
    """Page a's stroke 1 runs; stroke 2 waits; stroke 3 arrives: stroke 2 is answered 409 before
    stroke 1 is let go, and stroke 1's check raises 409 (the pass would stop at its next layer)."""
    work, answers, events = StrokeLine(4), {}, []

    async def main() -> None:
        go = anyio.Event()

        async def first() -> str:
            work.check("a", 1)()  # nothing newer yet
            await go.wait()
            try:
                work.check("a", 1)()
            except RequestError as exc:
                answers["1 checked"] = exc.status
            return "ran"

        async def later() -> str:
            return "ran"

        async def stroke(seq: int, job) -> None:
            try:
                answers[seq] = await work.run("a", seq, job)
            except RequestError as exc:
                answers[seq] = exc.status
            events.append(seq)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for seq, job in ((1, first), (2, later), (3, later)):
                    tg.start_soon(stroke, seq, job)
                    await anyio.sleep(0.02)
                events.append("released")
                go.set()

    anyio.run(main)
    assert answers == {1: "ran", "1 checked": 409, 2: 409, 3: "ran"}
    assert events == [2, "released", 1, 3]


@torch.no_grad()
def test_half_precision_strokes_run_whole(tiny_pair, tiny_tok):
    """Models that cannot resume exactly keep no states: every stroke runs its row whole, the
    same as ``graft_forward`` of that row alone."""
    pre, sft = (copy.deepcopy(m).to(torch.bfloat16) for m in tiny_pair("llama", torch.float32))
    explorer = Explorer({"pre": pre, "sft": sft}, tiny_tok)
    assert not explorer.passes.resumable
    cells = [Cell(position=5, slot="layers.3.up", model="sft")]
    for _ in range(2):
        ids = [t["token_id"] for t in explorer.tokens(GraftRequest(prompt=PROMPT))]
        maps = cell_maps(cells, len(ids), explorer.slot_list, explorer.roles, "pre")
        got = explorer.passes.logits(ids, maps)
        assert explorer.passes.cache[tuple(ids)].kept is None
    want = wg.graft_forward(explorer.models, torch.tensor([ids]), maps.slots[None])[0, -1].float()
    torch.testing.assert_close(got["graft"], want, atol=1e-6, rtol=0)
