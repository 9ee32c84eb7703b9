"""This device's grafting throughput, measured once on a small random model and cached.

Why: ``weightgraft plan`` predicts wall time from FLOPs; the FLOPs per second the engine
reaches depend on the device, the torch build, the dtype and the thread count, so they are
measured (a few seconds) and cached under ``<cache_root>/plan/calibration.json``, keyed by
all four. A batch is predicted to take ``module_calls * seconds_per_call + flops / rate``: the
engine's per-module bookkeeping plus the arithmetic; attribution (forward + backward of a
partial graft) is ``attribution_ratio`` times the engine's forward over the same rows.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from weightgraft import atomic
from weightgraft.planning.costs import forward_flops
from weightgraft.resume.manifests import Json

__all__ = ["CALIBRATION_CONFIG", "Throughput", "calibration_key", "others_load", "throughput"]

# small enough for a few seconds on one CPU core, large enough that matmuls dominate
CALIBRATION_CONFIG: Json = {  # a llama's config.json
    "model_type": "llama", "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8192,
    "tie_word_embeddings": False, "max_position_embeddings": 512, "initializer_range": 0.02,
}


@dataclass(frozen=True)
class Throughput:
    """Measured rates of one (device, torch, dtype, threads)."""

    key: str
    flops_per_second: float
    seconds_per_module_call: float
    attribution_ratio: float
    measured_at: str
    busy: str = ""  # what else loaded this CPU while it was measured ("": nothing); such rates are never cached

    def batch_seconds(self, flops: float, module_calls: int) -> float:
        """Predicted wall time of one grafted forward batch."""
        return module_calls * self.seconds_per_module_call + flops / self.flops_per_second


def device_name(device: str) -> str:
    """The device's model name (the GPU's, else the CPU's from /proc/cpuinfo): what a rate or a sum order depends on."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def calibration_key(device: str, dtype: str) -> str:
    """What the measured rates depend on: device model, torch version, dtype, threads."""
    import torch

    threads = torch.get_num_threads() if not device.startswith("cuda") else 0
    return f"{device.split(':')[0]}|{device_name(device)}|torch {torch.__version__}|{dtype}|threads {threads}"


def _cache_file() -> Path:
    from weightgraft.models.embedded import cache_root

    return cache_root() / "plan" / "calibration.json"


def _system_cpu_seconds() -> float | None:
    """CPU seconds every process of this machine has used since boot (psutil's system CPU times,
    less idle and I/O wait; guest time is already in user time)."""
    import psutil

    t = psutil.cpu_times()
    spare = t.idle + getattr(t, "iowait", 0.0) + getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    return float(sum(t)) - spare


def _own_cpu_seconds() -> float:
    import os

    t = os.times()
    return t.user + t.system


BUSY_CORES = 0.5  # other processes' CPU use, in cores, above which a measured rate is not kept


def others_load(measure: Any) -> tuple[Any, float | None]:
    """Run ``measure()`` and say how many cores other processes used meanwhile (the machine's
    CPU time less this process's, over the wall time); None where that cannot be read."""
    wall0, sys0, own0 = time.perf_counter(), _system_cpu_seconds(), _own_cpu_seconds()
    result = measure()
    wall, sys1, own1 = time.perf_counter() - wall0, _system_cpu_seconds(), _own_cpu_seconds()
    if sys0 is None or sys1 is None or wall <= 0:
        return result, None
    return result, max(0.0, (sys1 - sys0) - (own1 - own0)) / wall


def throughput(device: str = "cpu", dtype: str = "float32", refresh: bool = False) -> Throughput:
    """The cached rates for this device and dtype, measured now if missing (a few seconds)."""
    key = calibration_key(device, dtype)
    path = _cache_file()
    cache: dict[str, Json] = {}  # calibration key -> Throughput's fields
    if path.is_file():
        try:
            cache = json.loads(path.read_text())
        except ValueError:
            cache = {}
    if key in cache and not refresh:
        return Throughput(**cache[key])
    measured, others = others_load(lambda: _measure(device, dtype, key))
    if device == "cpu" and others is not None and others > BUSY_CORES:
        # other work shared the cores: a rate several times too slow, used for this plan only
        import os

        return Throughput(**{**asdict(measured), "busy": f"other processes used {others:.1f} of {os.cpu_count()} cores"})
    cache[key] = asdict(measured)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, cache)
    return measured


def _median_time(fn: Any, device: str, repeats: int = 3) -> float:
    import torch

    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def module_calls(footprint: Any) -> int:
    """Grafted modules a forward pass dispatches (one per distinct module path of the slots)."""
    from weightgraft.engine.architectures import model_slots

    return len({part.path for slot in model_slots(footprint.meta) for part in slot.parts})


def _measure(device: str, dtype: str, key: str) -> Throughput:
    import tempfile

    import torch

    from weightgraft.engine.attribution import graft_attribution
    from weightgraft.engine.forward import graft_forward
    from weightgraft.engine.partial import PartialGraft
    from weightgraft.models.random_models import build_random_model
    from weightgraft.models.spec import parse_spec

    torch_dtype = getattr(torch, dtype)
    with tempfile.TemporaryDirectory(prefix="wg-calibrate-") as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(CALIBRATION_CONFIG))
        spec = f"random:{config}"
        models = [build_random_model(f"{spec}@{s}", torch_dtype)[0].to(device) for s in (0, 1)]
        footprint = parse_spec(spec).footprint()
    calls = module_calls(footprint)
    n_slots = len(footprint.slot_names)
    gen = torch.Generator().manual_seed(0)
    seq = 16

    def batch(rows: int) -> tuple[Any, Any, Any]:
        ids = torch.randint(0, CALIBRATION_CONFIG["vocab_size"], (rows, seq), generator=gen)
        source = torch.randint(0, 2, (rows, seq, n_slots), generator=gen)
        last = torch.full((rows, 1), seq - 1, dtype=torch.long)
        return ids.to(device), source.to(device), last.to(device)

    small, large = batch(4), batch(32)
    with torch.no_grad():
        graft_forward(models, small[0], small[1], logit_positions=small[2])  # warm-up
        t_small = _median_time(lambda: graft_forward(models, small[0], small[1], logit_positions=small[2]), device)
        t_large = _median_time(lambda: graft_forward(models, large[0], large[1], logit_positions=large[2]), device)
    f_small = forward_flops(footprint, 4 * seq, seq, 4)
    f_large = forward_flops(footprint, 32 * seq, seq, 32)
    rate = (f_large - f_small) / max(t_large - t_small, 1e-9)
    if rate <= 0 or t_large <= t_small:
        rate = f_large / t_large
    per_call = max(0.0, (t_small - f_small / rate) / calls)
    rate_model = Throughput(key, rate, per_call, 1.0, "")
    pair = PartialGraft(models[0], models[1])
    rows = 8
    ids, _, _ = batch(rows)
    pos = torch.full((rows,), seq - 1, dtype=torch.long)
    targets = torch.zeros(rows, dtype=torch.long)
    graft_attribution(pair, ids, pos, targets=targets)  # warm-up
    t_attr = _median_time(lambda: graft_attribution(pair, ids, pos, targets=targets), device)
    forward = rate_model.batch_seconds(forward_flops(footprint, rows * seq, seq, rows), calls)
    return Throughput(key, rate, per_call, t_attr / forward, time.strftime("%Y-%m-%dT%H:%M:%S"))
