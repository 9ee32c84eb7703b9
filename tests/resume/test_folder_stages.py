"""The run folder's keyed stages and typed records (``resume/stages.py``, ``resume/manifests.py``):
a stage inside a claimed folder is read back while its key holds and computed again when an
input changes; a keyed stage's record is typed by its outputs; the records read what earlier
versions wrote."""

from __future__ import annotations

import json
import math

from weightgraft.paper.stages import FinetuneOutputs, FinetuneRecord, Stage
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import EXPERTS_FORMAT, ExpertsManifest, FolderStages, SearchRecord
from weightgraft.resume.stages import FolderStage


def test_a_stage_in_a_folder_is_read_back_while_its_inputs_hold(tmp_path):
    folder = RunFolder(tmp_path)
    made = []

    def make():
        made.append(1)
        (tmp_path / "out.csv").write_text("x\n")
        return "made"

    stage = FolderStage(folder, "stability", {"maps": "a"}, ("out.csv",))
    assert stage.run(make, lambda: "read") == ("made", False)
    assert stage.run(make, lambda: "read") == ("read", True) and len(made) == 1
    changed = FolderStage(folder, "stability", {"maps": "b"}, ("out.csv",))
    assert changed.finished() is None and changed.run(make, lambda: "read") == ("made", False)
    (tmp_path / "out.csv").unlink()  # its file gone: computed again
    assert changed.run(make, lambda: "read") == ("made", False) and len(made) == 3
    other = FolderStage(folder, "search", {"map": "a"}, ())
    other.finish(0.5)
    record = folder.read(FolderStages)
    assert record is not None and set(record.stages) == {"stability", "search"}  # each stage keeps its own key
    assert record.stages["stability"].key == changed.key and record.stages["stability"].outputs.files == ["out.csv"]


def test_search_json_keeps_what_is_not_a_number(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write(SearchRecord(metric="first_logprob", searches=[{"share": float("nan"), "size": 3}]))
    assert "NaN" in (tmp_path / "search.json").read_text()  # as json.dumps wrote it before the record was typed
    record = folder.read(SearchRecord)
    assert record is not None and math.isnan(record.searches[0]["share"]) and record.searches[0]["size"] == 3


def test_a_keyed_stages_record_is_typed_by_its_outputs_and_reads_an_older_one(tmp_path):
    stage = Stage("finetune", "a2b", {"seed": 0}, tmp_path, FinetuneOutputs)
    stage.folder.mkdir(parents=True)
    older = {"format": "weightgraft-paper-stage/1", "kind": "finetune", "name": "a2b", "key": stage.key,
             "inputs": {"seed": 0}, "outputs": {"model": "model", "checks": [{"template": "t", "direction": "a2b",
                                                                                "top5": 0.5, "n": 4}],
                                                 "later": "kept"}, "seconds": 1.0, "finished": "then"}
    stage.record_path.write_text(json.dumps(older))  # no train_seconds: written before it was kept
    record = stage.finished()
    assert isinstance(record, FinetuneRecord) and record.outputs.checks[0].top5 == 0.5
    assert record.outputs.train_seconds == 0.0 and record.as_json() == older  # a key it lacks is not written back


def test_an_expert_maps_manifest_reads_as_written(tmp_path):
    written = {"format": EXPERTS_FORMAT, "pre": "p", "donors": {"sft": "s"}, "templates": ["qa"], "seed": 0,
               "n_prompts": {"qa": 3}, "models": {"sft": {"spec": "s", "source": "dir", "weights_sha256": "ab"}},
               "versions": {"torch": "2"}}
    (tmp_path / "manifest.json").write_text(json.dumps(written))
    manifest = RunFolder(tmp_path).read(ExpertsManifest)
    assert manifest is not None and manifest.format == EXPERTS_FORMAT and manifest.models["sft"].source == "dir"
    assert manifest.as_json() == written
