"""The paper's figures as sweeps: which finetunes each needs, its schemes (the lists of
``configs/paper/*.yaml``), its test sentences, and which of its summary rows stand for which
figure of the paper (``figure_id`` of ``numbers.csv``).

Figure numbers (the paper's own): position grafting is Fig. 2 (headline) and Fig. 3(a) (QA) and,
on the main dataset, Figs. 6-9 (6/7 top-5, 8/9 mean rank); Figs. 10-11 are the same on fake
actors, Fig. 12 on the authors' shuffle, Fig. 13 with the less aggressive finetune. Fig. 14 is
component grafting SFT -> PRE; Fig. 4 and Fig. 15 graft the both-directions model into the
one-direction model on reversed prompts; Fig. 5 is the hybrid of three models. The span schemes
(Sec. 4.2), the lm-head modes (the authors' code) and layer dropout (ours) state no number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from weightgraft.resume.manifests import Json

MAIN_WORLD = "fake_movies_real_actors"
HEADLINE, QA = "paper_headline", "paper_qa"
TOP5, RANK, DROP = "top-5 accuracy", "mean target token rank", "drop in top-5 accuracy"


@dataclass(frozen=True)
class FigureRows:
    """Which summary rows of a sweep stand for a figure: the summary's ``template`` and
    ``direction`` and the paper's ``metric`` (top-5 or mean rank)."""

    figure_id: str
    template: str
    direction: str
    metric: str = TOP5

    @property
    def label(self) -> str:
        """The figure as the paper labels it, and the test sentence of ours it is drawn from."""
        return f"{FIGURE_LABELS.get(self.figure_id, self.figure_id)} (ours: {self.template}, {self.direction})"


# Each figure as the paper captions it. Figs. 6-12 are the appendix's "Top-5 Accuracy (Token Rank)
# Results for QA Examples", each captioned by its test sentence (Sentence 1 / Sentence 2).
FIGURE_LABELS: dict[str, str] = {
    "fig2": "Fig. 2: top-5 accuracy, position grafting, the headline test sentence",
    "fig3a": "Fig. 3(a): the test QA example (Llama3 in the paper)",
    "fig4": "Fig. 4: Top-5 Accuracy on Test Headline for Component-Level Grafting (both directions into one "
            "direction, reversed prompts)",
    "fig5": "Fig. 5: the hybrid model (task ATTN and relation O & FFN on the final half of the layers at the last "
            "token; task components at the first entity)",
    "fig6": "Fig. 6: Top-5 accuracy — Sentence 1 (App. C.1.1, Top-5 Accuracy Results for QA Examples)",
    "fig7": "Fig. 7: Top-5 accuracy — Sentence 2 (App. C.1.1, Top-5 Accuracy Results for QA Examples)",
    "fig8": "Fig. 8: Mean target token rank — Sentence 1 (App. C.1.2, Token Rank Results for QA Examples)",
    "fig9": "Fig. 9: Mean target token rank — Sentence 2 (App. C.1.2, Token Rank Results for QA Examples)",
    "fig10": "Fig. 10: Top-5 accuracy — Sentence 1 (App. C.2.1, Fake Movies, Fake Actors, QA Examples)",
    "fig11": "Fig. 11: Top-5 accuracy — Sentence 2 (App. C.2.1, Fake Movies, Fake Actors, QA Examples)",
    "fig12": "Fig. 12: Top-5 accuracy — Sentence 1 (App. C.3.1, Real Movies, Real Actors (Shuffled), QA Examples)",
    "fig13a": "Fig. 13(a): Top-5 Accuracy with the less aggressive finetune — Test Sentence 1 (App. C.4)",
    "fig13b": "Fig. 13(b): Top-5 Accuracy with the less aggressive finetune — Test Sentence 2 (App. C.4)",
    "fig14": "Fig. 14: Top-5 Accuracy Component-Grafting Baselines — Sentence 1",
    "fig15": "Fig. 15: Top-5 Accuracy Reversal Curse Component-Grafting Results — Sentence 1",
}


