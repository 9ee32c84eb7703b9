"""``random:NAME`` models: a real architecture with seeded random weights, nothing downloaded.

Why: to size a sweep (memory, time) or check the engine on the paper's models (Llama-3.2-1B,
Gemma-1.1-2B, GPT-2 XL, Pythia-2.8B) and 7-8B models on a machine that has none of them.

A spec is ``random:NAME``, ``random:NAME@SEED`` or ``random:PATH/config.json[@SEED]`` (seed 0
by default). ``NAME`` is one of the configs shipped in ``weightgraft/models/configs/``
(:func:`shipped_configs`: the public ``config.json`` numbers of each model). The same spec and
dtype always give the same weights: every tensor is drawn from its own generator, seeded by the
spec's seed and the tensor's name, so a lean donor (only some tensors) equals the full one.

Weights: matrices and biases uniform with the config's ``initializer_range`` as standard
deviation; norm weights their identity value (1, or 0 for Gemma's ``1 + w`` norms) plus
uniform noise of 0.05. The model is built without transformers' initialisation (measured:
14 s for 0.4B parameters on one core) and filled in place, one thread per tensor: 0.5-1.3 s per
100M parameters on one core of a busy 2-core machine (Llama-3.2-1B in bfloat16: ~20 s).

There is no tokenizer: ``LoadedModel.tokenizer`` is None, and commands that tokenize text
(``run``, ``localize``, ``generate``) refuse a random model in one line before loading any model
(:func:`weightgraft.models.spec.refuse_random`). ``weightgraft plan`` and ``weightgraft check`` (on random token ids) take
them. ``weights_sha256`` hashes what determines the weights (config, seed, dtype, fill version),
not the bytes: hashing 8B parameters would take longer than drawing them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightgraft.models.errors import ModelLoadError, ModelNotFoundError
from weightgraft.models.loaded import LoadedModel
from weightgraft.resume.manifests import Json

PREFIX = "random:"
CONFIG_DIR = Path(__file__).with_name("configs")  # the shipped configs of random:NAME
FILL_VERSION = 1  # bump when the way weights are drawn changes (it is part of the hash)
NORM_NOISE = 0.05


def shipped_configs() -> list[str]:
    """Names ``random:NAME`` accepts: the configs shipped with weightgraft (``models/configs``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def split_random(text: str) -> tuple[str, int]:
    """``(target, seed)`` of ``random:TARGET[@SEED]`` (the text read once, here); an empty target
    is one error line naming the shipped configs."""
    body, seed = text.strip()[len(PREFIX):], 0
    head, sep, tail = body.rpartition("@")
    if sep and tail.strip().isdigit():
        body, seed = head, int(tail)
    if not body.strip():
        raise ValueError(f"{text.strip()!r}: say which config, e.g. random:llama-3.2-1b "
                         f"(shipped: {', '.join(shipped_configs())}) or random:PATH/config.json")
    return body.strip(), seed


def shipped_config_path(name: str) -> Path | None:
    """The shipped ``config.json`` of ``name`` (case-insensitive), or None."""
    path = CONFIG_DIR / f"{name.strip().lower()}.json"
    return path if path.is_file() else None


@dataclass(frozen=True)
class RandomModel:
    """A ``random:`` spec resolved: which config file, and the seed of the weights."""

    text: str
    config_path: Path
    seed: int

    @property
    def name(self) -> str:
        return self.config_path.stem if self.config_path.parent == CONFIG_DIR else str(self.config_path)

    def config_dict(self) -> Json:
        try:
            data = json.loads(self.config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{self.text}: cannot read {self.config_path} as JSON ({exc})") from exc
        if not isinstance(data, dict) or "model_type" not in data:
            raise ModelLoadError(f"{self.text}: {self.config_path} has no 'model_type'; is it a config.json?")
        return data


RandomText = Any  # a ``random:`` spec's text, its typed spec (``.target``, ``.seed``, ``.text``) or a RandomModel


def parse_random_spec(spec: RandomText) -> RandomModel:
    """``random:NAME[@SEED]`` or ``random:PATH/config.json[@SEED]`` resolved to its config file; an
    unknown name or a missing file is one error line naming what exists."""
    if isinstance(spec, RandomModel):
        return spec
    if isinstance(spec, str):
        if not spec.strip().lower().startswith(PREFIX):
            raise ModelNotFoundError(f"{spec.strip()!r} is no random model spec (random:NAME[@SEED])")
        try:
            body, seed = split_random(spec)
        except ValueError as exc:
            raise ModelNotFoundError(str(exc)) from None
        text = spec.strip()
    else:
        body, seed, text = spec.target, spec.seed, spec.text.strip()
    shipped = shipped_config_path(body)
    if shipped is not None:
        return RandomModel(text, shipped, seed)
    path = Path(body).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return RandomModel(text, path.resolve(), seed)
    raise ModelNotFoundError(
        f"{text!r}: {body!r} is neither a shipped config ({', '.join(shipped_configs())}) nor an "
        "existing config.json file (random:PATH/config.json)"
    )


def special_floats(data: Any) -> Any:
    """``data`` with transformers' JSON stand-ins for infinities and NaN (``{"__float__":
    "Infinity"}``, which ``save_pretrained`` writes: Nemotron-H's ``time_step_limit``) as floats, as
    ``from_pretrained`` reads them; ``from_dict`` alone would refuse the config."""
    if isinstance(data, dict):
        if set(data) == {"__float__"} and data["__float__"] in ("Infinity", "-Infinity", "NaN"):
            return float({"Infinity": "inf", "-Infinity": "-inf", "NaN": "nan"}[data["__float__"]])
        return {k: special_floats(v) for k, v in data.items()}
    if isinstance(data, list):
        return [special_floats(v) for v in data]
    return data


def random_config(spec: RandomText) -> Any:
    """The transformers config of a random spec (no weights)."""
    from transformers import CONFIG_MAPPING

    parsed = parse_random_spec(spec)
    data = special_floats(parsed.config_dict())
    try:
        return CONFIG_MAPPING[data["model_type"]].from_dict(data)
    except KeyError as exc:
        raise ModelLoadError(f"{parsed.text}: transformers knows no model_type {data['model_type']!r}") from exc


def _generator_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\0{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def _identity_value(module: Any) -> float:
    """1 for a norm that scales by ``w``, 0 for one that scales by ``1 + w`` (Gemma): probed with
    the weight at 0 on a small input."""
    import torch

    weight = module.weight
    own = [p for p in module.parameters(recurse=False)]
    saved = [p.detach().clone() for p in own]
    try:
        with torch.no_grad():
            for p in own:  # weight and bias at 0: only a "1 + w" norm still passes its input on
                p.zero_()
            probe = torch.linspace(-1, 1, weight.shape[0], dtype=torch.float32).to(weight.dtype)[None]
            out = module(probe)
        return 0.0 if bool(out.abs().sum() > 0) else 1.0
    except (RuntimeError, TypeError, ValueError):  # a module that cannot take the probe: taken as "1 + w"
        return 1.0
    finally:
        with torch.no_grad():
            for p, value in zip(own, saved):
                p.copy_(value)


def fill_tensor(tensor: Any, name: str, seed: int, std: float, identity: float | None) -> None:
    """Draw ``tensor`` in place from its own generator (seed, name): the same tensor of the same
    spec always gets the same values, whatever else is drawn."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(_generator_seed(seed, name))
    with torch.no_grad():
        if identity is None:  # matrices, biases: uniform with standard deviation std
            bound = std * 3**0.5
            target = tensor if tensor.device.type == "cpu" else torch.empty(tensor.shape, dtype=tensor.dtype)
            target.uniform_(-bound, bound, generator=gen)
        else:
            target = torch.empty(tensor.shape, dtype=tensor.dtype).uniform_(-NORM_NOISE, NORM_NOISE, generator=gen)
            target.add_(identity)
        if target is not tensor:
            tensor.copy_(target)


def _norm_identities(model: Any) -> dict[str, float]:
    """Parameter name -> identity value, for the weights of norm modules (1-D, no bias name)."""
    out: dict[str, float] = {}
    for path, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is None or weight.dim() != 1 or "norm" not in type(module).__name__.lower():
            continue
        out[f"{path}.weight" if path else "weight"] = _identity_value(module)
    return out


def weights_digest(parsed: RandomModel, dtype: Any) -> str:
    """What determines a random model's weights, hashed: config, seed, dtype, fill version."""
    payload = json.dumps({"config": parsed.config_dict(), "seed": parsed.seed,
                          "dtype": str(dtype).removeprefix("torch."), "fill": FILL_VERSION}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def _skeleton(config: Any, dtype: Any) -> Any:
    """The model with uninitialised parameters (buffers such as rotary tables computed); of a
    vision-language config, what loading its checkpoint builds (its language model alone, or whole)."""
    from transformers.initialization import no_init_weights

    from weightgraft.engine.architectures.vision_language import CHECKPOINT_ATTR, Checkpoint
    from weightgraft.models.vision_language import load_form

    form = load_form(config)
    with no_init_weights():
        model = form.auto_class().from_config(form.config, dtype=dtype)
    if form.language_model_only:  # as a load of such a checkpoint records it (no tower drawn: no digest)
        setattr(model, CHECKPOINT_ATTR, Checkpoint(str(config.model_type), None, form.media_tokens))
    model.tie_weights()
    return model


def build_random_model(spec: RandomText, dtype: Any = None, only: Iterable[str] | None = None) -> tuple[Any, str]:
    """``(model, weights_digest)`` of a random spec, on the CPU, in eval mode; with ``only``
    (parameter names) just those tensors are drawn (the others stay uninitialised: for lean
    donors, which share them from the base)."""
    import torch

    dtype = dtype or torch.float32
    parsed = parse_random_spec(spec)
    config = random_config(parsed)
    model = _skeleton(config, dtype)
    std = float(getattr(config, "initializer_range", 0.02) or 0.02)
    norms = _norm_identities(model)
    wanted = set(only) if only is not None else None
    todo = [(name, param) for name, param in model.named_parameters()  # tied: once, first name
            if wanted is None or name in wanted]
    # one generator per tensor, so tensors can be drawn on several threads (uniform_ releases
    # the GIL) and the values do not depend on the thread count
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(8, torch.get_num_threads()))) as pool:
        list(pool.map(lambda item: fill_tensor(item[1].data, item[0], parsed.seed, std, norms.get(item[0])),
                      sorted(todo, key=lambda item: -item[1].numel())))
    for param in model.parameters():
        param.requires_grad_(False)
    return model.eval(), weights_digest(parsed, dtype)


def load_random(spec: RandomText, *, device: Any = "cpu", dtype: Any = None, device_map: Any = None,
                quantization: Any = None, typed: Any = None) -> Any:
    """:func:`weightgraft.models.load_model` for ``random:`` specs (tokenizer None); with a
    transformers ``quantization`` config, the random model quantized on ``device_map``."""
    import torch

    from weightgraft.engine.precision import batch_invariant_attention
    from weightgraft.models.hashing import weights_sha256
    from weightgraft.models.quantization.load import quantize_in_memory
    from weightgraft.models.vision_language import load_note

    if device_map is not None and quantization is None:
        raise ModelLoadError(f"{parse_random_spec(spec).text}: device_map is not available for random models; build it on one device")
    dtype = dtype or torch.float32
    model, digest = build_random_model(spec, dtype)
    parsed = parse_random_spec(spec)
    source = f"random:{parsed.name} (seed {parsed.seed}, {str(dtype).removeprefix('torch.')}, {parsed.config_path})"
    note = load_note(model)
    if note is not None:
        source += f" ({note})"
    if quantization is not None:
        model = quantize_in_memory(model, quantization, dtype, device_map)
        digest = weights_sha256(model)
    batch_invariant_attention([model])
    if quantization is None:
        model.to(device)
    return LoadedModel(model=model, tokenizer=None, source=source, weights_sha256=digest, spec=typed)


def lean_random_donor(spec: RandomText, base: Any, needed: Iterable[str], typed: Any = None) -> Any:
    """A random donor holding only the ``needed`` parameters (drawn exactly as in the full
    donor), sharing every other tensor with ``base`` (a LoadedModel)."""
    from weightgraft.models.lean import donor_view

    ref = next(base.model.parameters())
    parsed = parse_random_spec(spec)
    config = random_config(parsed)
    std = float(getattr(config, "initializer_range", 0.02) or 0.02)
    norms = _norm_identities(base.model)
    params = dict(base.model.named_parameters(remove_duplicate=False))
    first_name = {}
    for name, p in base.model.named_parameters():
        first_name[id(p)] = name
    tensors = {}
    drawn: dict[int, Any] = {}
    import torch

    for name in sorted(set(needed)):
        p = params[name]
        key = id(p)
        if key not in drawn:  # a tied pair is one tensor, drawn under its first name
            t = torch.empty(p.shape, dtype=ref.dtype)
            canonical = first_name.get(key, name)
            fill_tensor(t, canonical, parsed.seed, std, norms.get(canonical))
            drawn[key] = t.to(p.device)
        tensors[name] = drawn[key]
    view = donor_view(base.model, tensors, config)
    return LoadedModel(model=view, tokenizer=None,
                       source=f"random:{parsed.name} (seed {parsed.seed}, lean)",
                       weights_sha256=weights_digest(parsed, ref.dtype), spec=typed, lean=True)


def random_token_batch(vocab_size: int, rows: int, seed: int = 0, device: Any = "cpu",
                       lengths: tuple[int, int] = (6, 14)) -> tuple[Any, Any]:
    """``(input_ids, attention_mask)``: ``rows`` left-padded rows of seeded random token ids
    of lengths in ``lengths`` (random models have no tokenizer to encode text)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lengths[0], lengths[1] + 1, (rows,), generator=gen).tolist()
    seq = max(sizes)
    ids = torch.zeros(rows, seq, dtype=torch.long)
    mask = torch.zeros(rows, seq, dtype=torch.long)
    for r, n in enumerate(sizes):
        ids[r, seq - n:] = torch.randint(1, vocab_size, (n,), generator=gen)
        mask[r, seq - n:] = 1
    return ids.to(device), mask.to(device)
