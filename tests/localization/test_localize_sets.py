"""The found sets' checks on a tiny pair: searched on the fit prompts and judged on held-out ones
the search never saw, controls drawn outside the set, reproducible from their seeds and
regrafted to their recorded shares, the refined set verified exact, the missed-effects sample
equal to exact effects and stratified by rank, and the cells each prompt received (a label some
prompts lack)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from tiny_world import loader, loader64, write_world

from weightgraft.api.localize import localize
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.cells import exact_effects
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.controls import draw_control, mix_key
from weightgraft.localization.examples import build_examples
from weightgraft.localization.maps import cell_map
from weightgraft.localization.prompts import select_prompts
from weightgraft.localization.search import minimal_graft_search, rank_keys
from weightgraft.localization.verify import SetVerifier, received_summary

TOL = 1e-12  # float64 models: a share regrafted outside localize agrees to float precision


SLOW_FIXTURES = ("finished",)  # its tests are `slow` (tests/conftest.py): localize with the set search


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One tiny localize run (both directions, one template) and what an outside check needs."""
    tmp = tmp_path_factory.mktemp("sets")
    raw = {"name": "sets", "data": str(write_world(tmp / "data", n=6)), "out": str(tmp / "run"),
           "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}, "templates": ["headline"],
           "exact": "none", "batch_size": 3, "exact_chunk": 64, "report": False, "dtype": "float64",
           "claims": {"enabled": False},
           "search": {"target_share": 0.9, "controls": 20, "missed_sample": 16}}
    config = parse_localize_config(raw)
    result = localize(config, progress=False, load=loader64)
    pre, sft = loader64("tiny-llama:pre"), loader64("tiny-llama:sft")
    examples, _ = build_examples(select_prompts(config), pre.tokenizer)
    index = {s.name: i for i, s in enumerate(model_slots(pre.model))}
    maps = [cell_map(e, index, pre.model) for e in examples]
    pairs = {"sufficiency": [pre.model, sft.model], "necessity": [sft.model, pre.model]}
    return result, examples, maps, pairs


def _share(models, examples, maps, keys) -> float:
    """An outside regraft: the set's exact share, straight from the engine."""
    sets = [[[m[k] for k in keys if k in m], list(m.values())] for m in maps]
    _, eff = exact_effects(models, [e.scored for e in examples], sets, pad_id=0)
    eff = torch.stack(eff)
    return float(eff[:, 0].mean() / eff[:, 1].mean())


def _keys(cells):
    return [tuple(c) if isinstance(c, list) else (c["position_label"], c["slot"]) for c in cells]


def _half(entry, examples, maps, which):
    ids = set(entry[f"{which}_ids"])
    keep = [i for i, e in enumerate(examples) if e.prompt.id in ids]
    return [examples[i] for i in keep], [maps[i] for i in keep]


def test_sets_are_searched_on_fit_prompts_and_judged_on_held_out_ones(finished):
    result, examples, maps, pairs = finished
    split = result.search.splits["headline"]
    assert len(split["fit_ids"]) == 3 and len(split["heldout_ids"]) == 3
    assert not set(split["fit_ids"]) & set(split["heldout_ids"])
    assert set(split["fit_ids"]) | set(split["heldout_ids"]) == {e.prompt.id for e in examples}
    cells = result.cells
    for entry in result.search.searches:
        assert entry["fit_ids"] == split["fit_ids"] and entry["n_examples"] == 3
        models = pairs[entry["direction"]]
        fit_ex, fit_maps = _half(entry, examples, maps, "fit")
        held_ex, held_maps = _half(entry, examples, maps, "heldout")
        found = _keys(entry["cells"])
        assert _share(models, fit_ex, fit_maps, found) == pytest.approx(entry["share"], abs=TOL)
        assert _share(models, held_ex, held_maps, found) == pytest.approx(entry["heldout_share"], abs=TOL)
        refined = _keys(entry["refined"]["cells"])
        assert _share(models, held_ex, held_maps, refined) == pytest.approx(entry["refined"]["heldout_share"], abs=TOL)
        # the search never saw the held-out prompts: a search on the fit prompts alone finds the same set
        sub = cells[(cells.direction == entry["direction"]) & cells.example_id.isin(entry["fit_ids"])]
        estimates = {k: float(v) for k, v in sub.groupby(["position_label", "slot"])["estimate"].sum().items()}
        alone = minimal_graft_search(models, [e.scored for e in fit_ex], fit_maps, estimates=estimates, pad_id=0, target_share=0.9, max_cells=1024, chunk=64)
        assert alone.cells == found
        # controls measured on both halves
        for kind in ("random", "matched"):
            held = entry["controls"][kind]["heldout"]
            shares = [s["heldout_share"] for s in entry["controls"][kind]["sets"]]
            assert held["mean"] == pytest.approx(np.mean(shares), abs=1e-12)
            assert held["p"] == pytest.approx((1 + sum(v >= entry["heldout_share"] for v in shares)) / 21)