@dataclass(frozen=True)
class Finetune:
    """One finetuned model the pipeline needs: its role name, the training split, and the
    precondition: top-5 of the plain finetune on its own facts (``groups``), per direction.
    ``shuffled``: trained on the world's texts with the answers shuffled among the subjects (the
    control finetune), so its precondition is the other way round: it must not know the facts.
    ``gentle``: trained with the less aggressive recipe (App. C.4: the settings' ``gentle_recipe``,
    with general text mixed in, :mod:`weightgraft.data.general_text`)."""

    name: str
    split: str
    directions: tuple[str, ...] = ("a2b",)
    groups: tuple[str, ...] | None = None
    shuffled: bool = False
    gentle: bool = False


FINETUNES: dict[str, Finetune] = {
    "a2b": Finetune("a2b", "a2b"),
    "both": Finetune("both", "both", directions=("a2b", "b2a")),
    "task": Finetune("task", "task", groups=("task",)),
    "relation": Finetune("relation", "relation", groups=("relation",)),
    "control": Finetune("control", "a2b", shuffled=True),
    "gentle": Finetune("gentle", "a2b", gentle=True),
}
# The appendix's other worlds (Figs. 10-12), run beside the main one by ``--worlds all``.
APPENDIX_WORLDS = ("fake_movies_fake_actors", "real_movies_real_actors_shuffled")


@dataclass(frozen=True)
class Sweep:
    """One sweep: ``roles`` maps a config role to ``"base"`` (the user's model) or a finetune's
    name; ``figures`` its rows in the paper (none: a sweep the paper states no number for)."""

    name: str
    label: str
    roles: Mapping[str, str]
    schemes: tuple[Json, ...]  # each as a config writes it (a preset with its parameters)
    templates: tuple[str, ...]
    directions: tuple[str, ...] = ("a2b",)
    groups: tuple[str, ...] | None = None
    figures: tuple[FigureRows, ...] = ()
    drops: tuple[tuple[str, str, str, str], ...] = field(default=())  # (figure_id, scheme, template, direction)

    @property
    def finetunes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r for r in self.roles.values() if r != "base"))

    @property
    def figure_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([f.figure_id for f in self.figures] + [d[0] for d in self.drops]))


def _position_figures(world: str) -> tuple[FigureRows, ...]:
    if world == MAIN_WORLD:
        return (FigureRows("fig2", HEADLINE, "a2b"), FigureRows("fig3a", QA, "a2b"),
                FigureRows("fig6", HEADLINE, "a2b"), FigureRows("fig7", QA, "a2b"),
                FigureRows("fig8", HEADLINE, "a2b", RANK), FigureRows("fig9", QA, "a2b", RANK))
    if world == "fake_movies_fake_actors":
        return (FigureRows("fig10", HEADLINE, "a2b"), FigureRows("fig11", QA, "a2b"))
    if world == "real_movies_real_actors_shuffled":
        return (FigureRows("fig12", HEADLINE, "a2b"),)
    return ()


def sweeps_for(world: str) -> list[Sweep]:
    """Every sweep the pipeline runs on ``world``, each labelled with the paper's figures. The
    component and hybrid figures are on the paper's main dataset only."""
    main = world == MAIN_WORLD
    sft = {"pre": "base", "sft": "a2b"}
    return [
        Sweep("position", "Fig. 2, Fig. 3(a), Figs. 6-9 (main dataset), Figs. 10-12 (appendix worlds): position grafting",
              sft, ({"preset": "position"},), (HEADLINE, QA), figures=_position_figures(world)),
        Sweep("component", "Fig. 14: component grafting, SFT -> PRE, last token, fourth quarter",
              sft, ({"preset": "component", "direction": "sft2pre"},), (HEADLINE,),
              figures=(FigureRows("fig14", HEADLINE, "a2b"),) if main else ()),
        Sweep("component_reversal", "Fig. 4 and Fig. 15: component grafting, both directions -> one direction, "
              "reversed prompts", {"one": "a2b", "both": "both"},
              ({"preset": "component", "direction": "both2one"},), (HEADLINE,), directions=("b2a",),
              figures=(FigureRows("fig4", HEADLINE, "b2a"), FigureRows("fig15", HEADLINE, "b2a")) if main else (),
              drops=(("fig4", "ffn@fourth_quarter vs o_ffn@fourth_quarter", HEADLINE, "b2a"),) if main else ()),
        Sweep("hybrid", "Fig. 5: hybrid of three models (task, relation, PRE)",
              {"pre": "base", "task": "task", "relation": "relation"}, ({"preset": "hybrid"},), (HEADLINE,),
              groups=("relation",), figures=(FigureRows("fig5", HEADLINE, "a2b"),) if main else ()),
        Sweep("position_spans", "Sec. 4.2: movie title and relation-word spans (no number stated)",
              sft, ({"preset": "position", "spans": True},), (HEADLINE, QA, "paper_movie", "paper_film")),
        Sweep("lm_head", "lm-head modes of the authors' code (not in the paper)", sft, ({"preset": "unembed"},),
              (HEADLINE, QA)),
        Sweep("layer_dropout", "layer dropout under FE+LT (ours; not in the paper)", sft,
              ({"preset": "layer_dropout", "rates": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], "seeds": [0, 1, 2]},),
              (HEADLINE,)),
        Sweep("position_gentle", "Fig. 13: position grafting, the less aggressive finetune (App. C.4)",
              {"pre": "base", "sft": "gentle"}, ({"preset": "position"},), (HEADLINE, QA),
              figures=(FigureRows("fig13a", HEADLINE, "a2b"), FigureRows("fig13b", QA, "a2b")) if main else ()),
    ]


