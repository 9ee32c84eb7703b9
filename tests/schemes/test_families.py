"""The registry of graft families (weightgraft.schemes.families): a family added there, and
nowhere else, is a config preset, a ``wg.presets`` name and drawn in the report; every entry
compiles on a model under every protocol; and every way of drawing a family has its figures."""

from __future__ import annotations

import copy
import inspect
from types import SimpleNamespace

import pandas as pd
import pytest
import transformers as T
from tiny_models import TINY_CONFIGS, make_donor, make_tiny
from tiny_world import tokenizer, write_world

import weightgraft as wg
from weightgraft.experiments.config import ConfigError, parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.report import FAMILY_FIGURES, write_report
from weightgraft.report.families import FIGURE_MAKERS, FigureContext, family_bars, head_grids
from weightgraft.schemes import families
from weightgraft.schemes.binding import compile_for
from weightgraft.schemes.families import FAMILIES, Family, Figures
from weightgraft.schemes.protocol import PROTOCOLS
from weightgraft.schemes.scheme import BASELINE, Rule, Scheme, baselines


def probe_schemes(base: str = "pre", donor: str = "sft", positions: str = "last") -> list[Scheme]:
    """A family no preset has: the donor's O at ``positions``, and at every position."""
    return baselines(base, donor) + [
        Scheme(name=f"probe:O@{where}", base=base, labels={"positions": where},
               rules=[Rule(model=donor, positions=where, components="o")])
        for where in (positions, "all")
    ]


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.setitem(FAMILIES, "probe", Family(name="probe", preset="probe", build=probe_schemes))
    return FAMILIES["probe"]


def test_a_family_is_not_listed_before_it_is_registered():
    """The null of the test below: nothing lists ``probe`` until the registry holds it."""
    assert "probe" not in FAMILY_FIGURES and "probe" not in wg.presets.PRESETS
    assert "probe" not in dir(wg.presets) and "probe" not in families.PRESET_FAMILIES
    with pytest.raises(AttributeError):
        wg.presets.probe  # noqa: B018
    with pytest.raises(ConfigError, match="unknown scheme preset 'probe'"):
        parse_config({"data": ".", "models": {"pre": "a", "sft": "b"}, "schemes": [{"preset": "probe"}]})


def test_a_registered_family_is_a_preset_of_configs_and_of_wg_presets(probe):
    config = parse_config({"data": ".", "models": {"pre": "a", "sft": "b"},
                           "schemes": [{"preset": "probe", "direction": "pre2sft"}]})
    schemes = config.resolved_schemes()
    assert [(s.name, s.family, s.base) for s in schemes] == [
        ("SFT", BASELINE, "sft"), ("PRE", BASELINE, "pre"),
        ("probe:O@last", "probe", "sft"), ("probe:O@all", "probe", "sft")]
    with pytest.raises(ConfigError, match=r"unknown scheme preset 'nope'; presets: .*, heads, scale, probe"):
        parse_config({"data": ".", "models": {"pre": "a", "sft": "b"}, "schemes": [{"preset": "nope"}]})

    made = wg.presets.probe(positions="first_entity")
    assert [s.family for s in made] == [BASELINE, BASELINE, "probe", "probe"]
    assert made[2].labels == {"positions": "first_entity"}
    assert wg.presets.probe.__doc__ == probe_schemes.__doc__
    assert "probe" in wg.presets.PRESETS and "probe" in wg.presets.PRESET_FAMILIES
    assert "probe" in dir(wg.presets) and "probe" in wg.presets.__all__
    assert [s.name for s in wg.presets.preset("probe", positions="first_entity")] == [s.name for s in made]
    assert "probe" in families.PRESET_FAMILIES


@pytest.mark.slow
def test_a_registered_family_is_drawn_in_the_report(probe, tmp_path):
    assert "probe" in set(FAMILY_FIGURES) and FAMILY_FIGURES["probe"] == (family_bars,)
    data = write_world(tmp_path / "data")
    tok = tokenizer()
    base = make_tiny("llama", seed=0, vocab_size=len(tok))
    made = {"pre": base, "sft": make_donor(base, seed=1)}

    def load(spec, config=None):
        return SimpleNamespace(model=made[spec], tokenizer=tok, source=spec, weights_sha256=spec)

    config = parse_config({"data": str(data), "models": {"pre": "pre", "sft": "sft"}, "out": str(tmp_path / "run"),
                           "templates": ["headline"], "limit": 4, "report": False, "schemes": [{"preset": "probe"}]})
    result = run_experiment(config, load=load, progress=False)
    assert set(result.summary["family"]) == {BASELINE, "probe"}
    paths = write_report(tmp_path / "run")
    drawn = {p.name.rsplit("__", 1)[1] for p in paths.png}
    # the baselines' own bars (no position family here) and the family's bars
    assert drawn == {"position.png", "position_mean_rank.png", "probe.png", "probe_mean_rank.png"}
    assert "probe:O@last" in paths.summary_md.read_text()