def test_controls_redraw_from_their_seeds_and_regraft_to_their_shares(finished):
    result, examples, all_maps, pairs = finished
    for entry in result.search.searches:
        examples, maps = _half(entry, finished[1], all_maps, "fit")
        candidates = sorted(set().union(*(m.keys() for m in maps)))
        found = _keys(entry["cells"])
        controls = entry["controls"]
        assert controls["n_sets"] == 20 and controls["agrees"]
        assert controls["n_candidates"] == len(candidates)
        for kind in ("random", "matched"):
            sets = controls[kind]["sets"]
            assert len(sets) == 20 and len({s["seed"] for s in sets}) == 20
            shares = [s["share"] for s in sets]
            assert controls[kind]["mean"] == pytest.approx(np.mean(shares), abs=1e-12)
            assert controls[kind]["p95"] == pytest.approx(np.percentile(shares, 95), abs=1e-12)
            assert controls[kind]["margin_over_p95"] == pytest.approx(entry["share"] - controls[kind]["p95"], abs=1e-12)
            assert controls[kind]["beats_p95"] == (entry["share"] > controls[kind]["p95"])
            assert controls[kind]["p"] == pytest.approx((1 + sum(v >= entry["share"] for v in shares)) / 21)
            assert controls["from_complement"]
            for s in sets:  # no control set holds a cell of the found set
                assert not set(_keys(s["cells"])) & set(found)
            for s in sets[:3]:
                cells = _keys(s["cells"])
                assert draw_control(candidates, found, kind, s["seed"]).keys == cells
                assert len(set(cells)) == len(found) and set(cells) <= set(candidates)
                if kind == "matched" and not s["n_unmatched"]:
                    assert Counter(map(mix_key, cells)) == Counter(map(mix_key, found))
                assert _share(pairs[entry["direction"]], examples, maps, cells) == pytest.approx(s["share"], abs=TOL)
        # controls of the refined set too
        assert len(entry["refined"]["controls"]["random"]["sets"]) == 20


def test_random_controls_differ_by_seed():
    pool = [(f"l{i}", f"layers.{j}.o") for i in range(5) for j in range(4)]
    a = draw_control(pool, pool[:6], "random", "0:s:t:random:6:0").keys
    b = draw_control(pool, pool[:6], "random", "0:s:t:random:6:1").keys
    assert a != b and a == draw_control(list(reversed(pool)), pool[:6], "random", "0:s:t:random:6:0").keys


def test_matched_controls_short_of_a_group_draw_the_rest_from_the_complement():
    """The unembedding has one key at ``last``: a found set holding it leaves its group empty
    outside the set, so that cell is drawn uniformly from the complement, and counted."""
    pool = [("last", f"layers.{j}.o") for j in range(6)] + [("last", "unembed"), ("tok0", "layers.0.o")]
    found = [("last", "unembed"), ("last", "layers.0.o")]
    draw = draw_control(pool, found, "matched", "x")
    assert draw.n_unmatched == 1 and not set(draw.keys) & set(found) and len(draw.keys) == 2
    assert sum(mix_key(k) == ("last", "o") for k in draw.keys) >= 1
    with pytest.raises(ValueError, match="unknown control kind"):
        draw_control(pool, pool[:2], "other", "x")


def test_refined_set_is_exact_and_minimal_under_single_removals(finished):
    result, all_examples, all_maps, pairs = finished
    for entry in result.search.searches:
        examples, maps = _half(entry, all_examples, all_maps, "fit")
        refined = entry["refined"]
        models = pairs[entry["direction"]]
        cells = _keys(refined["cells"])
        assert refined["from_size"] == entry["size"] and refined["size"] <= entry["size"]
        assert set(cells) <= set(_keys(entry["cells"]))
        share = _share(models, examples, maps, cells)
        assert share == pytest.approx(refined["share"], abs=TOL)
        assert refined["reached"] == (share >= entry["target_share"])
        sizes = [s["size"] for s in refined["steps"]]
        assert sizes == sorted(sizes, reverse=True) and sizes[-1] == refined["size"]
        if refined["stopped"] == "minimal" and refined["reached"] and len(cells) > 1:
            for i in range(len(cells)):  # every single removal falls below the target
                assert _share(models, examples, maps, cells[:i] + cells[i + 1 :]) < entry["target_share"]


