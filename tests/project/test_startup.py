"""Light commands start light: the CLI's import and ``--help`` do not import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # `make check` leaves these out: a fresh interpreter, over 1 s


def test_cli_import_and_help_do_not_import_torch():
    code = (
        "import sys\n"
        "from weightgraft.cli import app\n"
        "from typer.testing import CliRunner\n"
        "for args in (['--help'], ['data', '--help'], ['train', '--help'], ['run', '--help']):\n"
        "    out = CliRunner().invoke(app, args)\n"
        "    assert out.exit_code == 0, (args, out.output)\n"
        "heavy = [m for m in ('torch', 'transformers', 'pandas', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import weightgraft.models, weightgraft.training\n"
        "assert 'torch' not in sys.modules\n"
        "from weightgraft.models import load_model\n"  # the lazy names still resolve
        "from weightgraft.training import finetune, PRESETS\n"
        "assert type(finetune).__name__ == 'function' and 'paper-aggressive' in PRESETS\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
