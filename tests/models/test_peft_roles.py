"""LoRA donors as roles (``peft(BASE_ROLE, ADAPTER_DIR)``) in a run, ``localize``, ``generate``
and the memory plan: each equals the merged model where it computes, names its adapter, and
refuses a bad spec in one line before any model loads."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.utils import load_peft_weights
from tiny_models import make_lora_adapter, make_tiny
from tiny_world import loader, write_world

import weightgraft as wg
from weightgraft.models import weights_sha256
from weightgraft.models.spec import PeftError, PeftSpec, check_roles, parse_peft


def _world_adapter(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    """An adapter of the runner's tiny base (``tiny-llama:pre``, float32)."""
    return make_lora_adapter(loader("tiny-llama:pre").model, ["q_proj", "v_proj", "down_proj"],
                             tmp_path / "adapters" / "lora")


def test_a_config_run_with_a_peft_role_equals_the_merged_model_and_names_the_adapter(tmp_path):
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    path, merged = _world_adapter(tmp_path)
    data = write_world(tmp_path / "data")

    def load(spec, config=None):
        if spec == "merged":
            return SimpleNamespace(model=merged, tokenizer=loader("tiny-llama:pre").tokenizer, source="merged",
                                   weights_sha256="sha-merged")
        return loader(spec, config)

    runs = {}
    for name, sft in (("lora", f"peft(pre, {path})"), ("merged", "merged")):
        raw = {"name": name, "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": sft},
               "schemes": [{"preset": "position", "only": ["PRE", "SFT", "LT", "FE"]}],
               "out": str(tmp_path / name)}
        runs[name] = run_experiment(parse_config(raw), load=load, progress=False)
    a, b = (runs[k].results.set_index(["template", "scheme", "example_id"]).sort_index() for k in ("lora", "merged"))
    assert (a["answer_logprob"] - b["answer_logprob"]).abs().max() <= 1e-4  # float32 models
    assert (a.xs("SFT", level="scheme")["answer_logprob"] - a.xs("PRE", level="scheme")["answer_logprob"]).abs().max() > 1e-3
    manifest = json.loads((runs["lora"].run_dir / "manifest.json").read_text())
    entry = manifest["models"]["default"]["sft"]
    adapter = entry["adapter"]
    assert adapter["path"] == str(path.resolve())
    assert adapter["sha256"] == weights_sha256(load_peft_weights(str(path)))
    assert adapter["rank"] == 4 and adapter["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    assert adapter["slots_touched"] == [f"layers.{i}.{c}" for i in range(2) for c in ("q", "v", "down")]
    assert "'pre'" in adapter["untouched_slots_served_by"]
    stored = load_peft_weights(str(path))
    assert entry["bytes_held"] == adapter["bytes_held"] == sum(t.numel() * t.element_size() for t in stored.values())
    assert entry["source"].startswith(f"peft:{path.resolve()} over ")
    assert (adapter["base_source"], adapter["base_weights_sha256"]) == ("tiny-llama:pre", "sha-tiny-llama:pre")


def test_bad_peft_specs_are_one_line_errors_before_any_model_loads(tmp_path):
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    assert parse_peft("tiny-llama:pre") is None
    assert parse_peft(" peft( pre , models/lora ) ") == PeftSpec("pre", "models/lora")
    assert parse_peft("peft(pre, 'a dir')") == PeftSpec("pre", "a dir")
    assert parse_peft("peft_models/sft") is None and parse_peft("peft") is None  # a directory may be named so
    for bad in ("peft(pre)", "peft(, d)", "peft(base=pre, d)", "peft(pre, d"):
        with pytest.raises(PeftError, match="peft\\(BASE_ROLE, ADAPTER_DIR\\)"):
            parse_peft(bad)
    good, _ = _world_adapter(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    dora = tmp_path / "dora"
    dora.mkdir()
    (dora / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "use_dora": True}))
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    (prefix / "adapter_config.json").write_text(json.dumps({"peft_type": "PREFIX_TUNING"}))
    biased = tmp_path / "biased"
    biased.mkdir()
    (biased / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "bias": "all"}))
    cases = {
        f"peft(base, {good})": "refers to role 'base'",
        f"peft(pre, {tmp_path / 'missing'})": "does not exist",
        f"peft(pre, {empty})": "no adapter_config.json",
        f"peft(pre, {dora})": "use_dora",
        f"peft(pre, {prefix})": "only LoRA adapters",
        f"peft(pre, {biased})": "bias='all'",
        "peft(pre)": "peft\\(BASE_ROLE, ADAPTER_DIR\\)",
    }
    data = write_world(tmp_path / "data")

    def no_load(spec, config=None):
        raise AssertionError(f"a model was loaded ({spec}) before the spec was checked")

    for spec, message in cases.items():
        with pytest.raises(PeftError, match=message) as err:
            check_roles({"pre": "tiny-llama:pre", "sft": spec}, "model set 'x'")
        assert "\n" not in str(err.value)
        raw = {"name": "bad", "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": spec},
               "schemes": [{"preset": "position", "only": ["PRE", "SFT"]}], "out": str(tmp_path / "bad")}
        with pytest.raises(PeftError, match=message) as err:
            run_experiment(parse_config(raw), load=no_load, progress=False)
        assert "\n" not in str(err.value)
    with pytest.raises(PeftError, match="derived role"):
        check_roles({"pre": "tiny-llama:pre", "low": "lowrank(pre, k=2)", "sft": f"peft(low, {good})"}, "x")
    with pytest.raises(PeftError, match="a peft role"):
        check_roles({"pre": "tiny-llama:pre", "sft": f"peft(pre, {good})", "low": "lowrank(sft, k=2)"}, "x")
    # load_peft itself: an adapter of another shape is one line, and the base is left as it was
    base = make_tiny("llama", seed=0, vocab_size=40)
    other, _ = make_lora_adapter(make_tiny("gpt_neox", seed=0), ["query_key_value"], tmp_path / "neox")
    # an adapter that saved its own lm_head (peft does for an lm_head target) of another base:
    # loading it would write into the base's shared tensor
    foreign, _ = make_lora_adapter(make_tiny("llama", seed=7, vocab_size=40), ["q_proj", "lm_head"], tmp_path / "foreign")
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    for directory, message in ((tmp_path / "missing", "does not exist"), (other, "does not fit"),
                               (foreign, "saves its own 'lm_head.weight', which differs from the base's")):
        with pytest.raises(PeftError, match=message) as err:
            wg.load_peft(base, directory)
        assert "\n" not in str(err.value)
    assert all(torch.equal(p, before[n]) for n, p in base.named_parameters())
    assert [n for n, _ in base.named_parameters()] == list(before)
    # LoRA the engine does not reproduce: on an embedding (load_peft), DoRA (a peft model given as is)
    embed, _ = make_lora_adapter(base, ["embed_tokens", "q_proj"], tmp_path / "embed")
    with pytest.raises(ValueError, match="only LoRA on Linear / Conv1D projections") as err:
        wg.load_peft(base, embed)
    assert "\n" not in str(err.value)
    dora = get_peft_model(copy.deepcopy(base), LoraConfig(r=2, target_modules=["q_proj"], use_dora=True)).base_model.model
    ids = torch.randint(3, 64, (3, 7), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="DoRA"):
        wg.graft_forward([base, dora], ids, torch.ones(*ids.shape, len(wg.slots(base)), dtype=torch.long))
    assert all(torch.equal(p, before[n]) for n, p in base.named_parameters())