def test_missed_sample_effects_are_exact_and_below_the_cut(finished):
    result, all_examples, all_maps, pairs = finished
    cells = result.cells
    for entry in result.search.searches:
        examples, maps = _half(entry, all_examples, all_maps, "fit")
        missed = entry["missed"]
        models = pairs[entry["direction"]]
        sub = cells[(cells["direction"] == entry["direction"]) & (cells["template"] == entry["template"])
                    & cells["example_id"].isin(entry["fit_ids"])]
        estimates = {k: float(v) for k, v in sub.groupby(["position_label", "slot"])["estimate"].sum().items()}
        ranking = rank_keys(estimates, 1.0 if entry["total_effect"] > 0 else -1.0)
        top = set(ranking[: entry["size"]])
        sample = [(tuple(s["cell"]), s["effect"]) for s in missed["sample"]]
        assert missed["k"] == entry["size"] and missed["n_below"] == len(ranking) - entry["size"]
        assert len(sample) == missed["sample_size"] == min(16, missed["n_below"])
        assert not {k for k, _ in sample} & top
        keys = [k for k, _ in sample[:5]]
        per = [[[m[k]] if k in m else [] for k in keys] for m in maps]
        _, eff = exact_effects(models, [e.scored for e in examples], per, pad_id=0)
        exact = torch.stack(eff).double().mean(dim=0).tolist()
        assert exact == pytest.approx([v for _, v in sample[:5]], abs=TOL)
        largest = max(sample, key=lambda kv: abs(kv[1]))
        assert tuple(missed["largest"]["cell"]) == largest[0]
        assert 0 <= missed["ci95"][0] <= missed["share_below_k"] + 1e-12 <= missed["ci95"][1] + 2e-12 <= 1 + 1e-12
        # stratified by rank: every stratum sampled alike, in rank order below the cut
        if missed["below_sampled"]:
            rank = {k: i for i, k in enumerate(ranking)}
            strata = Counter(s["stratum"] for s in missed["sample"])
            assert max(strata.values()) - min(strata.values()) <= 1 and len(strata) == 8
            order = [rank[tuple(s["cell"])] for s in missed["sample"]]
            assert order == sorted(order)
        for line in missed["rules_out"]:
            hits = sum(abs(v) > line["threshold"] for _, v in sample)
            assert line["above"] == hits and hits / len(sample) <= line["fraction_upper95"] <= 1


def test_received_counts_cells_at_labels_some_prompts_lack(tmp_path):
    # free-form prompts whose first entity is 2 or 3 words: 'first_entity_last-2' exists in one only
    lines = [{"prompt": "Keanu Reeves starred in a movie with", "answer": "Nicole Kidman", "id": "a",
              "spans": {"first_actor": "Keanu Reeves", "relation": "starred in a movie"}},
             {"prompt": "Tom Hanks Brad starred in a movie with", "answer": "Will Smith", "id": "b",
              "spans": {"first_actor": "Tom Hanks Brad", "relation": "starred in a movie"}}]
    data = tmp_path / "own.jsonl"
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    config = parse_localize_config({"data": str(data), "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
                                    "out": str(tmp_path / "run")})
    pre, sft = loader("tiny-llama:pre"), loader("tiny-llama:sft")
    examples, _ = build_examples(select_prompts(config), pre.tokenizer)
    assert "first_entity_last-2" in examples[1].labels and "first_entity_last-2" not in examples[0].labels
    index = {s.name: i for i, s in enumerate(model_slots(pre.model))}
    maps = [cell_map(e, index, pre.model) for e in examples]
    verifier = SetVerifier([pre.model, sft.model], [e.scored for e in examples], maps, pad_id=0)
    keys = [("first_entity_last-2", "layers.0.o"), ("first_entity_last", "layers.0.o"), ("last", "unembed")]
    got = received_summary(verifier, keys, ["a", "b"])
    assert got == {"size": 3, "min": 2, "max": 3, "n_prompts_short": 1, "short": {"a": 2}}


def test_refinement_reports_each_round_as_it_goes():
    """``refine_set`` tells ``progress`` every round's size and exact share (a round costs
    minutes on a CPU for hundreds of cells), the same numbers its steps record."""
    from weightgraft.localization.refine import refine_set

    weight = {("last", f"layers.{i}.down"): w for i, w in enumerate([0.5, 0.3, 0.1, 0.05, 0.03, 0.02])}

    class Additive:  # the share of a set is the sum of its cells' weights
        def shares(self, sets):
            return [sum(weight[c] for c in s) for s in sets]

    seen = []
    out = refine_set(Additive(), list(weight), 1.0, 0.8, progress=lambda r, n, s: seen.append((r, n, s)))
    assert [(n, pytest.approx(s)) for _, n, s in seen] == [(st["size"], st["share"]) for st in out["steps"][1:]]
    assert [r for r, _, _ in seen] == list(range(1, len(seen) + 1)) and out["size"] == 2


def test_clopper_pearson_upper_bound():
    """No hit in 64 rules out 4.6% and more (1 - 0.05 ** (1 / 64)); the bound grows with hits."""
    from weightgraft.localization.missed import binomial_upper

    assert binomial_upper(0, 64) == pytest.approx(1 - 0.05 ** (1 / 64), abs=1e-9)
    assert binomial_upper(0, 64) < binomial_upper(1, 64) < binomial_upper(5, 64) < 1
    assert binomial_upper(64, 64) == 1.0
