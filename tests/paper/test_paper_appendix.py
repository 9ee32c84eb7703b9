"""The paper's appendix in one command: the general text Fig. 13's finetune mixes in (read from
the standard library's documentation, offline, the same on every run of a Python version), the
gentle finetune trained with it and its preset, Fig. 13's rows beside the paper's, and each
appendix world as a run of its own whose report holds its figures; all planned by ``--plan``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_paper_pipeline import base_model, settings  # noqa: F401 - the tiny model fixture

from weightgraft.data.general_text import CORPUS, stdlib_paragraphs, write_general_text
from weightgraft.paper.settings import PaperError, PaperSettings
from weightgraft.training.presets import PRESETS

pytestmark = pytest.mark.slow  # `make check` leaves these out: finetunes, the paper pipeline, the stdlib's sources


def test_the_general_text_is_prose_from_the_standard_library_in_a_fixed_order(tmp_path: Path) -> None:
    root = tmp_path / "lib"
    (root / "b").mkdir(parents=True)
    (root / "a.py").write_text('"""The first module says a great many things about nothing in particular at all.\n\n'
                               '>>> code_is_left_out()\n\nshort one."""\n'
                               'def f():\n    """A function whose docstring is long enough to be one example of prose."""\n')
    (root / "b" / "c.py").write_text('"""The first module says a great many things about nothing in particular at all."""\n'
                                     'class C:\n    """Another paragraph, in a class, that reads as ordinary English prose."""\n')
    (root / "b" / "broken.py").write_text("def (:\n")
    got = stdlib_paragraphs(10, root=root)
    assert got == ["The first module says a great many things about nothing in particular at all.",
                   "A function whose docstring is long enough to be one example of prose.",
                   "Another paragraph, in a class, that reads as ordinary English prose."]  # no code, no repeat
    assert stdlib_paragraphs(2, root=root) == got[:2]
    real = stdlib_paragraphs(300)
    assert len(real) == 300 == len(set(real)) and real == stdlib_paragraphs(300)
    n = write_general_text(tmp_path / "general.jsonl", 50)
    lines = [json.loads(x) for x in (tmp_path / "general.jsonl").read_text().splitlines()]
    assert n == len(lines) == 50 and lines[0] == {"text": real[0], "source": CORPUS}


@pytest.fixture(scope="module")
def appendix_run(base_model, tmp_path_factory):  # noqa: F811
    from weightgraft.paper.pipeline import run_paper

    out = tmp_path_factory.mktemp("appendix")
    return run_paper(settings(base_model, out, sweeps=("position", "position_gentle"), claims=False,
                              worlds=("fake_movies_fake_actors",))), out


def test_fig13s_finetune_mixes_the_general_text_in_with_the_gentle_recipe(appendix_run) -> None:
    run, out = appendix_run
    general = run.general_text.outputs
    texts = (out / "datas").glob("general-text-*/general.jsonl")
    path = next(texts)
    assert general.n == 10_000 == len(path.read_text().splitlines())
    gentle = run.finetunes["gentle"]
    stage = json.loads((next((out / "finetunes").glob("gentle-*")) / "stage.json").read_text())
    # beside cpu-quick, the default recipe is cpu-gentle: half its learning rate, as many general texts as facts
    assert run.settings.preset == "cpu-quick" and run.settings.gentle_recipe == "cpu-gentle"
    assert stage["inputs"]["preset"]["name"] == "cpu-gentle" and stage["inputs"]["supplemental"] == run.general_text.key
    assert stage["inputs"]["preset"]["learning_rate"] < PRESETS["cpu-quick"].learning_rate
    model = next((out / "finetunes").glob("gentle-*")) / "model"
    manifest = json.loads((model / "training_run.json").read_text())
    import hashlib

    assert manifest["supplemental_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    data = json.loads((model / "training_manifest.json").read_text())["data"]
    assert data["supplemental"]["n"] == data["n_train"] > 0  # the file's first texts, as many as the facts
    assert gentle.key != run.finetunes["a2b"].key
    text = (out / "paper.md").read_text()
    assert "Fig. 13(a)" in text and "Fig. 13(b)" in text
    assert f"| gentle | a2b | cpu-gentle, with general text ({CORPUS}) mixed in | met |" in text  # our recipe, named
    not_run = text.split("## Figures not run")[1].split("## ")[0]
    rows = {line.split(" ")[1]: line for line in not_run.splitlines() if line.startswith("| fig")}
    assert "fig13a" not in rows and "fig13b" not in rows and "fig13c" in rows
    assert "in the appendix world's own run: worlds/fake_movies_fake_actors/paper.md" in rows["fig10"]
    assert "run with --worlds all" in rows["fig12"]  # a world this run did not run


def test_each_appendix_world_is_a_run_of_its_own_with_its_figures(appendix_run) -> None:
    run, out = appendix_run
    sub = run.worlds["fake_movies_fake_actors"]
    assert sub.report == out / "worlds" / "fake_movies_fake_actors" / "paper.md" and sub.report.is_file()
    assert set(sub.sweeps) == {"position"} and sub.data.key != run.data.key
    assert "Fig. 10" in sub.report.read_text() and "Fig. 11" in sub.report.read_text()
    text = (out / "paper.md").read_text()
    assert "The appendix worlds (Figs. 10-12)" in text and "worlds/fake_movies_fake_actors/paper.md" in text
    link = "worlds/fake_movies_fake_actors/paper.md"
    assert f"[{link}]({link})" in text  # a link docs/splice.py follows, copying the world's report with the page
    assert f'<a href="{link}">{link}</a>' in (out / "paper.html").read_text()
    from weightgraft.paper.plan import plan_paper

    planned = plan_paper(run.settings)
    assert all(s.done for s in planned if s.stage != "report")
    assert any(s.what.startswith("fake_movies_fake_actors: ") for s in planned)
    assert any("general text" in s.what for s in planned) and any("gentle" in s.what for s in planned)


def test_an_appendix_world_that_is_the_runs_own_or_unknown_is_refused_before_anything_runs(base_model, tmp_path) -> None:  # noqa: F811
    from weightgraft.data.errors import UnknownWorldError
    from weightgraft.paper.pipeline import check_inputs

    with pytest.raises(PaperError, match="it is the run's own world"):
        check_inputs(settings(base_model, tmp_path, worlds=("fake_movies_real_actors",)))
    with pytest.raises(UnknownWorldError, match="unknown world 'nowhere'"):
        check_inputs(settings(base_model, tmp_path, worlds=("nowhere",)))
    assert not any(tmp_path.iterdir())


def test_the_gentle_recipe_follows_the_main_one() -> None:
    """The paper's gentle recipe beside its aggressive one; cpu-gentle (the same change) beside any other;
    an explicit ``--gentle-preset`` wins."""
    assert PaperSettings(model="m", preset="paper-aggressive").gentle_recipe == "paper-gentle"
    assert PaperSettings(model="m").gentle_recipe == "cpu-gentle"
    assert PaperSettings(model="m", gentle_preset="paper-gentle").gentle_recipe == "paper-gentle"
    quick, gentle = PRESETS["cpu-quick"], PRESETS["cpu-gentle"]
    changed = {k for k in quick.model_fields if getattr(quick, k) != getattr(gentle, k)}
    assert changed == {"name", "description", "learning_rate", "requires_supplemental", "supplemental_examples"}
    assert gentle.learning_rate < quick.learning_rate and gentle.weight_decay == 0.0
    paper = PRESETS["paper-gentle"], PRESETS["paper-aggressive"]
    assert paper[0].learning_rate == pytest.approx(paper[1].learning_rate / 10)