@pytest.mark.slow
def test_localize_takes_a_peft_donor(tmp_path):
    from weightgraft.api.localize import localize
    from weightgraft.localization.config import parse_localize_config

    path, merged = _world_adapter(tmp_path)
    data = write_world(tmp_path / "data", n=2)

    def load(spec, dtype=None):
        if spec == "merged":
            return SimpleNamespace(model=merged, tokenizer=loader("tiny-llama:pre").tokenizer)
        return loader(spec)

    cells = {}
    for name, sft in (("lora", f"peft(pre, {path})"), ("merged", "merged")):
        raw = {"name": name, "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": sft},
               "out": str(tmp_path / "runs" / name), "exact": 1, "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"enabled": False}, "report": False}
        result = localize(parse_localize_config(raw), progress=False, load=load)
        cells[name] = result.cells.sort_values(["example_id", "direction", "position", "slot"]).reset_index(drop=True)
    for col in ("estimate", "exact"):
        diff = (cells["lora"][col] - cells["merged"][col]).abs()
        assert diff.max() <= 1e-4, col  # float32 models
    manifest = json.loads((tmp_path / "runs" / "lora" / "manifest.json").read_text())
    assert manifest["adapter"]["path"] == str(path.resolve())
    bad = parse_localize_config({"name": "x", "data": str(data), "out": str(tmp_path / "runs"),
                                 "models": {"pre": "tiny-llama:pre", "sft": f"peft(pre, {tmp_path / 'nope'})"},
                                 "claims": {"enabled": False}})
    with pytest.raises(PeftError, match="does not exist"):
        localize(bad, progress=False, load=lambda *a: pytest.fail("loaded a model"))


