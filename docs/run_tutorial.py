"""Run docs/tutorial.ipynb cell by cell in this process, as Jupyter would, without Jupyter.

    python docs/run_tutorial.py                 # on the demo pair (after `make demo`); outputs into the notebook
    python docs/run_tutorial.py --no-write      # run it, print each cell's output, leave the file alone
    python docs/run_tutorial.py PRE=... SFT=... # override the parameters cell (as papermill does)

The notebook's code cells run in order in one namespace; the cell tagged ``parameters`` is
followed by one that assigns the overrides (``NAME=VALUE``, each VALUE read as a Python literal
when it is one, else kept as a string). A cell's printed text and its last expression's value
(a DataFrame as its text table) become its outputs, text only. With ``--write`` (the default for
the demo pair) the notebook is rewritten with those outputs and, under ``metadata.weightgraft``,
when and on which machine it ran and how long each cell took. ``make docs`` runs it this way;
``tests/project/test_docs.py`` imports ``run_cells`` and runs every cell on tiny models.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

NOTEBOOK = Path(__file__).resolve().with_name("tutorial.ipynb")


def read_notebook(path: Path = NOTEBOOK) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _source(cell: Mapping[str, Any]) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _shown(value: Any) -> str:
    to_string = getattr(value, "to_string", None)  # a DataFrame or Series: its whole text table
    return to_string() if callable(to_string) else repr(value)


def run_cell(source: str, ns: dict[str, Any], name: str) -> tuple[str, str | None]:
    """Run one cell in ``ns``: (what it printed, its last expression's value as text or None)."""
    tree = ast.parse(source, filename=name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(tree, name, "exec"), ns)
        value = None if last is None else eval(compile(ast.Expression(last.value), name, "eval"), ns)
    return printed.getvalue(), (None if value is None else _shown(value))


def run_cells(notebook: Mapping[str, Any], overrides: Mapping[str, Any] | None = None,
              ns: dict[str, Any] | None = None, echo: bool = False) -> list[dict[str, Any]]:
    """Run every code cell in order; after the ``parameters`` cell, ``overrides`` are assigned.
    Returns one record per code cell: ``index``, ``stdout``, ``value``, ``seconds``. A failing
    cell raises with its index and source."""
    ns = {"__name__": "__main__"} if ns is None else ns
    records = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        start = time.perf_counter()
        try:
            stdout, value = run_cell(_source(cell), ns, f"tutorial.ipynb cell {index}")
        except Exception as exc:
            raise RuntimeError(f"tutorial.ipynb cell {index} failed: {exc!r}\n{_source(cell)}") from exc
        if "parameters" in cell.get("metadata", {}).get("tags", []) and overrides:
            ns.update(overrides)
        records.append({"index": index, "stdout": stdout, "value": value, "seconds": time.perf_counter() - start})
        if echo:
            print(f"--- cell {index} ({records[-1]['seconds']:.1f} s)\n{stdout}{value or ''}", flush=True)
    return records


def machine() -> str:
    """This machine in words: CPU model, cores, OS, Python and torch."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import torch

    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} thread(s), "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def with_outputs(notebook: dict[str, Any], records: list[dict[str, Any]], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The notebook with each code cell's text outputs and the run's record in its metadata."""
    by_index = {r["index"]: r for r in records}
    count = 0
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        count += 1
        record = by_index[index]
        outputs: list[dict[str, Any]] = []
        if record["stdout"]:
            outputs.append({"name": "stdout", "output_type": "stream", "text": record["stdout"].splitlines(keepends=True)})
        if record["value"] is not None:
            outputs.append({"data": {"text/plain": record["value"].splitlines(keepends=True)},
                            "execution_count": count, "metadata": {}, "output_type": "execute_result"})
        cell["outputs"], cell["execution_count"] = outputs, count
    notebook.setdefault("metadata", {})["weightgraft"] = {
        "executed": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "parameters": {k: str(v) for k, v in overrides.items()},
        "seconds_per_cell": {str(r["index"]): round(r["seconds"], 1) for r in records},
        "seconds": round(sum(r["seconds"] for r in records), 1),
    }
    return notebook


def _override(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    try:
        return name.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name.strip(), value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", metavar="NAME=VALUE", help="parameters cell overrides")
    ap.add_argument("--notebook", type=Path, default=NOTEBOOK)
    ap.add_argument("--no-write", dest="write", action="store_false", help="leave the notebook file alone")
    args = ap.parse_args(argv)
    overrides = dict(_override(o) for o in args.overrides)
    notebook = read_notebook(args.notebook)
    start = time.perf_counter()
    records = run_cells(notebook, overrides, echo=True)
    print(f"tutorial: {len(records)} code cells in {time.perf_counter() - start:.0f} s on {machine()}")
    if args.write:
        args.notebook.write_text(json.dumps(with_outputs(notebook, records, overrides), indent=1, ensure_ascii=False) + "\n",
                                 encoding="utf-8")
        print(f"outputs written into {args.notebook}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
