"""One device check for every command: a device that is not here is one line, the same words from
``run``, ``localize``, ``paper`` and ``train``, before any model loads."""

from __future__ import annotations

import pytest
import torch

from weightgraft.configfile import ConfigError
from weightgraft.devices import device_problem, require_device
from weightgraft.paper.settings import PaperError
from weightgraft.training.device import training_device
from weightgraft.training.errors import TrainingError

NO_CUDA = not torch.cuda.is_available()


def test_the_check_names_what_is_wrong() -> None:
    assert device_problem("cpu") is None
    assert device_problem("tpu") == "'tpu': use cpu, cuda, cuda:N or mps"
    assert device_problem("cuda:x") == "'cuda:x': write cuda or cuda:N"
    if NO_CUDA:
        assert "'cuda' is absent" in device_problem("cuda") and "'cuda:3' is absent" in device_problem("cuda:3")


@pytest.mark.parametrize("device", ["tpu", "cuda:x"] + (["cuda", "cuda:1"] if NO_CUDA else []))
def test_every_command_refuses_a_device_in_the_same_words(device: str) -> None:
    from weightgraft.experiments.config import parse_config
    from weightgraft.localization.config import parse_localize_config
    from weightgraft.planning.preflight import preflight

    said = device_problem(device)
    models = {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}
    configs = [parse_config({"data": "d", "models": models, "schemes": [{"preset": "position"}], "device": device}),
               parse_localize_config({"data": "d", "models": models, "device": device})]
    for config in configs:  # run's and localize's pre-load check
        with pytest.raises(ConfigError) as run:
            preflight(config, {}, {}, plan=lambda: pytest.fail("planned"), command="weightgraft run", batch_size=1)
    with pytest.raises(PaperError) as paper:
        require_device(device, PaperError, "--device ")  # as paper's check_inputs makes it
    assert str(run.value) == f"device={said}" and str(paper.value) == f"--device {said}"
    if device != "cuda:1":  # a finetune takes the first visible card: cuda:N is its own refusal
        with pytest.raises(TrainingError) as train:
            training_device(device)
        assert str(train.value) == f"device {said}"
    with pytest.raises(TrainingError, match="CUDA_VISIBLE_DEVICES=2"):
        training_device("cuda:2")
