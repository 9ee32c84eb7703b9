"""``weightgraft upcycle``: a dense model made a mixture of experts (every expert a copy of its
MLP, a fresh router), saved as a standard transformers MoE folder."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def upcycle(
    model: str = typer.Option(..., "--model", "-m", help="The dense model: an embedded name (smollm2-135m), a folder "
                              "or any model spec of a Llama or Mistral model."),
    out: Path = typer.Option(..., "--out", help="A new folder for the MoE model (config, safetensors, tokenizer)."),
    experts: int = typer.Option(4, min=2, help="Experts per layer (copies of the dense MLP)."),
    top_k: int = typer.Option(2, "--top-k", min=2, help="Experts picked per position (the routing weights are "
                              "renormalised over them)."),
    seed: int = typer.Option(0, help="The router's seed."),
    router_std: float = typer.Option(None, help="The router's standard deviation (default: the model's "
                                     "initializer_range)."),
) -> None:
    """Sparse upcycling (Komatsuzaki et al., ICLR 2023): at initialisation the MoE computes the dense
    model's function (each picked expert is the same MLP); finetune it with `weightgraft train`."""
    from weightgraft.training.upcycle import Upcycling, upcycle_to_folder

    settings = Upcycling(experts=experts, top_k=top_k, seed=seed, router_std=router_std)  # refused in one line
    record = upcycle_to_folder(model, out, settings)
    console.print(f"{record['model_type']} model with {experts} experts per layer, top-{top_k}, router seed {seed}: "
                  f"{out} (the dense model's weights sha256 {record['dense_sha256'][:12]}..., in {out}/upcycle.json)")
