"""The paper's stages (``paper/stages.py``): a stage is found by its inputs, whatever their
order, and is finished only by a record of those inputs."""

from __future__ import annotations

from weightgraft.paper.stages import Stage, stage_path
from weightgraft.resume.folder import Record


def test_a_stage_is_found_by_its_inputs_and_finished_by_its_record(tmp_path):
    stage = Stage("sweep", "fig2", {"seed": 1, "data": "abc"}, tmp_path)
    assert stage.finished() is None and stage.folder.parent.name == "sweeps"
    assert stage.folder.name.startswith("fig2-")
    assert Stage("sweep", "fig2", {"data": "abc", "seed": 1}, tmp_path).key == stage.key  # the inputs, not their order
    changed = Stage("sweep", "fig2", {"seed": 2, "data": "abc"}, tmp_path)
    assert changed.folder != stage.folder  # other inputs: another folder, never mixed
    (stage.folder / "results.csv").parent.mkdir(parents=True)
    (stage.folder / "results.csv").write_text("x\n")
    record = stage.finish(Record.model_validate({"results": "results.csv"}), seconds=1.25)
    assert stage.finished() == record and changed.finished() is None
    assert stage_path(record, tmp_path, "results") == (stage.folder / "results.csv").resolve()


def test_a_record_of_other_inputs_does_not_finish_a_stage(tmp_path):
    stage = Stage("finetune", "a2b", {"lr": 1e-4}, tmp_path)
    stage.finish(Record(), seconds=0)
    record = stage.record_path.read_text().replace(stage.key, "0" * len(stage.key))
    stage.record_path.write_text(record)
    assert stage.finished() is None
    stage.record_path.write_text("{not json")
    assert stage.finished() is None
