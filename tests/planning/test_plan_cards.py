"""A CUDA device's plan times come from its card's stated rates (the driver's name and memory
say which card), never from a small model's launch-bound rate (RESULTS.md, the GPU runs: that
rate predicted 316x and 634x the measured engine time on an H100)."""

from __future__ import annotations

import pytest

from weightgraft.planning import budget as budget_mod
from weightgraft.planning import timing
from weightgraft.planning.cards import CARDS, SUSTAINED_SHARE, card_of_device

MIB = 2**20


@pytest.mark.parametrize(("name", "mib", "expected"), [
    ("NVIDIA H100 80GB HBM3", 81559, "h100-80gb"),  # as the lent H100 reported itself
    ("NVIDIA H200", 143771, "h200-141gb"),
    ("NVIDIA A100-SXM4-80GB", 81920, "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"),
    ("NVIDIA L40S", 46068, "l40s-48gb"),
    ("NVIDIA GeForce RTX 4090", 24564, "rtx4090-24gb"),
    ("Tesla T4", 15360, None),
    ("NVIDIA A100-PCIE-40GB", 16000, None),  # the name matches, the memory does not: no guess
    ("NVIDIA GeForce RTX 4090 D", 49140, None),
])
def test_a_device_is_the_card_its_name_and_memory_say(name: str, mib: int, expected: str | None) -> None:
    found = card_of_device(name, mib * MIB)
    assert (found.name if found else None) == expected


def _cuda(monkeypatch: pytest.MonkeyPatch, name: str, mib: int) -> None:
    monkeypatch.setattr(budget_mod, "cuda_here", lambda: True)
    monkeypatch.setattr(timing, "_cuda_device", lambda device: (name, mib * MIB))


def test_a_known_gpu_plans_with_its_stated_rate_not_a_measured_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, "NVIDIA H100 80GB HBM3", 81559)
    monkeypatch.setattr("weightgraft.planning.calibration.throughput",
                        lambda *a, **k: pytest.fail("a GPU's rate is not measured on the calibration model"))
    rate, note = timing.rate_for("cuda", "bfloat16", None)
    assert rate is not None and rate.flops_per_second == pytest.approx(SUSTAINED_SHARE * CARDS["h100-80gb"].peak_flops["bfloat16"])
    assert note is not None and "NVIDIA H100 80GB SXM" in note


def test_an_unknown_gpu_gets_no_time_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, "Tesla T4", 15360)
    rate, note = timing.rate_for("cuda:0", "float32", None)
    assert rate is None and note is not None and "Tesla T4" in note and "--gpu" in note


def test_a_cpu_still_measures_its_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    from weightgraft.planning.calibration import Throughput

    seen: list[tuple[str, str]] = []
    measured = Throughput("cpu|test", 1e9, 1e-4, 1.5, "now")
    monkeypatch.setattr("weightgraft.planning.calibration.throughput", lambda d, t: seen.append((d, t)) or measured)
    assert timing.rate_for("cpu", "float32", None) == (measured, None)
    assert seen == [("cpu", "float32")]


def test_a_gpu_plan_adds_reading_the_weights_from_disk_and_over_the_host_link(
        tmp_path, tiny_model_dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40: a plan for a card counts the weights' trip (disk, then the card's host link) as
    parts of the time, at the stated rates; ``--disk-gbps`` names another disk; a CPU plan has
    no such part; a localize plan for a card counts its roles' bytes too."""
    import json

    from tiny_world import write_world
    from typer.testing import CliRunner

    from weightgraft.cli import app
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.plan import plan_experiment
    from weightgraft.localization.config import parse_localize_config
    from weightgraft.localization.run import plan_input
    from weightgraft.planning.errors import PlanError
    from weightgraft.planning.localize import plan_localize_work

    monkeypatch.setattr(budget_mod, "cuda_here", lambda: False)
    data = str(write_world(tmp_path / "data"))
    models = {"pre": str(tiny_model_dirs["pre"]), "sft": str(tiny_model_dirs["sft"])}
    raw = {"name": "planned", "data": data, "models": models, "schemes": [{"preset": "position"}],
           "out": str(tmp_path / "run"), "report": False, "device": "cuda"}
    h100 = CARDS["h100-80gb"]
    plan = plan_experiment(parse_config(raw), gpu=h100)
    held = sum(r.held_bytes for r in plan.roles)
    assert plan.time_parts["read weights from disk"] == pytest.approx(held / 2e9)
    assert plan.time_parts["copy weights to the card"] == pytest.approx(held / 64e9)
    assert plan.predicted_seconds == pytest.approx(sum(plan.time_parts.values()))
    assert any("disk at 2 GB/s (assumed" in n and "64 GB/s" in n for n in plan.notes)
    a100 = plan_experiment(parse_config(raw), gpu=CARDS["a100-80gb"])
    assert a100.time_parts["copy weights to the card"] == pytest.approx(held / 32e9)  # PCIe 4 against 5

    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps(raw))
    cli = CliRunner()
    fast = json.loads(cli.invoke(app, ["plan", str(path), "--gpu", "h100-80gb", "--disk-gbps", "4", "--json"]).output)
    assert fast["time_parts"]["read weights from disk"] == pytest.approx(held / 4e9)
    alone = cli.invoke(app, ["plan", str(path), "--disk-gbps", "4", "--memory", "80GiB"])
    assert isinstance(alone.exception, PlanError) and "--disk-gbps needs --gpu" in str(alone.exception)

    cpu = plan_experiment(parse_config({**raw, "device": "cpu"}))
    assert not any("weights" in part for part in cpu.time_parts)

    loc = parse_localize_config({"data": data, "models": models, "out": str(tmp_path / "loc"), "exact": "none",
                                 "search": {"enabled": False}, "claims": {"enabled": False}, "device": "cuda"})
    local = plan_localize_work(plan_input(loc), gpu=h100)
    assert local.time_parts["read weights from disk"] == pytest.approx(sum(r.held_bytes for r in local.roles) / 2e9)
