"""The process entry (``weightgraft`` and ``python -m weightgraft``): OpenMP reads its wait
policy once, when torch loads, so the default is set here, before anything imports torch."""

from __future__ import annotations

import logging
import os

# Loggers of optional packages that transformers imports with its quantizers whenever torchao is
# installed (the `quant` and `test` extras): torchao's "Failed to load ... .so" for CUDA kernels a
# CPU build lacks, torch's note on torchao's enums, and bitsandbytes' search for a fused CPU kernel
# on CPUs with AVX512-BF16 ("Failed to load CPU gemm_4bit_forward from kernels-community ...
# pip install kernels": weightgraft keeps 4-bit layers off that kernel's path, so it is never
# needed). None of them is about the user's work.
QUIET_LOGGERS = ("torchao", "torch.utils._pytree", "bitsandbytes.backends.cpu.ops")


def main() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # waiting threads yield the core
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    from weightgraft.cli import main as cli_main

    cli_main()
