"""Typed model specs (weightgraft.models.spec): every variant parsed once from its string and back,
malformed specs refused in one line, no spec string matched anywhere else in src/, and one
``load_role`` that returns one loaded type for folder, random, peft and low-rank specs."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_models import make_lora_adapter

from weightgraft.errors import WeightgraftError
from weightgraft.models.donors import LeanSlots, LoadSettings, load_role
from weightgraft.models.loaded import LoadedModel
from weightgraft.models.spec import (
    DemoSpec,
    EmbeddedSpec,
    FolderSpec,
    HubSpec,
    LowRankSpec,
    ModelSpecError,
    PeftError,
    PeftSpec,
    RandomSpec,
    parse_spec,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "weightgraft"
SPEC_MODULE = SRC / "models" / "spec"

ROUND_TRIP = {
    "./models/sft": FolderSpec("./models/sft"),
    "/abs/model.gguf": FolderSpec("/abs/model.gguf"),
    "tiny-llama:pre": FolderSpec("tiny-llama:pre"),  # not hub-id shaped: a path
    "HuggingFaceTB/SmolLM2-135M": HubSpec("HuggingFaceTB/SmolLM2-135M"),
    "smollm2-135m": EmbeddedSpec("smollm2-135m"),
    "SmolLM2-135M": EmbeddedSpec("smollm2-135m"),
    "random:llama-3.2-1b": RandomSpec("llama-3.2-1b"),
    "random:gpt2-xl@7": RandomSpec("gpt2-xl", 7),
    "random:/cfg/config.json@2": RandomSpec("/cfg/config.json", 2),
    "peft(pre, models/lora)": PeftSpec("pre", "models/lora"),
    " peft( pre , 'a dir' ) ": PeftSpec("pre", "a dir"),
    "lowrank(sft, k=8)": LowRankSpec("sft", 8),
    "lowrank( full , k=2, base=pre, vectors=pre )": LowRankSpec("full", 2, "pre", "pre"),
    "demo": DemoSpec("sft"),
    "demo:sft": DemoSpec("sft"),
    "demo:pre": DemoSpec("pre"),
}


@pytest.mark.parametrize("text", sorted(ROUND_TRIP))
def test_every_variant_parses_from_its_string_and_keeps_the_text(text: str) -> None:
    spec = parse_spec(text)
    assert spec == ROUND_TRIP[text] and type(spec) is type(ROUND_TRIP[text])
    assert spec.text == text  # what manifests and run identities record: the string as written
    assert parse_spec(spec.text) == spec and parse_spec(spec) is spec
    # a spec built in code writes itself in a form that parses back to it
    assert parse_spec(ROUND_TRIP[text].text) == ROUND_TRIP[text]


@pytest.mark.parametrize("text", ["", "   ", "peft(pre)", "peft(", "peft(pre, )", "peft(k=1, d)", "lowrank(sft)",
                                  "lowrank(sft, k=0)", "lowrank(k=2)", "lowrank(sft, k=2, colour=red)", "random:",
                                  "random:@3"])
def test_a_malformed_spec_is_one_line(text: str) -> None:
    with pytest.raises(ModelSpecError) as err:
        parse_spec(text)
    message = str(err.value)
    assert isinstance(err.value, WeightgraftError) and "\n" not in message and "pydantic" not in message
    assert ("peft(BASE_ROLE, ADAPTER_DIR)" in message) == text.startswith("peft")
    if text.startswith("peft"):
        assert isinstance(err.value, PeftError)  # the older class still catches it


def test_a_config_refuses_a_malformed_spec_naming_its_field(tmp_path: Path) -> None:
    from tiny_world import write_world

    from weightgraft.experiments.config import parse_config
    from weightgraft.localization.config import parse_localize_config

    data = write_world(tmp_path / "data")
    raw = {"data": str(data), "models": {"pre": "tiny-llama:pre", "sft": "lowrank(pre, k=0)"},
           "schemes": [{"preset": "position"}]}
    with pytest.raises(ModelSpecError, match=r"at models\.sft: model spec 'lowrank\(pre, k=0\)'") as err:
        parse_config(raw)
    assert "\n" not in str(err.value) and "errors.pydantic.dev" not in str(err.value)
    with pytest.raises(ModelSpecError, match=r"models\.nulls\.1: model spec 'peft\(pre\)'") as err:
        parse_localize_config({"data": str(data), "models": {"pre": "a", "sft": "b", "nulls": ["c", "peft(pre)"]}})
    assert "\n" not in str(err.value) and "errors.pydantic.dev" not in str(err.value)
    config = parse_config({**raw, "models": {"pre": "tiny-llama:pre", "sft": "lowrank(pre, k=2)"}})
    assert config.models == {"pre": "tiny-llama:pre", "sft": "lowrank(pre, k=2)"}  # the YAML's strings, kept
    assert config.spec_sets() == {"default": {"pre": FolderSpec("tiny-llama:pre"), "sft": LowRankSpec("pre", 2)}}


# What reading a spec string looks like: a regex or a prefix test naming a spec form, or a
# membership test in the tables of names. Only weightgraft/models/spec.py may do it.
_SPEC_WORDS = ("peft(", "peft\\s*\\(", "lowrank", "random:", "demo", "[a-za-z0-9][\\w")  # the last: a hub id
_TABLES = {"EMBEDDED_MODELS", "DEMO_SPECS"}


def _spec_inspections(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            consts = [c.value.lower() for arg in node.args for c in ast.walk(arg)
                      if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            regex = owner == "re" and name in ("match", "fullmatch", "search", "compile", "findall", "sub")
            prefix = name in ("startswith", "removeprefix", "partition")
            if (regex or prefix) and any(w in c for c in consts for w in _SPEC_WORDS):
                found.append((node.lineno, f"{owner + '.' if owner else ''}{name}({consts})"))
            if name == "get" and isinstance(func, ast.Attribute) and getattr(func.value, "id", "") in _TABLES:
                found.append((node.lineno, f"{func.value.id}.get(...)"))  # type: ignore[attr-defined]
        elif isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, ast.Name) and right.id in _TABLES:
                    found.append((node.lineno, f"... in {right.id}"))
    return found


def test_no_spec_string_is_read_outside_the_spec_parser() -> None:
    owners = {*SPEC_MODULE.glob("*.py"), SRC / "models" / "embedded.py"}  # embedded.py owns its table of names
    hits = []
    for path in sorted(SRC.rglob("*.py")):
        if path in owners:
            continue
        for line, what in _spec_inspections(ast.parse(path.read_text(encoding="utf-8"))):
            hits.append(f"{path.relative_to(SRC.parent)}:{line}: {what}")
    assert hits == [], "model spec strings read outside weightgraft/models/spec/:\n" + "\n".join(hits)


def test_the_guard_sees_what_it_guards_against() -> None:
    planted = ast.parse('import re\n_SPEC = re.compile(r"^\\s*peft\\s*\\(")\nif s.lstrip().startswith("lowrank("): pass\n'
                        'if s.lower() in EMBEDDED_MODELS: pass\nm = re.match(r"^[A-Za-z0-9][\\w.-]*$", s)\n')
    assert [line for line, _ in _spec_inspections(planted)] == [2, 3, 4, 5]
    assert len(_spec_inspections(ast.parse((SPEC_MODULE / "parse.py").read_text(encoding="utf-8")))) >= 4  # the parser itself


def _tiny_random_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 32,
                                "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                                "max_position_embeddings": 64, "tie_word_embeddings": False}))
    return path


def test_load_role_gives_one_type_for_every_spec(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> None:
    settings = LoadSettings()
    roles = {"pre": str(tiny_model_dirs["pre"]), "sft": str(tiny_model_dirs["sft"])}
    pre = load_role(parse_spec(roles["pre"]), settings)
    assert type(pre) is LoadedModel and isinstance(pre.spec, FolderSpec) and pre.source.startswith("dir:")
    assert pre.adapter is None and not pre.lean and pre.tokenizer is not None

    rand = load_role(parse_spec(f"random:{_tiny_random_config(tmp_path)}@1"), settings)
    assert type(rand) is LoadedModel and isinstance(rand.spec, RandomSpec) and rand.tokenizer is None

    adapter, merged = make_lora_adapter(pre.model, ["q_proj"], tmp_path / "lora")
    roles["lora"] = f"peft(pre, {adapter})"
    lora = load_role(parse_spec(roles["lora"]), settings, roles=roles, loaded={"pre": pre})
    assert type(lora) is LoadedModel and isinstance(lora.spec, PeftSpec) and lora.adapter is not None
    assert lora.tokenizer is pre.tokenizer and lora.source.startswith("peft:")
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        torch.testing.assert_close(lora.model(ids).logits, merged(ids).logits.to(lora.model.dtype), rtol=1e-4, atol=1e-4)

    roles["low"], roles["full"] = "lowrank(sft, k=2)", "lowrank(sft, k=1000)"
    low = load_role(roles["low"], settings, roles=roles, loaded={"pre": pre})
    full = load_role(roles["full"], settings, roles=roles, loaded={"pre": pre})
    assert type(low) is LoadedModel and isinstance(low.spec, LowRankSpec) and low.spec.k == 2
    assert sum(key[0] == "lowrank" for key in settings.cache) == 1  # one SVD for every k
    sft = load_role(roles["sft"], settings)
    assert all(torch.equal(a, b) for a, b in zip(full.model.parameters(), sft.model.parameters()))  # full rank: the donor
    assert not all(torch.equal(a, b) for a, b in zip(low.model.parameters(), sft.model.parameters()))

    from weightgraft.engine.forward import slots

    served = {next(n for n in slots(pre.model) if n.startswith("layers.0."))}
    lean = load_role(roles["sft"], LoadSettings(lean_donors=True), lean=LeanSlots(pre, served))
    assert type(lean) is LoadedModel and lean.lean and lean.source.startswith("dir:")

    with pytest.raises(ModelSpecError, match="'pre', which is not given"):
        load_role("peft(pre, somewhere)", settings)


def test_a_custom_loader_result_becomes_the_one_type() -> None:
    model = torch.nn.Linear(2, 2)
    settings = LoadSettings(loader=lambda text: SimpleNamespace(model=model, tokenizer="tok", source=text,
                                                                weights_sha256="h"))
    got = load_role("tiny-llama:sft", settings)
    assert type(got) is LoadedModel and got.model is model and got.source == "tiny-llama:sft"
    assert got.spec == FolderSpec("tiny-llama:sft") and got.weights_sha256 == "h"