@pytest.mark.slow
def test_a_localize_manifest_names_a_lora_donors_adapter_and_base_by_source_and_hash(tmp_path):
    """The LoRA role's entry is not blank: the donor's source and hash, its adapter's (the directory,
    the hash of the adapter's safetensors tensors) and its base's, all distinct; a changed adapter
    changes its hash and the donor's, not the base's."""
    from safetensors.torch import load_file, save_file

    from weightgraft.api.localize import localize
    from weightgraft.localization.config import parse_localize_config

    path = tmp_path / "lora"
    base = copy.deepcopy(loader("tiny-llama:pre").model)
    torch.manual_seed(0)
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "down_proj"], init_lora_weights=False)).save_pretrained(path)
    data = write_world(tmp_path / "data", n=2)

    def run(name: str) -> dict:
        raw = {"name": name, "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": f"peft(pre, {path})"},
               "out": str(tmp_path / "runs" / name), "exact": "none", "claims": {"enabled": False},
               "search": {"enabled": False}, "report": False}
        localize(parse_localize_config(raw), progress=False, load=loader)
        return json.loads((tmp_path / "runs" / name / "manifest.json").read_text())["models"]["sft"]

    file = path / "adapter_model.safetensors"
    first = run("a")
    assert first["adapter"] == {"source": str(path.resolve()), "weights_sha256": weights_sha256(load_file(str(file)))}
    assert first["base"] == {"source": "tiny-llama:pre", "weights_sha256": "sha-tiny-llama:pre"}
    sources = [first["source"], first["adapter"]["source"], first["base"]["source"]]
    hashes = [first["weights_sha256"], first["adapter"]["weights_sha256"], first["base"]["weights_sha256"]]
    assert all(sources) and all(hashes) and len(set(sources)) == len(set(hashes)) == 3
    tensors = load_file(str(file))
    key = next(k for k in sorted(tensors) if "lora_B" in k)
    tensors[key] = tensors[key] * 2
    save_file(tensors, str(file), metadata={"format": "pt"})
    second = run("b")
    assert second["adapter"]["weights_sha256"] == weights_sha256(load_file(str(file)))
    assert second["adapter"]["weights_sha256"] != first["adapter"]["weights_sha256"]
    assert second["weights_sha256"] != first["weights_sha256"] and second["base"] == first["base"]


def test_generate_command_takes_a_peft_role(tmp_path):
    from typer.testing import CliRunner

    from weightgraft.api.generate import generate
    from weightgraft.cli import app
    from weightgraft.models import load_model

    tok = loader("tiny-llama:pre").tokenizer
    base = make_tiny("llama", seed=0, vocab_size=len(tok))
    base.save_pretrained(tmp_path / "pre")
    tok.save_pretrained(tmp_path / "pre")
    pre = load_model(tmp_path / "pre").model
    path, _ = make_lora_adapter(pre, ["q_proj", "down_proj"], tmp_path / "lora")
    prompt = "Keanu Reeves starred in a movie with"
    args = ["generate", prompt, "-m", f"pre={tmp_path / 'pre'}", "-m", f"sft=peft(pre, {path})",
            "-r", "model=sft,positions=last", "-n", "4"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    expected = generate([pre, wg.load_peft(pre, path)], tok, prompt, [wg.Rule(model="sft", positions="last")], max_new_tokens=4)
    assert out.stdout.strip().splitlines()[-1] == f"graft: {prompt}{expected}"
    bad = CliRunner().invoke(app, args[:4] + ["-m", f"sft=peft(pre, {tmp_path / 'nope'})"] + args[6:])
    assert bad.exit_code != 0 and "does not exist" in str(bad.exception)


def test_a_relative_adapter_dir_in_a_config_file_is_taken_from_its_folder(tmp_path, monkeypatch):
    from weightgraft.experiments.config import load_config

    path, _ = _world_adapter(tmp_path)  # tmp_path/adapters/lora
    data = write_world(tmp_path / "data")
    config = tmp_path / "exp.yaml"
    config.write_text(f"name: rel\ndata: {data}\nmodels: {{pre: tiny-llama:pre, sft: 'peft(pre, adapters/lora)'}}\n"
                      "schemes: [{preset: position, only: [PRE, SFT]}]\n")
    monkeypatch.chdir(tmp_path / "data")  # anywhere else
    cfg = load_config(config)
    assert parse_peft(cfg.models["sft"]) == PeftSpec("pre", str(tmp_path / "adapters" / "lora"))
    check_roles(cfg.models, "models")
    assert load_config(config, ["models.sft=peft(pre, elsewhere)"]).models["sft"] == "peft(pre, elsewhere)"


def test_memory_plans_count_a_lora_role_as_its_adapter(tmp_path):
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.plan import plan_experiment
    from weightgraft.localization.config import parse_localize_config
    from weightgraft.localization.run import plan_input
    from weightgraft.planning.localize import plan_localize_work

    tok = loader("tiny-llama:pre").tokenizer
    base = make_tiny("llama", seed=0, vocab_size=len(tok))
    base.save_pretrained(tmp_path / "pre")
    tok.save_pretrained(tmp_path / "pre")
    path, _ = make_lora_adapter(base, ["q_proj", "v_proj"], tmp_path / "lora")
    stored = {k: t for k, t in load_peft_weights(str(path)).items() if "lora_" in k}
    adapter = sum(t.numel() * 4 for t in stored.values())  # float32
    data = write_world(tmp_path / "data")
    models = {"pre": str(tmp_path / "pre"), "sft": f"peft(pre, {path})"}
    run = plan_experiment(parse_config({"name": "p", "data": str(data), "models": models,
                                        "schemes": [{"preset": "position"}]}), with_time=False)
    roles = {r.role: r for r in run.roles}
    assert roles["sft"].held_bytes == adapter and "LoRA" in roles["sft"].holds
    assert roles["pre"].held_bytes >= sum(p.numel() * 4 for p in base.parameters())
    loc = plan_localize_work(plan_input(parse_localize_config({"name": "l", "data": str(data), "models": models})),
                             with_time=False)
    roles = {r.role: r for r in loc.roles}
    assert roles["sft"].held_bytes == adapter