def test_a_family_is_drawn_the_way_its_entry_says(monkeypatch):
    """The same rows drawn as bars and, once the entry says so, as a layer x head grid."""
    rows = [{"scheme": s, "family": f, "n": 4, "n_nonfinite": 0, "top1": 0.25, "top5": 0.5, "mean_rank": 2.0}
            for s, f in [("PRE", BASELINE), ("SFT", BASELINE), ("o[0]@-1", "probe"), ("o[1]@-1", "probe"),
                         ("o[0]@-2", "probe"), ("o[1]@-2", "probe")]]
    labels = {s: {"components": "o", "head": s[2], "layers": s.split("@")[1], "positions": "last"}
              for s in ("o[0]@-1", "o[1]@-1", "o[0]@-2", "o[1]@-2")}
    ctx = FigureContext(pd.DataFrame(rows), labels, "t", heatmap_metrics=("top5",))
    monkeypatch.setitem(FAMILIES, "probe", Family(name="probe", preset="probe", build=probe_schemes))
    assert [name for make in FAMILY_FIGURES["probe"] for name, _ in make(ctx, "probe")] == ["probe", "probe_mean_rank"]
    monkeypatch.setitem(FAMILIES, "probe", Family(name="probe", preset="probe", build=probe_schemes,
                                                  figures=Figures.HEAD_GRID))
    assert FAMILY_FIGURES["probe"] == (head_grids,)
    assert [name for make in FAMILY_FIGURES["probe"] for name, _ in make(ctx, "probe")] == ["heads_o_last_top5"]


def test_every_way_of_drawing_a_family_has_its_figures():
    assert set(FIGURE_MAKERS) == set(Figures)
    assert set(FAMILY_FIGURES) == set(FAMILIES)


def test_an_entry_names_both_a_preset_and_its_builder_or_neither():
    with pytest.raises(ValueError, match="needs both"):
        Family(name="x", preset="x")
    with pytest.raises(ValueError, match="needs both"):
        Family(name="x", build=probe_schemes)


PROMPT = "Keanu Reeves starred in a movie with"
SPANS = {"first_actor": (0, 12), "relation": (13, 31), "preposition": (32, 36)}


@pytest.fixture(scope="module")
def deep_model():
    config = copy.deepcopy(TINY_CONFIGS["llama"])
    config.num_hidden_layers = 8  # quarters and eighths of layers
    return T.AutoModelForCausalLM.from_config(config)


PRESET_PROTOCOLS = [(f.preset, p) for f in FAMILIES.values() if f.preset is not None for p in PROTOCOLS]


@pytest.mark.parametrize(("name", "protocol"), PRESET_PROTOCOLS, ids=[f"{n}-{p}" for n, p in PRESET_PROTOCOLS])
def test_every_registered_preset_compiles_on_a_tiny_model(name, protocol, deep_model):
    """Its defaults (and the model's head count where the builder asks for it) compile against
    the model, and each of its own schemes grafts some cell of this prompt from a donor."""
    family = families.presets()[name]
    build = family.builder(protocol)
    facts = {"n_heads": deep_model.config.num_attention_heads}  # what a builder may ask of the model
    params = inspect.signature(build).parameters
    required = [p.name for p in params.values() if p.default is inspect.Parameter.empty]
    assert set(required) <= set(facts), required
    schemes = build(**{k: v for k, v in facts.items() if k in params})
    own = [s for s in schemes if s.family != BASELINE]
    assert own and all(s.family == family.name for s in own)
    roles = sorted(set().union(*(s.roles() for s in schemes)), key=lambda r: (r != "pre", r))
    offsets = [(i, i + 1) for i in range(len(PROMPT))]
    for scheme, compiled in zip(schemes, compile_for(schemes, deep_model, roles, protocol), strict=True):
        source, heads = compiled.sources(offsets, SPANS)
        base = roles.index(scheme.base)
        grafted = bool((source != base).any()) or any(bool((h != base).any()) for h in heads.values())
        assert grafted == any(r.scale != 0 for r in scheme.rules), scheme.name  # scale 0 is the base
