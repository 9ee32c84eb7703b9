"""``engine.swaps``: every forward the engine swaps, the logit-row hook and eval mode come back
however a pass ends (an error inside the model, a KeyboardInterrupt, an error inside a
``wg.grafted`` block), for the one-pass engine, partial grafts and ``wg.grafted`` alike."""

from __future__ import annotations

import pytest
import torch

import weightgraft as wg
from weightgraft.engine.forward import graft_forward, slots
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.swaps import own_forward, swaps


def _state(model: torch.nn.Module) -> dict:
    """What a pass may change: instance forwards, pre-hooks, training flags."""
    return {name: (m.__dict__.get("forward"), tuple(m._forward_pre_hooks), m.training)
            for name, m in model.named_modules()}


class _Stop(Exception):
    pass


def _interrupt_at(module: torch.nn.Module, exc: type[BaseException]):
    def hook(m, args, out):
        raise exc()

    return module.register_forward_hook(hook)


def _ids(tok) -> torch.Tensor:
    return torch.tensor([tok("Paris is in the north of France")["input_ids"]])


def _source(pre, ids: torch.Tensor) -> torch.Tensor:
    source = torch.zeros(*ids.shape, len(slots(pre)), dtype=torch.long)
    source[:, -1] = 1  # the last token from the donor: many modules swapped
    return source


@pytest.mark.parametrize("exc", [_Stop, KeyboardInterrupt])
def test_graft_forward_restores_the_base_on_any_exit(tiny_pair, tiny_tok, exc):
    pre, sft = tiny_pair("llama")
    ids = _ids(tiny_tok)
    before = _state(pre)
    handle = _interrupt_at(pre.model.layers[2].mlp, exc)
    try:
        with pytest.raises(exc):
            graft_forward([pre, sft], ids, _source(pre, ids), logit_positions=torch.tensor([[ids.shape[1] - 1]]))
    finally:
        handle.remove()
    assert _state(pre) == before


def test_graft_forward_restores_training_mode_and_results_after_an_interrupt(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    ids = _ids(tiny_tok)
    source = _source(pre, ids)
    want = graft_forward([pre, sft], ids, source)
    pre.train()
    try:
        handle = _interrupt_at(pre.model.layers[1].self_attn.o_proj, KeyboardInterrupt)
        with pytest.raises(KeyboardInterrupt):
            graft_forward([pre, sft], ids, source)
        handle.remove()
        assert pre.training and all(m.training for m in pre.modules())
    finally:
        pre.eval()
    torch.testing.assert_close(graft_forward([pre, sft], ids, source), want, rtol=0, atol=1e-12)
    with torch.no_grad():  # the base alone is the base again
        plain = pre(ids).logits
    assert (plain - want).abs().max() > 1e-3


@pytest.mark.parametrize("exc", [_Stop, KeyboardInterrupt])
def test_partial_graft_restores_the_base_on_any_exit(tiny_pair, tiny_tok, exc):
    pre, sft = tiny_pair("llama")
    ids = _ids(tiny_tok)
    pair = PartialGraft(pre, sft)
    alpha = torch.full((*ids.shape, len(slots(pre))), 0.5, dtype=torch.float64)
    want = pair.forward(ids, alpha)
    before = _state(pre)
    handle = _interrupt_at(pre.model.layers[3].mlp.down_proj, exc)
    with pytest.raises(exc):
        pair.forward(ids, alpha, logit_positions=torch.tensor([[1]]))
    handle.remove()
    assert _state(pre) == before
    torch.testing.assert_close(pair.forward(ids, alpha), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("exc", [_Stop, KeyboardInterrupt])
def test_grafted_block_restores_the_model_on_any_exit(tiny_pair, tiny_tok, exc):
    pre, sft = tiny_pair("llama")
    before = _state(pre)
    with pytest.raises(exc), wg.grafted({"pre": pre, "sft": sft}, tiny_tok, wg.Rule(model="sft")) as model:
        assert "forward" in model.__dict__
        raise exc()
    assert _state(pre) == before


def test_swaps_give_back_an_instance_forward_and_undo_last_first():
    module = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    want = module(x)

    def wrapped(inp):  # as accelerate's device hook: an instance forward that calls the class's
        return torch.nn.Linear.forward(module, inp)

    module.forward = wrapped
    assert own_forward(module) is wrapped
    with pytest.raises(_Stop), swaps() as swap:
        swap.forward(module, lambda inp: torch.zeros(4, 2))
        swap.forward(module, lambda inp: torch.ones(4, 2))  # swapped twice
        assert bool((module(x) == 1).all())
        swap.eval_mode([module])
        assert not module.training
        raise _Stop
    assert module.__dict__["forward"] is wrapped and module.training
    del module.forward
    with swaps() as swap:  # a class forward: the instance attribute goes away again
        swap.forward(module, lambda inp: torch.zeros(4, 2))
    assert "forward" not in module.__dict__
    torch.testing.assert_close(own_forward(module)(x), want)


def test_logit_rows_are_checked_before_the_pass(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    ids = _ids(tiny_tok)
    before = _state(pre)
    for bad, match in [(torch.tensor([1]), r"\[batch, k\]"), (torch.tensor([[ids.shape[1]]]), "must lie in")]:
        with pytest.raises(ValueError, match=match):
            graft_forward([pre, sft], ids, _source(pre, ids), logit_positions=bad)
        with pytest.raises(ValueError, match=match):
            PartialGraft(pre, sft).forward(ids, torch.zeros(*ids.shape, len(slots(pre)), dtype=torch.float64),
                                           logit_positions=bad)
    assert _state(pre) == before


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


@pytest.mark.parametrize("where", ["keep_states", "reference_states"])
def test_state_hooks_come_off_when_the_pass_fails_before_it_runs(where, monkeypatch):
    """An error between registering the state-keeping hooks and the pass (building the batch)
    leaves no hook on the user's model."""
    from tiny_models import make_donor, make_tiny

    import weightgraft.engine.sharing.depth as depth
    import weightgraft.engine.sharing.resume as resume
    from weightgraft.engine.architectures import model_slots
    from weightgraft.engine.sharing.prefix import GraftItem
    from weightgraft.engine.source_map import SourceMap

    base = make_tiny("llama", seed=0, n_layers=3)
    models = [base, make_donor(base, seed=1)]
    before = [_hooks(m) for m in models]
    n_slots = len(model_slots(base))
    item = GraftItem([5, 6, 7, 8], SourceMap(torch.zeros(4, n_slots, dtype=torch.long)))

    def broken(*a, **k):
        raise RuntimeError("the batch could not be built")

    monkeypatch.setattr(resume if where == "keep_states" else depth, "pad_segments", broken)
    with pytest.raises(RuntimeError, match="could not be built"):
        if where == "keep_states":
            resume.keep_states(models, [item], kept=[0], pad_id=0)
        else:
            blocks = depth.decoder_blocks(base)
            index = {s.name: i for i, s in enumerate(model_slots(base))}
            depth._reference_states(models, [item], [depth.DepthStart(0, 1)], pad_id=0, blocks=blocks, widths={}, slot_index=index)
    assert [_hooks(m) for m in models] == before


def test_activation_hooks_come_off_however_the_block_ends(tiny_pair):
    from weightgraft.api.activations import activation_names, record

    model, _ = tiny_pair("llama", torch.float32)
    before = _hooks(model)
    names = activation_names(model)[:3]
    with pytest.raises(KeyboardInterrupt):
        with record(model, names):
            assert _hooks(model) == before + 3
            raise KeyboardInterrupt
    assert _hooks(model) == before
