"""Bad inputs and faults: each gets a clear error or a safe outcome, and nothing is lost.

The table of these cases is in docs/robustness.md; checkpoint-level cases (missing files,
truncated safetensors, pickle, remote code) are in tests/models/test_models.py.
"""

from __future__ import annotations

import errno
import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from tiny_models import make_donor, make_tiny, tiny_tokenizer, tiny_word_tokenizer
from tiny_world import loader, tiny_config, write_world

from weightgraft import atomic
from weightgraft.experiments.config import ConfigError, parse_config
from weightgraft.experiments.runner import DatasetError, run_experiment
from weightgraft.experiments.store import ResultsWriteError
from weightgraft.models.tokenization import TokenizerMismatchError
from weightgraft.schemes.selectors import SelectorError


def _raw(tmp_path, **extra) -> dict:
    return tiny_config(tmp_path, "robust", **{"batch_size": 4, **extra})


def _run(raw, load=loader):
    return run_experiment(parse_config(raw), load=load, progress=False)


def test_nan_donor_is_reported_per_scheme_not_averaged(tmp_path):
    def poisoned(spec, config=None):
        lm = loader(spec, config)
        if spec.endswith(":sft"):
            with torch.no_grad():
                lm.model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
        return lm

    result = _run(_raw(tmp_path), load=poisoned)
    by_scheme = result.summary.set_index(["template", "scheme"])
    assert (by_scheme.loc[("headline", "PRE"), "n_nonfinite"]) == 0
    assert (by_scheme.loc[("headline", "PRE"), "n"]) == 6
    sft = by_scheme.loc[("headline", "SFT")]
    assert sft["n_nonfinite"] == 6 and sft["n"] == 0 and pd.isna(sft["top5"])
    rows = result.results[result.results.scheme == "SFT"]
    assert not rows["finite"].any() and (rows["rank"] == -1).all()


def test_tokenizer_mismatch_is_refused(tmp_path):
    def other_tokenizer(spec, config=None):
        lm = loader(spec, config)
        if spec.endswith(":sft"):
            return SimpleNamespace(**{**vars(lm), "tokenizer": tiny_word_tokenizer(["something else"])})
        return lm

    with pytest.raises(TokenizerMismatchError, match="model 'sft'"):
        _run(_raw(tmp_path), load=other_tokenizer)


def test_non_ascii_apostrophes_and_hyphens_work(tmp_path):
    names = ["Zoë Saldaña", "Lupita Nyong'o", "Jean-Claude Van Damme", "Penélope Cruz"]
    lines = []
    for i, name in enumerate(names):
        prompt = f"{name} starred in a movie with"
        lines.append(json.dumps({
            "id": f"r{i}/headline", "relation_id": f"r{i}", "template": "headline", "prompt": prompt,
            "answer": "Tom Hanks", "answer_field": "second_actor", "spans": {"first_actor": [0, len(name)]},
        }, ensure_ascii=False))
    data = tmp_path / "names"
    data.mkdir()
    (data / "test_prompts.jsonl").write_text("\n".join(lines), encoding="utf-8")
    tok = tiny_tokenizer()  # character-level: every character is its own token

    def char_loader(spec, config=None):
        base = make_tiny("llama", vocab_size=len(tok))
        model = base if spec.endswith(":pre") else make_donor(base, 1)
        return SimpleNamespace(model=model, tokenizer=tok, source=spec, weights_sha256=spec)

    result = _run(_raw(tmp_path, data=str(data)), load=char_loader)
    assert result.exclusions["total"] == 0
    assert len(result.results) == len(names) * 8


def test_answer_that_tokenizes_to_nothing_is_excluded_and_counted(tmp_path):
    data = write_world(tmp_path / "d", n=3)
    lines = (data / "test_prompts.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["answer"] = "   "
    lines[0] = json.dumps(rec)
    (data / "test_prompts.jsonl").write_text("\n".join(lines))
    result = _run(_raw(tmp_path, data=str(data)))
    assert result.exclusions["total"] == 1
    assert "answer tokenizes to nothing" in result.exclusions["by_reason"]
    assert rec["id"] not in set(result.results["example_id"])


def test_empty_dataset_and_filters_that_leave_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "test_prompts.jsonl").write_text("")
    with pytest.raises(DatasetError, match="no test prompt"):
        _run(_raw(tmp_path, data=str(empty)))
    with pytest.raises(DatasetError, match="does not exist"):
        _run(_raw(tmp_path, data=str(tmp_path / "nowhere")))
    with pytest.raises(DatasetError, match=r"templates \['nope'\] are not in the dataset"):
        _run(_raw(tmp_path, templates=["nope"]))


