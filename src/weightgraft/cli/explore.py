"""``weightgraft explore``: the local web app where a graft is painted and its answer watched."""

from __future__ import annotations

from pathlib import Path

import typer


def explore(
    model: list[str] = typer.Option([], "--model", "-m", help="ROLE=SPEC: pre=SPEC and sft=SPEC (more roles may be painted too; pre=demo:pre sft=demo: what `weightgraft demo` made)."),
    run: Path | None = typer.Option(None, "--run", help="A `weightgraft run` directory: its summary, figures and schemes."),
    localize: Path | None = typer.Option(None, "--localize", help="A `weightgraft localize` directory: cell maps and minimal sets."),
    experts: Path | None = typer.Option(None, "--experts", help="A `weightgraft experts` folder: its expert map, a click grafts an expert at a region."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port (0: any free one)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but loopback prints a warning."),
    device: str = typer.Option("cpu", "--device"),
) -> None:
    """Paint which model serves each position x layer x component cell and watch the top-k move."""
    roles: dict[str, str] = {}
    for item in model:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value:
            raise typer.BadParameter(f"--model {item!r} must look like ROLE=SPEC")
        roles[key.strip()] = value
    missing = [r for r in ("pre", "sft") if r not in roles]
    if missing:
        raise typer.BadParameter(f"give the models with -m pre=SPEC -m sft=SPEC (missing: {', '.join(missing)})")
    for flag, path in (("--run", run), ("--localize", localize), ("--experts", experts)):
        if path is not None and not path.is_dir():
            raise typer.BadParameter(f"{flag} {path}: not a directory")
    from weightgraft.models.spec import refuse_random

    refuse_random(roles, "weightgraft explore")  # no tokenizer: one line, before loading

    import importlib.util

    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise typer.BadParameter("explore serves its page with starlette and uvicorn: pip install "
                                 "'weightgraft[explore]' (the README's `make` commands install it)")
    from weightgraft.explore.app import create_app
    from weightgraft.explore.artifacts import LocalizeView, RunView
    from weightgraft.explore.expert_view import ExpertMapView
    from weightgraft.explore.opening import opening_example
    from weightgraft.explore.serve import pick_port, serve
    from weightgraft.explore.session import Explorer
    from weightgraft.models import load_model
    from weightgraft.models.tokenization import check_same_tokenizer

    run_view = RunView(run) if run is not None else None  # read before the models load
    localize_view = LocalizeView(localize) if localize is not None else None
    experts_view = ExpertMapView(experts) if experts is not None else None
    opening = opening_example(run, roles["sft"])  # a fact the SFT knows, and where it came from
    typer.echo(opening.line())
    loaded = {role: load_model(spec, device=device) for role, spec in roles.items()}
    for role, lm in loaded.items():
        check_same_tokenizer(loaded["pre"].tokenizer, lm.tokenizer, f"model {role!r}")
    explorer = Explorer({r: lm.model for r, lm in loaded.items()}, loaded["pre"].tokenizer)
    if experts_view is not None:  # the map's models against explore's roles of the same names
        experts_view.compare_weights({r: lm.weights_sha256 for r, lm in loaded.items()})
        for label, said in experts_view.weights.items():
            typer.echo(f"expert map {experts_view.name}: {label} has {said}")
    port = pick_port(host, port)
    serve(create_app(explorer, run_view, localize_view, address=(host, port), opening=opening, experts=experts_view),
          host=host, port=port)
