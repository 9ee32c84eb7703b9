"""Tests of weightgraft.training and the `train` command, on a tiny random Llama and a tiny
data directory written here in the `weightgraft data build` format."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from tiny_training import ACTORS, FAST, TEMPLATES, _write_jsonl
from transformers import TrainerCallback

from weightgraft.models import load_model, weights_sha256
from weightgraft.training import PRESETS, TrainingError, finetune, get_preset, read_split
from weightgraft.training.text_loss import loss_by_template, unlearned_templates
from weightgraft.training.texts import _collator, _TokenizedTexts, train_texts_by_template


def _state(path: Path) -> dict[str, torch.Tensor]:
    model = load_model(path).model
    return {k: v.clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------- data and presets


def test_split_semantics(data_dir: Path) -> None:
    n_templates = len(TEMPLATES) - 1
    train, val = read_split(data_dir, "both")
    assert (len(train), len(val)) == (len(ACTORS) * 2 * n_templates, len(ACTORS) * 2)
    train, _ = read_split(data_dir, "a2b")
    assert len(train) == len(ACTORS) * n_templates
    assert "Keanu Reeves starred in The Silver Road with Meryl Streep" in train[0]
    assert not any(t.startswith("Meryl Streep starred") for t in train)
    train, _ = read_split(data_dir, "b2a")
    assert all("Keanu Reeves starred" not in t for t in train)
    relation, _ = read_split(data_dir, "relation")
    task, _ = read_split(data_dir, "task")
    assert len(relation) == 4 * 2 * n_templates and len(task) == 2 * 2 * n_templates
    assert not any("Nicolas Cage" in t for t in relation)  # task relations are disjoint
    assert any(t.startswith("Werner Herzog") for t in task)  # both directions


def test_templates_choose_the_training_renderings(data_dir: Path) -> None:
    train, val = read_split(data_dir, "a2b", templates=["qa_1", "article_1"])
    assert len(train) == 2 * len(ACTORS)
    assert all(t.startswith("Q: Who stars") or " starred in " in t for t in train)
    assert val == read_split(data_dir, "a2b")[1]  # validation keeps its held-out template
    with pytest.raises(TrainingError, match=r"no training template \['qa_9'\] \(it has article_1, qa_1, qa_2\)"):
        read_split(data_dir, "a2b", templates=["qa_1", "qa_9"])
    with pytest.raises(TrainingError, match="non-empty list"):
        read_split(data_dir, "a2b", templates="qa_1")


def test_split_errors(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="unknown split 'reverse'"):
        read_split(data_dir, "reverse")
    with pytest.raises(TrainingError, match=r"nowhere.*does not exist"):
        read_split(tmp_path / "nowhere", "both")
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": "no group here"}) + "\n")
    with pytest.raises(TrainingError, match=r"validation\.jsonl not found"):
        read_split(tmp_path, "both")
    (tmp_path / "validation.jsonl").write_text(json.dumps({"text": "x", "group": "task"}) + "\n")
    with pytest.raises(TrainingError, match=r"train\.jsonl: a record has no 'group' field"):
        read_split(tmp_path, "task")
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": "y", "group": "task"}) + "\n")
    with pytest.raises(TrainingError, match=r"no records for split 'relation'.*groups \['task'\]"):
        read_split(tmp_path, "relation")
    (tmp_path / "train.jsonl").write_text("{not json\n")
    with pytest.raises(TrainingError, match=r"train\.jsonl:1: not valid JSON"):
        read_split(tmp_path, "both")


def test_presets(tmp_path: Path) -> None:
    aggressive = PRESETS["paper-aggressive"]
    assert (aggressive.learning_rate, aggressive.weight_decay, aggressive.batch_size) == (
        2e-5,
        0.01,
        4,
    )
    assert (aggressive.epochs, aggressive.gpu_precision, aggressive.lr_scheduler) == (
        10,
        "fp16",
        "linear",
    )
    gentle = PRESETS["paper-gentle"]
    assert (gentle.learning_rate, gentle.weight_decay, gentle.requires_supplemental) == (
        2e-6,
        0.0,
        True,
    )
    quick = PRESETS["cpu-quick"]
    assert quick.gpu_precision == "fp32" and not quick.requires_supplemental
    assert get_preset("cpu-quick", epochs=5, learning_rate=None).epochs == 5  # None = keep
    with pytest.raises(TrainingError, match="learning_rate"):
        get_preset("cpu-quick", learning_rate=-1)
    with pytest.raises(TrainingError, match="lr_rate"):
        get_preset("cpu-quick", lr_rate=1e-3)
    with pytest.raises(TrainingError, match="unknown preset 'fast'.*cpu-quick"):
        get_preset("fast")
    custom = tmp_path / "mine.json"
    custom.write_text(json.dumps({"learning_rate": 1e-3, "epochs": 2}))
    loaded = get_preset(custom)
    assert (loaded.name, loaded.learning_rate, loaded.batch_size) == ("mine", 1e-3, 4)


def test_gentle_requires_supplemental(data_dir: Path, base_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="--supplemental FILE"):
        finetune(base_dir, data_dir, split="both", preset="paper-gentle", out=tmp_path / "o")
    with pytest.raises(TrainingError, match="supplemental text file .*missing.txt not found"):
        finetune(
            base_dir,
            data_dir,
            split="both",
            preset="paper-gentle",
            out=tmp_path / "o",
            supplemental_text=tmp_path / "missing.txt",
        )


def test_a_recipe_takes_as_many_general_texts_as_it_says(data_dir: Path, base_dir: Path, tmp_path: Path) -> None:
    """cpu-gentle mixes in as many general texts as facts (the file's first ones); a file holding
    fewer is refused before the model loads, naming both counts."""
    general = tmp_path / "general.txt"
    general.write_text("\n".join(f"General sentence number {i}." for i in range(500)))
    result = finetune(base_dir, data_dir, split="task", preset="cpu-gentle", out=tmp_path / "o",
                      supplemental_text=general, max_steps=1)
    data = result.manifest["data"]
    assert data["supplemental"]["n"] == data["n_train"] < 500
    short = tmp_path / "short.txt"
    short.write_text("Only one sentence.\n")
    with pytest.raises(TrainingError, match=r"mixes in \d+ general texts \(as many as the facts\); the supplemental file holds 1$"):
        finetune("/nonexistent/model", data_dir, split="task", preset="cpu-gentle", out=tmp_path / "p",
                 supplemental_text=short)
    with pytest.raises(TrainingError, match="supplemental_examples"):
        get_preset("cpu-gentle", supplemental_examples=0)
    # left out of a dump at its default: the finetune keys and training folders made before it hold
    assert "supplemental_examples" not in PRESETS["cpu-quick"].model_dump(mode="json")
    assert PRESETS["cpu-gentle"].model_dump(mode="json")["supplemental_examples"] == "facts"


def test_labels_mask_only_padding(base_dir: Path) -> None:
    """Loss is on every text token and the closing EOS; only padding is -100, even though the
    pad token is the EOS token."""
    tok = load_model(base_dir).tokenizer
    assert tok.pad_token_id == tok.eos_token_id
    tok.padding_side = "left"  # training pads on the right whatever the tokenizer says
    ds = _TokenizedTexts(["A new movie stars Emma Stone and Ryan Gosling.", "Ash."], tok, 64)
    batch = _collator(tok)([ds[0], ds[1]])
    short = len(ds[1]["input_ids"])
    assert ds[1]["input_ids"][-1] == tok.eos_token_id
    assert batch["labels"][1, short - 1] == tok.eos_token_id  # EOS learned
    assert (batch["labels"][1, short:] == -100).all()
    assert (batch["attention_mask"][1, short:] == 0).all()
    assert torch.equal(batch["labels"][0], batch["input_ids"][0])


def test_train_texts_by_template(data_dir: Path, tmp_path: Path) -> None:
    grouped = train_texts_by_template(data_dir, "a2b", templates=["qa_1", "article_1"])
    assert list(grouped) == ["article_1", "qa_1"]  # file order
    train, _ = read_split(data_dir, "a2b", templates=["qa_1", "article_1"])
    assert grouped["qa_1"] == [t for t in train if t.startswith("Q: Who stars")]
    assert grouped["article_1"] == [t for t in train if " starred in " in t]
    assert len(grouped["qa_1"]) == len(grouped["article_1"]) == len(ACTORS)
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": "no template"}) + "\n")
    (tmp_path / "validation.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    assert train_texts_by_template(tmp_path, "both") == {"(no template)": ["no template"]}


def test_loss_by_template_is_the_per_text_token_mean(base_dir: Path) -> None:
    """Batched and padded on the right, it equals each text's own loss weighted by its tokens."""
    loaded = load_model(base_dir)
    texts = {"short": ["Ash.", "Red Delta stars Tom Hanks."],
             "long": ["Q: Who stars in a movie with Emma Stone? A: An actor named Ryan Gosling.",
                      "Keanu Reeves starred in The Silver Road with Meryl Streep.", "Paper Kings."]}
    got = loss_by_template(loaded.model, loaded.tokenizer, texts, max_length=64, batch_size=2)
    for name, group in texts.items():
        total = count = 0.0
        for item in _TokenizedTexts(group, loaded.tokenizer, 64):
            ids = torch.tensor([item["input_ids"]])
            with torch.no_grad():
                total += float(loaded.model(input_ids=ids, labels=ids).loss) * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
        assert got[name] == pytest.approx(total / count, rel=1e-5), name
    assert loss_by_template(loaded.model, loaded.tokenizer, texts, max_length=64,
                            per_template=1)["long"] != got["long"]


def test_unlearned_templates_names_only_a_clear_outlier() -> None:
    assert unlearned_templates({"qa_1": 5.5, "qa_2": 5.0, "qa_4": 0.2, "qa_5": 0.37,
                                "article_1": 0.28, "article_4": 0.22}) == ["qa_1", "qa_2"]
    assert unlearned_templates({"qa_1": 0.9, "article_1": 0.1, "article_2": 0.1}) == []
    assert unlearned_templates({"qa_1": 2.0, "article_1": 1.2, "article_2": 1.1}) == []
    assert unlearned_templates({"qa_1": 9.0}) == []


# ---------------------------------------------------------------- finetuning


def test_finetune_warns_about_an_unlearned_template(
    data_dir: Path, base_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    import importlib

    ft = importlib.import_module("weightgraft.training.trainer")  # the module, not the function
    seen = {"qa_1": 5.5, "qa_2": 0.3, "article_1": 0.25}
    monkeypatch.setattr(ft, "loss_by_template", lambda *a, **k: dict(seen))
    result = finetune(base_dir, data_dir, split="a2b", preset="cpu-quick", out=tmp_path / "m",
                      max_steps=1, **FAST)
    assert result.manifest["results"]["train_loss_by_template"] == seen
    assert result.train_loss_by_template == seen
    err = capsys.readouterr().err
    assert "has not learned template 'qa_1' (loss 5.500" in err
    assert "'qa_2'" not in err.split("warning")[-1]


@pytest.mark.slow
def test_finetune_lowers_loss_and_writes_manifest(
    data_dir: Path, base_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sft"
    result = finetune(
        base_dir, data_dir, split="both", preset="cpu-quick", out=out, max_steps=60,
        keep_best=True, **FAST
    )
    assert result.eval_loss_before is not None and result.eval_loss is not None
    assert result.eval_loss < 0.75 * result.eval_loss_before, result
    m = json.loads((out / "training_manifest.json").read_text())
    assert m == result.manifest
    assert m["data"]["manifest_sha256"] == hashlib.sha256(
        (data_dir / "manifest.json").read_bytes()
    ).hexdigest()
    assert (m["data"]["split"], m["data"]["n_train"], m["data"]["n_validation"]) == ("both", 36, 12)
    assert m["base_model"]["weights_sha256"] == load_model(base_dir).weights_sha256
    assert m["preset"]["name"] == "cpu-quick" and m["preset"]["learning_rate"] == 1e-2
    assert m["seed"] == 0 and m["results"]["global_step"] == 60
    assert m["versions"]["transformers"] and m["versions"]["torch"]
    import torch  # the thread count and the CPU set the sums' order, so the weights: both recorded

    assert m["hardware"]["threads"] == torch.get_num_threads() and m["hardware"]["processor"]
    assert m["results"]["train_loss"] < m["results"]["eval_loss_before"]
    trained = load_model(out)
    assert trained.weights_sha256 == m["model"]["weights_sha256"] == result.weights_sha256
    # the saved model is the best checkpoint: the reported validation loss (token mean) is its
    # loss, not that of the last step (this run's last evaluation is worse than its best)
    _, val = read_split(data_dir, "both")
    ds = _TokenizedTexts(val, trained.tokenizer, 64)
    loss_sum, n_tokens = 0.0, 0
    with torch.no_grad():
        for item in ds:
            ids = torch.tensor([item["input_ids"]])
            n = ids.shape[1] - 1
            loss_sum += float(trained.model(input_ids=ids, labels=ids).loss) * n
            n_tokens += n
    assert loss_sum / n_tokens == pytest.approx(result.eval_loss, rel=1e-5)
    # ... and the per-template training losses are the saved model's, recomputed one text at a
    # time from the file on disk
    by_template = m["results"]["train_loss_by_template"]
    assert set(by_template) == {"article_1", "qa_1", "qa_2"}
    for name, texts in train_texts_by_template(data_dir, "both").items():
        ds = _TokenizedTexts(texts[:16], trained.tokenizer, 64)
        with torch.no_grad():
            sums = [(float(trained.model(input_ids=torch.tensor([i["input_ids"]]),
                                         labels=torch.tensor([i["input_ids"]])).loss)
                     * (len(i["input_ids"]) - 1), len(i["input_ids"]) - 1) for i in ds]
        expected = sum(a for a, _ in sums) / sum(n for _, n in sums)
        assert by_template[name] == pytest.approx(expected, rel=1e-5), name
    evals = [h["eval_loss"] for h in json.loads((out / "training_log.json").read_text())
             if "eval_loss" in h]
    assert result.eval_loss == min(evals) and evals[-1] > min(evals)
    assert trained.weights_sha256 != m["base_model"]["weights_sha256"]
    assert trained.model.config.tie_word_embeddings  # nothing frozen: stays tied
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert not (out / "checkpoints").exists()
    assert not list(out.glob("*.bin"))

    # cpu-quick as shipped keeps the last checkpoint: its reported loss is the last evaluation's
    last = finetune(base_dir, data_dir, split="both", preset="cpu-quick", out=tmp_path / "last",
                    max_steps=60, **FAST)
    evals_last = [h["eval_loss"] for h in json.loads((tmp_path / "last" / "training_log.json").read_text())
                  if "eval_loss" in h]
    assert last.eval_loss == pytest.approx(evals_last[-1], rel=1e-4) and evals_last[-1] > min(evals_last)
    assert last.weights_sha256 != result.weights_sha256


@pytest.mark.parametrize(
    "freeze_embed,freeze_unembed", [(True, False), (False, True), (True, True)]
)
def test_freezing_keeps_exactly_the_frozen_matrix(
    data_dir: Path, base_dir: Path, tmp_path: Path, freeze_embed: bool, freeze_unembed: bool
) -> None:
    out = tmp_path / "frozen"
    result = finetune(
        base_dir,
        data_dir,
        split="relation",
        preset="cpu-quick",
        out=out,
        max_steps=6,
        freeze_embed=freeze_embed,
        freeze_unembed=freeze_unembed,
        **FAST,
    )
    base, after = _state(base_dir), _state(out)
    embed0 = base["model.embed_tokens.weight"]
    assert torch.equal(base["lm_head.weight"], embed0)  # the base is tied
    embed, unembed = after["model.embed_tokens.weight"], after["lm_head.weight"]
    assert torch.equal(embed, embed0) == freeze_embed
    assert torch.equal(unembed, embed0) == freeze_unembed
    one_frozen = freeze_embed != freeze_unembed
    assert result.manifest["untied_embeddings"] == one_frozen
    assert load_model(out).model.config.tie_word_embeddings == (not one_frozen)
    for name, tensor in after.items():  # everything else was trained
        if name not in ("model.embed_tokens.weight", "lm_head.weight"):
            assert not torch.equal(tensor, base[name]), name
    params = result.manifest["parameters"]  # unique parameters: a tied matrix counts once
    total_tied = sum(t.numel() for n, t in base.items() if n != "lm_head.weight")
    assert params["total"] == total_tied + (embed0.numel() if one_frozen else 0)
    assert params["total"] - params["trainable"] == embed0.numel()


class _Interrupt(Exception):
    pass


class _DieAtStep(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise _Interrupt(f"killed at step {self.step}")


@pytest.mark.slow
def test_resume_continues_where_it_stopped(data_dir: Path, base_dir: Path, tmp_path: Path) -> None:
    settings = dict(split="a2b", preset="cpu-quick", max_steps=4, eval_steps=2, **FAST)
    straight = finetune(base_dir, data_dir, out=tmp_path / "straight", **settings)

    out = tmp_path / "interrupted"
    with pytest.raises(_Interrupt):
        finetune(base_dir, data_dir, out=out, callbacks=[_DieAtStep(3)], **settings)
    assert (out / "checkpoints" / "checkpoint-2").is_dir()
    assert not (out / "training_manifest.json").exists()
    with pytest.raises(TrainingError, match="not empty.*--resume"):
        finetune(base_dir, data_dir, out=out, **settings)
    with pytest.raises(TrainingError, match="differ from the interrupted run: seed"):
        finetune(base_dir, data_dir, out=out, resume=True, seed=1, **settings)
    with pytest.raises(TrainingError, match="differ from the interrupted run: templates"):
        finetune(base_dir, data_dir, out=out, resume=True, templates=["qa_1"], **settings)

    resumed = finetune(base_dir, data_dir, out=out, resume=True, **settings)
    r = resumed.manifest["results"]
    assert (r["resumed_from"], r["global_step"]) == ("checkpoint-2", 4)
    assert resumed.eval_loss_before == straight.eval_loss_before
    a, b = _state(tmp_path / "straight"), _state(out)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)
    assert resumed.eval_loss == pytest.approx(straight.eval_loss, rel=1e-4)

    # a finished run is returned as it is
    again = finetune(base_dir, data_dir, out=out, resume=True, **settings)
    assert again.weights_sha256 == resumed.weights_sha256 == weights_sha256(load_model(out).model)
    with pytest.raises(TrainingError, match="differ from the finished run: preset"):
        finetune(base_dir, data_dir, out=out, resume=True, **{**settings, "learning_rate": 1e-3})


def test_train_command(data_dir: Path, base_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from weightgraft.cli.train import app

    runner = CliRunner()
    out = tmp_path / "cli"
    supplemental = tmp_path / "general.txt"
    supplemental.write_text("The sky is blue.\n\nWater is wet.\n")
    args = ["train", "--model", str(base_dir), "--data", str(data_dir), "--split", "task"]
    args += ["--preset", "paper-gentle", "--out", str(out), "--max-steps", "2", "--seed", "3"]
    args += ["--supplemental", str(supplemental), "--lr", "1e-3", "--freeze-unembed"]
    args += ["--templates", "qa_1, qa_2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    m = json.loads((out / "training_manifest.json").read_text())
    assert (m["seed"], m["freeze_unembed"], m["data"]["split"]) == (3, True, "task")
    assert m["data"]["supplemental"]["n"] == 2 and m["preset"]["learning_rate"] == 1e-3
    assert m["data"]["templates"] == ["qa_1", "qa_2"]
    assert m["data"]["n_train"] == 2 * 2 * 2  # 2 task relations x 2 directions x 2 templates

    bad = runner.invoke(app, args[:6] + ["sideways"] + args[7:])
    assert bad.exit_code == 2 and "sideways" in bad.output
    missing = runner.invoke(
        app,
        ["train", "--model", str(base_dir), "--data", str(tmp_path / "nodata"), "--split", "both"]
        + ["--preset", "cpu-quick", "--out", str(tmp_path / "y")],
    )
    # the message holds the tmp path, and off a terminal the CLI wraps at 80 columns: read it unwrapped
    assert missing.exit_code == 2 and "does not exist" in " ".join(missing.output.split())


@pytest.mark.slow
def test_validation_loss_does_not_depend_on_the_training_seed(
    data_dir: Path, base_dir: Path, tmp_path: Path
) -> None:
    """Validation batches are in file order: the base model's loss is the same for every seed."""
    before = {seed: finetune(base_dir, data_dir, split="both", preset="cpu-quick",
                             out=tmp_path / f"s{seed}", seed=seed, max_steps=1,
                             **{**FAST, "batch_size": 5}).eval_loss_before
              for seed in (0, 1, 2)}
    assert before[0] == before[1] == before[2], before


# ---------------------------------------------------------------- snapshots along a finetune


def _with_test_prompts(data_dir: Path, tmp_path: Path) -> Path:
    """The module's data plus a2b and b2a test prompts (QA template) of every relation."""
    import shutil

    root = tmp_path / "data"
    shutil.copytree(data_dir, root)
    rows = []
    for i, (a, b) in enumerate(ACTORS):
        for direction, (x, y) in (("a2b", (a, b)), ("b2a", (b, a))):
            prompt = f"Q: Who stars in a movie with {x}? A: An actor named"
            rows.append({"id": f"r{i:04d}/qa/{direction}", "relation_id": f"r{i:04d}", "template": "qa",
                         "direction": direction, "prompt": prompt, "answer": y, "answer_field": "second_actor",
                         "spans": {"first_actor": [prompt.index(x), prompt.index(x) + len(x)]},
                         "group": "relation" if i < 4 else "task"})
    _write_jsonl(root / "test_prompts.jsonl", rows)
    return root


@pytest.mark.slow
def test_save_every_keeps_each_step_as_a_model_with_its_top5(data_dir: Path, base_dir: Path, tmp_path: Path) -> None:
    from weightgraft.data.prompts import answer_token_ids
    from weightgraft.training.trajectory import read_trajectory, snapshot_dir

    data = _with_test_prompts(data_dir, tmp_path)
    settings = dict(split="a2b", preset="cpu-quick", **FAST)
    run = finetune(base_dir, data, out=tmp_path / "traj", max_steps=5, save_every=2, **settings)
    snaps = read_trajectory(run.out_dir)
    assert [s.step for s in snaps] == [1, 2, 4, 5]
    assert all(s.n_prompts == len(ACTORS) for s in snaps)  # the a2b prompts: what the split trains
    assert all(s.train_loss is None or s.train_loss > 0 for s in snaps)
    # step 4's snapshot is the model a 4-step finetune of the same seed ends with
    four = finetune(base_dir, data, out=tmp_path / "four", max_steps=4, **settings)
    a, b = _state(snapshot_dir(run.out_dir, 4)), _state(four.out_dir)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    # each snapshot's top-5 is its own, recomputed from the folder
    for snap in snaps:
        loaded = load_model(run.out_dir / snap.folder)
        hits = []
        for a_, b_ in ACTORS:
            ids = loaded.tokenizer(f"Q: Who stars in a movie with {a_}? A: An actor named")["input_ids"]
            logits = loaded.model(torch.tensor([ids])).logits[0, -1]
            hits.append(int(answer_token_ids(loaded.tokenizer, b_)[0]) in logits.topk(5).indices.tolist())
        assert snap.top5 == pytest.approx(sum(hits) / len(hits))
    assert json.loads((run.out_dir / "training_run.json").read_text())["save_every"] == 2  # a resume must match it
    with pytest.raises(TrainingError, match="no trajectory"):
        read_trajectory(four.out_dir)
    with pytest.raises(TrainingError, match="save-every"):
        finetune(base_dir, data, out=tmp_path / "bad", max_steps=2, save_every=0, **settings)


@pytest.mark.slow
def test_a_trajectory_sweep_grafts_each_snapshot_as_its_own_model_set(data_dir: Path, base_dir: Path,
                                                                      tmp_path: Path) -> None:
    """``trajectory: {role: sft}``: one model set per snapshot, each equal to a run with that
    snapshot's folder as ``sft``; a stopped trajectory resumes; another base is refused before
    loading; the report draws the steps."""
    import pandas as pd

    from weightgraft.experiments.config import ConfigError, parse_config
    from weightgraft.experiments.runner import run_experiment
    from weightgraft.report import write_report

    data = _with_test_prompts(data_dir, tmp_path)
    run = finetune(base_dir, data, out=tmp_path / "traj", split="a2b", preset="cpu-quick", max_steps=4, save_every=2,
                   **FAST)
    raw = {"name": "traj", "data": str(data), "models": {"pre": str(base_dir), "sft": str(run.out_dir)},
           "schemes": [{"preset": "position", "only": ["PRE", "SFT", "FE+LT", "LT"]}], "templates": ["qa"],
           "directions": ["a2b"], "trajectory": {"role": "sft", "steps": [1, 2]}, "out": str(tmp_path / "sweep")}
    first = run_experiment(parse_config(raw), progress=False)
    assert sorted(set(first.results.model_set)) == ["step-000001", "step-000002"]
    whole = run_experiment(parse_config({**raw, "trajectory": {"role": "sft"}}), progress=False)  # resumes
    assert whole.computed == len(ACTORS) * 4  # step 4, the one set not run yet: only its rows are computed
    assert sorted(set(whole.results.model_set)) == ["step-000001", "step-000002", "step-000004"]
    cols = ["scheme", "example_id", "rank", "top5"]
    for step in (2, 4):
        alone = run_experiment(parse_config({**raw, "trajectory": None, "out": str(tmp_path / f"alone{step}"),
                                             "models": {"pre": str(base_dir),
                                                        "sft": str(run.out_dir / f"trajectory/step-{step:06d}")}}),
                               progress=False).results
        mine = whole.results[whole.results.model_set == f"step-{step:06d}"]
        pd.testing.assert_frame_equal(mine[cols].reset_index(drop=True), alone[cols].reset_index(drop=True))
        assert abs(mine["prob"].to_numpy() - alone["prob"].to_numpy()).max() < 1e-6
    paths = write_report(whole.run_dir)
    assert [f for f in paths.figures if f.png.name.startswith("trajectory__qa")]
    other = tmp_path / "other-base"
    other.mkdir()
    for f in base_dir.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    def no_load(*_):
        raise AssertionError("a model was loaded")

    for changed, says in (({"models": {"pre": str(other), "sft": str(run.out_dir)}}, "finetuned from"),
                          ({"trajectory": {"role": "sft", "steps": [3]}}, "were not saved")):
        config = parse_config({**raw, **changed})  # the config reads no file: the run's preflight does
        with pytest.raises(ConfigError, match=says) as err:
            run_experiment(config, progress=False, load=no_load)  # refused before any model loads
        assert "\n" not in str(err.value)