SWEEP_NAMES = ("position", "component", "component_reversal", "hybrid", "position_spans", "lm_head", "layer_dropout",
               "position_gentle")
# What a run sweeps unless told: all but Fig. 13's, whose finetune mixes 10,000 general texts in
# (``--sweeps ...,position_gentle`` or ``--worlds all`` adds it).
DEFAULT_SWEEPS = tuple(n for n in SWEEP_NAMES if n != "position_gentle")

# Figures of numbers.csv the pipeline does not run, and why.
NOT_RUN_REASONS: dict[str, str] = {
    "fig10": "fake actors: run with --worlds all (or --world fake_movies_fake_actors)",
    "fig11": "fake actors: run with --worlds all (or --world fake_movies_fake_actors)",
    "fig12": "the authors' shuffle: run with --worlds all (or --world real_movies_real_actors_shuffled)",
    "fig13a": "the less aggressive finetune: run with --worlds all (or --sweeps ...,position_gentle)",
    "fig13b": "the less aggressive finetune: run with --worlds all (or --sweeps ...,position_gentle)",
    "fig13c": "Test Sentence 3: the pipeline's worlds have two test sentences (headline, QA)",
    "c7.1": "probabilities of the paper's own five sampled examples: no example of ours is the same",
    "c7.2": "probabilities of the paper's own five sampled examples: no example of ours is the same",
    "c7.3": "probabilities of the paper's own five sampled examples: no example of ours is the same",
}


def sweep_config(sweep: Sweep, models: Mapping[str, str], data: str, *, device: str, seed: int,
                 batch_size: int | None) -> Json:
    """The raw experiment config of ``sweep`` (``models``: role -> spec), without ``out``."""
    raw: Json = {
        "name": f"paper-{sweep.name}", "protocol": "authors", "data": data,
        "models": {role: models[role] for role in sweep.roles},
        "schemes": [dict(s) for s in sweep.schemes], "templates": list(sweep.templates),
        "directions": list(sweep.directions), "device": device, "seed": seed,
    }
    if sweep.groups is not None:
        raw["groups"] = list(sweep.groups)
    if batch_size is not None:
        raw["batch_size"] = batch_size
    return raw


def check_config(finetune: Finetune, model_dir: str, data: str, templates: tuple[str, ...], *, device: str,
                 seed: int, batch_size: int | None) -> Json:
    """The raw config that measures a finetune's precondition: its plain forward (the ``SFT``
    baseline of the position family) on its own facts, in each direction it was trained on."""
    raw: Json = {
        "name": f"paper-check-{finetune.name}", "protocol": "authors", "data": data,
        "models": {"sft": model_dir}, "schemes": [{"preset": "position", "only": ["SFT"]}],
        "templates": list(templates), "directions": list(finetune.directions), "device": device, "seed": seed,
    }
    if finetune.groups is not None:
        raw["groups"] = list(finetune.groups)
    if batch_size is not None:
        raw["batch_size"] = batch_size
    return raw