def test_broken_test_prompt_line_is_named(tmp_path):
    data = write_world(tmp_path / "d", n=2)
    with open(data / "test_prompts.jsonl", "a") as fh:
        fh.write('{"id": "x", "prompt": "no answer here"}\n')
    with pytest.raises(DatasetError, match=r"test_prompts.jsonl:5: not a valid test prompt record"):
        _run(_raw(tmp_path, data=str(data)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"batch_size": "many"}, r"at batch_size: Input should be a valid integer"),
        ({"limit": 0}, r"at limit"),
        ({"schemes": [{"name": "x", "rules": [{"model": "sft", "layers": "40"}]}]}, "beyond the model's depth"),
        ({"schemes": [{"name": "x", "rules": [{"model": "sft", "components": "atn"}]}]}, "unknown component 'atn'"),
        ({"schemes": []}, "at schemes"),
        ({"schemes": [{"preset": "position"}, {"preset": "position"}]}, "appears twice"),
    ],
)
def test_bad_configs_get_clear_errors(tmp_path, change, message):
    with pytest.raises((ConfigError, SelectorError), match=message):
        _run(_raw(tmp_path, **change))


def test_an_empty_position_set_excludes_with_the_reason(tmp_path):
    raw = _raw(tmp_path, schemes=[{"name": "nothing", "rules": [{"model": "sft", "positions": "first_actor & last"}]}])
    with pytest.raises(DatasetError, match="every example was excluded.*span not found"):
        _run(raw)
    excluded = pd.read_csv(tmp_path / "run" / "exclusions.csv")
    assert len(excluded) == 12
    assert excluded.reason.str.contains("select no token").all()


@pytest.mark.slow
def test_disk_full_keeps_what_was_written_and_resumes(tmp_path, monkeypatch):
    real_fsync = atomic.os.fsync
    calls = {"n": 0}

    def failing_fsync(fd):
        calls["n"] += 1
        if calls["n"] == 4:  # identity.json, two result parts, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", failing_fsync)
    with pytest.raises(ResultsWriteError, match="disk is full.*intact"):
        _run(_raw(tmp_path))
    parts = sorted((tmp_path / "run" / "parts").glob("part-*.parquet"))
    assert len(parts) == 2 and all(len(pd.read_parquet(p)) == 4 for p in parts)
    assert not list((tmp_path / "run" / "parts").glob(".*tmp*"))  # no half file left behind
    monkeypatch.setattr(atomic.os, "fsync", real_fsync)
    resumed = _run(_raw(tmp_path))
    assert resumed.computed == len(resumed.results) - 8
    clean = _run(_raw(tmp_path, out=str(tmp_path / "clean")))
    pd.testing.assert_frame_equal(resumed.results, clean.results)


def test_unwritable_output_directory_is_named(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ResultsWriteError, match="cannot create results directory"):
        _run(_raw(tmp_path, out=str(blocker / "run")))


@pytest.mark.slow
def test_same_seed_twice_gives_identical_results(tmp_path):
    a = _run(_raw(tmp_path, out=str(tmp_path / "a")))
    b = _run(_raw(tmp_path, out=str(tmp_path / "b")))
    pd.testing.assert_frame_equal(a.results, b.results)
    assert (tmp_path / "a" / "summary.csv").read_bytes() == (tmp_path / "b" / "summary.csv").read_bytes()


def test_checkpoint_missing_a_tensor_is_refused_not_filled_at_random(tmp_path):
    from safetensors.torch import load_file, save_file
    from tiny_models import make_tiny, tiny_tokenizer

    from weightgraft.models import CorruptCheckpointError, load_model

    for arch in ("llama", "gemma"):  # gemma: tied embeddings are not "missing"
        directory = tmp_path / arch
        make_tiny(arch).save_pretrained(directory)
        tiny_tokenizer().save_pretrained(directory)
        assert load_model(directory).source.startswith("dir:")
    tensors = load_file(tmp_path / "llama" / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "llama" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CorruptCheckpointError, match="missing.*layers.0.mlp.up_proj.weight.*random"):
        load_model(tmp_path / "llama")
