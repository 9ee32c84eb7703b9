"""After the demo: its models by name (``wg.load("demo")``, ``demo:pre``, ``sft: demo``), one line
when no demo has run, the "next" block the demo ends with (report, finetune, configs to copy,
commands that work on what it made), and what a random model's refusal says makes it work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import weightgraft as wg
from weightgraft.models.demo_models import DemoNotFoundError, read_demo_record, write_demo_record
from weightgraft.models.spec import resolve_demo_spec


@pytest.fixture()
def no_demo(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIGHTGRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def test_load_demo_without_a_demo_is_one_line_saying_how_to_make_it(no_demo, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("weightgraft.models.loading.read_location", no_load)
    monkeypatch.setattr("weightgraft.models.loading.read_embedded", no_load)
    for spec in ("demo", "demo:pre", " Demo:SFT "):
        with pytest.raises(wg.WeightgraftError) as err:
            wg.load(spec)
        message = str(err.value)
        assert "\n" not in message and "`make demo`" in message and "`weightgraft demo`" in message


def test_load_demo_gives_the_demos_finetune_and_base(no_demo, tmp_path, tiny_model_dirs, capsys):
    write_demo_record(str(tiny_model_dirs["pre"]), tiny_model_dirs["sft"], tmp_path / "runs" / "demo" / "run")
    record = read_demo_record()
    assert record is not None and record.report == (tmp_path / "runs/demo/run/report/report.html").resolve()
    sft, tok = wg.load("demo")
    pre, _ = wg.load("demo:pre")
    want_sft, _ = wg.load(tiny_model_dirs["sft"])
    want_pre, _ = wg.load(tiny_model_dirs["pre"])
    for got, want in ((sft, want_sft), (pre, want_pre)):
        for (name, a), (_, b) in zip(got.state_dict().items(), want.state_dict().items(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert not torch.equal(pre.model.embed_tokens.weight, sft.model.embed_tokens.weight)
    assert tok("Keanu Reeves")["input_ids"]
    assert f"demo: {tiny_model_dirs['sft'].resolve()} (`weightgraft demo`'s finetune)" in capsys.readouterr().err
    # a config's `sft: demo` plans and checks as the same directory
    from weightgraft.models.spec import parse_spec

    parse_spec("demo").check()
    assert parse_spec("demo").safetensors_dir() == tiny_model_dirs["sft"].resolve()
    assert parse_spec("demo").footprint().config.num_hidden_layers == want_sft.config.num_hidden_layers


def test_a_demo_of_an_older_weightgraft_is_found_through_its_manifest(no_demo, tmp_path, tiny_model_dirs):
    run = tmp_path / "runs" / "demo" / "run"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"config": {"models": {"pre": "smollm2-135m",
                                                                         "sft": str(tiny_model_dirs["sft"])}}}))
    assert resolve_demo_spec("demo") == str(tiny_model_dirs["sft"].resolve())
    assert resolve_demo_spec("demo:pre") == "smollm2-135m"
    assert resolve_demo_spec("models/sft") == "models/sft"  # other specs pass through


def test_a_demo_whose_finetune_is_gone_says_so(no_demo, tmp_path):
    write_demo_record("smollm2-135m", tmp_path / "cache" / "demo" / "sft-gone", tmp_path / "run")
    with pytest.raises(DemoNotFoundError, match="sft-gone is gone from the cache; run `make demo`"):
        wg.load("demo")


def test_the_demo_ends_with_next_steps_that_work_on_what_it_made(tmp_path, monkeypatch):
    from weightgraft.demo import DEMO_TEMPLATES, next_steps, sft_spec, write_next_configs
    from weightgraft.experiments.config import load_config
    from weightgraft.localization.config import load_localize_config

    monkeypatch.chdir(tmp_path)
    out, sft_dir = Path("runs/demo"), tmp_path / "cache" / "demo" / "sft-0123456789abcdef"
    (out / "data").mkdir(parents=True)
    configs = write_next_configs(out, "smollm2-135m", sft_spec("smollm2-135m", sft_dir, None))
    run = load_config(configs["position"])
    assert run.data.resolve() == (tmp_path / out / "data").resolve() and run.out.resolve() == (tmp_path / out / "position").resolve()
    assert run.models == {"pre": "smollm2-135m", "sft": str(sft_dir)} and run.protocol == "authors"
    assert list(run.templates) == list(DEMO_TEMPLATES)
    loc = load_localize_config(configs["localize"])
    assert loc.models == {"pre": "smollm2-135m", "sft": str(sft_dir)} and loc.data.resolve() == run.data.resolve()
    report = out / "run" / "report" / "report.html"
    lines = next_steps(out, "smollm2-135m", sft_dir, None, report, configs)
    text = "\n".join(lines)
    assert lines[1] == "next:"
    assert f"report    {report}" in text and f"finetune  {sft_dir}" in text and 'wg.load("demo")' in text
    assert "weightgraft run runs/demo/position.yaml" in text and "weightgraft localize runs/demo/localize.yaml" in text
    assert "weightgraft explore -m pre=demo:pre -m sft=demo --run runs/demo/run" in text
    assert 'pre, tok = wg.load("demo:pre"); sft, _ = wg.load("demo")' in text
    # another model's demo names its finetune by path ("demo" is the default demo's); a LoRA demo loads its adapter
    other = "\n".join(next_steps(Path("runs/demo-gemma3-270m"), "gemma3-270m", sft_dir, None, report, configs))
    assert f"-m pre=gemma3-270m -m sft={sft_dir}" in other and "demo:pre" not in other
    lora = "\n".join(next_steps(Path("runs/demo-lora"), "smollm2-135m", sft_dir, 8, report, configs))
    assert f'wg.load_peft(pre, "{sft_dir}")' in lora and "explore" not in lora


def test_the_readme_notebook_loads_what_the_demo_made():
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    first = "\n".join(text.splitlines()[:60])
    assert 'wg.load("demo")' in first and "models/sft" not in first
    assert "runs/demo/run/report/report.html" in first and "$WEIGHTGRAFT_CACHE/demo/sft-<hash>" in first


def test_a_random_models_refusal_says_what_makes_it_work():
    from weightgraft.models.errors import ModelLoadError
    from weightgraft.models.spec import refuse_random

    roles = {"pre": "random:llama-3.2-1b", "sft": "random:llama-3.2-1b@1"}
    for command in ("weightgraft run", "weightgraft localize"):
        with pytest.raises(ModelLoadError) as err:
            refuse_random(roles, command)
        assert "`tokenizer:`" in str(err.value) and "random models are for plans" not in str(err.value)
    with pytest.raises(ModelLoadError) as err:
        refuse_random(roles, "weightgraft explore")
    assert "a run or localize config can pair random models with a `tokenizer:`" in str(err.value)


def test_run_demo_records_its_models_and_prints_next(no_demo, tmp_path, tiny_model_dirs, monkeypatch):
    """The wiring at the demo's end (data, finetune and sweep stubbed): the record that
    ``wg.load("demo")`` reads, the configs to copy and the "next" block, printed last."""
    import shutil
    from types import SimpleNamespace

    import pandas as pd
    from rich.console import Console

    import weightgraft.experiments.runner
    import weightgraft.models
    import weightgraft.report
    import weightgraft.report.console
    import weightgraft.training
    from weightgraft.demo import run_demo

    monkeypatch.setattr(weightgraft.models, "ensure_converted", lambda name: None)
    monkeypatch.setattr(weightgraft.training, "finetune", lambda *a, out, **k: shutil.copytree(tiny_model_dirs["sft"], out))
    summary = pd.DataFrame(columns=["template", "scheme", "top5"])
    monkeypatch.setattr(weightgraft.experiments.runner, "run_experiment", lambda config, **k: SimpleNamespace(
        run_dir=Path(config.out), summary=summary, exclusions={"total": 0}))
    monkeypatch.setattr(weightgraft.report, "write_report", lambda run_dir: SimpleNamespace(html=run_dir / "report" / "report.html"))
    monkeypatch.setattr(weightgraft.report.console, "print_summary", lambda *a, **k: None)
    console = Console(record=True, width=250)
    result = run_demo(out=Path("runs/demo"), n_relations=4, console=console)
    printed = console.export_text()
    tail = printed[printed.index("\nnext:\n"):]
    assert "report    runs/demo/run/report/report.html" in tail and f"finetune  {result.sft_dir}" in tail
    assert "weightgraft explore -m pre=demo:pre -m sft=demo --run runs/demo/run" in tail
    assert resolve_demo_spec("demo") == str(result.sft_dir.resolve())
    assert read_demo_record().run == (tmp_path / "runs" / "demo" / "run").resolve()
    assert (tmp_path / "runs/demo/position.yaml").is_file() and (tmp_path / "runs/demo/localize.yaml").is_file()


def test_a_demo_sweep_of_an_older_rows_format_is_kept_aside_not_mixed(tmp_path) -> None:
    """``make demo`` after an upgrade: the old sweep (another rows format) is moved aside, kept
    whole, and the new sweep starts in an empty folder; a sweep of this format stays put."""
    import json

    from rich.console import Console

    from weightgraft.demo import _set_aside_older_rows
    from weightgraft.experiments.store import ROWS_FORMAT

    run = tmp_path / "run"
    run.mkdir()
    (run / "identity.json").write_text(json.dumps({"core": "0" * 16}))  # format 1 wrote no rows_format
    (run / "results.parquet").write_text("old rows")
    console = Console(record=True, width=200)
    _set_aside_older_rows(run, console)
    aside = tmp_path / "run.rows-format-1"
    assert not run.exists() and (aside / "results.parquet").read_text() == "old rows"
    assert f"kept in {aside}" in " ".join(console.export_text().split())
    run.mkdir()
    (run / "identity.json").write_text(json.dumps({"rows_format": ROWS_FORMAT}))
    _set_aside_older_rows(run, console)
    assert (run / "identity.json").is_file()


@pytest.mark.parametrize("lora, preset", [(None, "cpu-quick"), (8, "cpu-lora")])
def test_the_demo_trains_an_adapter_with_the_lora_recipe(no_demo, tmp_path, tiny_model_dirs, monkeypatch, lora, preset):
    """An adapter gets ``cpu-lora`` (cpu-quick's step leaves a rank-8 adapter at top-5 5% on the demo
    pair; cpu-lora reaches 100%, docs/big-models.md), a full finetune ``cpu-quick``; a given preset wins."""
    import shutil
    from types import SimpleNamespace

    import pandas as pd
    from rich.console import Console

    import weightgraft.experiments.runner
    import weightgraft.models
    import weightgraft.report
    import weightgraft.report.console
    import weightgraft.training
    from weightgraft.demo import run_demo
    from weightgraft.training import PRESETS

    used = []

    def finetune(*a, out, preset, **k):
        used.append(preset)
        shutil.copytree(tiny_model_dirs["sft"], out)

    monkeypatch.setattr(weightgraft.models, "ensure_converted", lambda name: None)
    monkeypatch.setattr(weightgraft.training, "finetune", finetune)
    summary = pd.DataFrame(columns=["template", "scheme", "top5"])
    monkeypatch.setattr(weightgraft.experiments.runner, "run_experiment", lambda config, **k: SimpleNamespace(
        run_dir=Path(config.out), summary=summary, exclusions={"total": 0}))
    monkeypatch.setattr(weightgraft.report, "write_report", lambda run_dir: SimpleNamespace(html=run_dir / "report" / "report.html"))
    monkeypatch.setattr(weightgraft.report.console, "print_summary", lambda *a, **k: None)
    run_demo(out=Path("runs/d1"), n_relations=4, console=Console(record=True), lora=lora)
    run_demo(out=Path("runs/d2"), n_relations=4, console=Console(record=True), lora=lora, preset="paper-aggressive")
    assert used == [preset, "paper-aggressive"]
    assert PRESETS["cpu-lora"].learning_rate > PRESETS["cpu-quick"].learning_rate


def test_the_moe_demo_upcycles_finetunes_and_ends_with_the_expert_map(no_demo, tmp_path, tiny_model_dirs, monkeypatch):
    """``weightgraft demo --experts 3``'s wiring (finetune and sweep stubbed, the upcycling and the
    expert map real on a tiny Llama): PRE is the upcycled model, and the map is written."""
    from types import SimpleNamespace

    import pandas as pd
    import transformers as T
    from rich.console import Console
    from tiny_models import make_donor

    import weightgraft.demo
    import weightgraft.experiments.runner
    import weightgraft.models
    import weightgraft.report
    import weightgraft.report.console
    import weightgraft.training
    from weightgraft.demo import run_demo
    from weightgraft.training.upcycle import Upcycling, upcycle_to_folder

    def upcycled(model, experts, top_k, seed):
        folder = tmp_path / "upcycled"
        upcycle_to_folder(str(tiny_model_dirs["pre"]), folder, Upcycling(experts=experts, top_k=top_k, seed=seed))
        return folder

    def finetune(base, *a, out, **k):
        assert base == str(tmp_path / "upcycled")  # the finetune starts from the upcycled model
        make_donor(T.AutoModelForCausalLM.from_pretrained(base), seed=1).save_pretrained(out)
        T.AutoTokenizer.from_pretrained(base).save_pretrained(out)

    seen = {}
    monkeypatch.setattr(weightgraft.models, "ensure_converted", lambda name: None)
    monkeypatch.setattr(weightgraft.demo, "upcycled_base", upcycled)
    # the tiny tokenizer reads characters: every answer starts with " ", so none has a fact contrast
    monkeypatch.setattr(weightgraft.demo, "EXPERT_MAP_METRIC", "first_logprob")
    monkeypatch.setattr(weightgraft.training, "finetune", finetune)
    monkeypatch.setattr(weightgraft.experiments.runner, "run_experiment", lambda config, **k: seen.update(models=config.models) or SimpleNamespace(
        run_dir=Path(config.out), summary=pd.DataFrame(columns=["template", "scheme", "top5"]), exclusions={"total": 0}))
    monkeypatch.setattr(weightgraft.report, "write_report", lambda run_dir: SimpleNamespace(html=run_dir / "report" / "report.html"))
    monkeypatch.setattr(weightgraft.report.console, "print_summary", lambda *a, **k: None)
    console = Console(record=True, width=250)
    result = run_demo(n_relations=4, console=console, experts=3)
    assert result.out == Path("runs/demo-moe3")
    assert str(seen["models"]["pre"]) == str(tmp_path / "upcycled")
    top = pd.read_csv(result.out / "experts" / "top_cells.csv")
    assert set(top["region"]) == {"first_entity", "last"} and top["expert"].between(0, 2).all()
    assert "expert map:" in console.export_text()
    with pytest.raises(weightgraft.demo.DemoError, match="drop --lora"):
        run_demo(experts=3, lora=8)
