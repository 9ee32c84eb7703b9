"""The engine's checks of its arguments: a caller's mistake is a ``WeightgraftError`` (one line
in the CLI) that keeps its built-in base for callers that catch ``ValueError`` /
``TypeError``; a state our own code should never reach stays a plain error, a bug."""

from __future__ import annotations

import sys

import pytest
import torch
from tiny_models import make_donor, make_tiny

import weightgraft as wg
from weightgraft.api.activations import record
from weightgraft.cli import main
from weightgraft.engine.attribution import metric_values
from weightgraft.engine.cells import exact_effects, parse_cell_name
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.sharing.depth import differs
from weightgraft.engine.sharing.prefix import Segment, prefix_forward
from weightgraft.errors import GraftArgumentError, GraftArgumentTypeError, WeightgraftError


@pytest.fixture(scope="module")
def base_donor():
    base = make_tiny("llama", seed=0)
    return base, make_donor(base, seed=1)


def _source(model, value=0, dtype=torch.long, seq=5):
    return torch.full((1, seq, len(wg.slots(model))), value, dtype=dtype)


IDS = torch.arange(3, 8)[None]
MISTAKES = {
    "float source": (lambda b, d: wg.graft_forward([b, d], IDS, _source(b, dtype=torch.float32)),
                     TypeError, "source must be an integer tensor"),
    "source shape": (lambda b, d: wg.graft_forward([b, d], IDS, _source(b, seq=4)), ValueError,
                     r"source must have shape \[batch, seq, n_slots\]"),
    "source range": (lambda b, d: wg.graft_forward([b, d], IDS, _source(b, 2)), ValueError,
                     "source values must index the 2 models"),
    "head map of no slot": (lambda b, d: wg.graft_forward([b, d], IDS, _source(b), head_source={"layers.0.x": IDS}),
                            ValueError, "head_source names 'layers.0.x'"),
    "logit rows": (lambda b, d: wg.graft_forward([b, d], IDS, _source(b), logit_positions=torch.tensor([[5]])),
                   ValueError, r"logit_positions must lie in 0..4"),
    "integer alpha": (lambda b, d: PartialGraft(b, d)(IDS, _source(b)), TypeError, "alpha must be a float tensor"),
    "one model's cells": (lambda b, d: exact_effects([b], [], [], pad_id=0), ValueError, "exactly two models"),
    "cell name": (lambda b, d: parse_cell_name("layers.3.o/x2"), ValueError, "not a cell name"),
    "activation name": (lambda b, d: record(b, ["layers.0.nope"]).__enter__(), ValueError, "no activation named"),
    "metric": (lambda b, d: metric_values(torch.zeros(1, 4), torch.tensor([0]), "top1"), ValueError, "unknown metric"),
    "no items": (lambda b, d: prefix_forward([b, d], [], 0), ValueError, "needs at least one item"),
}


@pytest.mark.parametrize("case", list(MISTAKES))
def test_a_callers_mistake_is_a_weightgraft_error_with_its_builtin_base(case, base_donor):
    call, builtin, message = MISTAKES[case]
    with pytest.raises(builtin, match=message) as info:
        call(*base_donor)
    assert isinstance(info.value, GraftArgumentError) and isinstance(info.value, WeightgraftError)
    assert isinstance(info.value, GraftArgumentTypeError) == (builtin is TypeError)
    assert "\n" not in str(info.value)


def test_an_internal_invariant_stays_a_bug():
    """``differs`` is only ever given a reference row of the item's own tokens (``_starts``
    groups them so); another row there is our bug, not the caller's."""
    one = Segment(torch.tensor([1, 2]), torch.zeros(2, 3, dtype=torch.long), {})
    other = Segment(torch.tensor([1, 3]), torch.zeros(2, 3, dtype=torch.long), {})
    with pytest.raises(ValueError, match="same tokens") as info:
        differs(one, other, {})
    assert not isinstance(info.value, WeightgraftError)


def _cli(monkeypatch, capsys, command) -> tuple[int, str]:
    """``weightgraft run`` whose config step runs ``command`` instead (as a sweep would)."""
    import weightgraft.experiments.config as config_mod

    monkeypatch.delenv("WEIGHTGRAFT_DEBUG", raising=False)
    monkeypatch.setattr(config_mod, "load_config", lambda *a, **k: command())
    monkeypatch.setattr(sys, "argv", ["weightgraft", "run", "exp.yaml"])
    with pytest.raises(SystemExit) as info:
        main()
    return info.value.code, capsys.readouterr().err


def test_the_cli_prints_an_engine_argument_mistake_as_one_line(base_donor, monkeypatch, capsys):
    base, donor = base_donor
    code, err = _cli(monkeypatch, capsys, lambda: wg.graft_forward([base, donor], IDS, _source(base, dtype=torch.float32)))
    assert code == 2
    assert [line for line in err.splitlines() if line.strip()] == [
        "error: GraftArgumentTypeError: source must be an integer tensor, got torch.float32"]


def test_the_cli_reports_an_engine_invariant_as_a_bug(monkeypatch, capsys):
    one = Segment(torch.tensor([1, 2]), torch.zeros(2, 3, dtype=torch.long), {})
    other = Segment(torch.tensor([1, 3]), torch.zeros(2, 3, dtype=torch.long), {})
    code, err = _cli(monkeypatch, capsys, lambda: differs(one, other, {}))
    assert code == 1 and "Traceback (most recent call last)" in err and "bug in weightgraft" in " ".join(err.split())
