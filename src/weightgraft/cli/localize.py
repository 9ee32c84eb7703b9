"""``weightgraft localize``: cell maps and minimal graft sets of a model pair on a dataset."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def localize(
    config: Path = typer.Argument(..., help="Localize YAML (data, models.pre, models.sft: one model or a list, ...)."),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. limit=5 exact=none"),
    progress: bool = typer.Option(True, help="Print each stage as it finishes."),
) -> None:
    """Localize a finetuned behaviour cell by cell: attribution and exact maps, minimal sets."""
    from weightgraft.api.localize import localize as run_localize
    from weightgraft.localization import load_localize_config

    cfg = load_localize_config(config, overrides or [])
    result = run_localize(cfg, progress=progress)
    for entry in result.search.searches:
        held = entry.get("heldout_share")
        console.print(f"{entry['direction']:>11} / {entry['template']}: {entry['size']} cells carry "
                      + (f"{held:.0%} of the held-out prompts' effect, " if held is not None else "")
                      + f"{entry['share']:.0%} of the fit prompts'" + ("" if entry["reached"] else " (target not reached)"))
        refined = entry.get("refined")
        if refined:
            held = refined.get("heldout_share")
            console.print(f"{'':>11}   refined by exact marginal gain: {refined['size']} cells carry "
                          + (f"{held:.0%} held out, " if held is not None else "") + f"{refined['share']:.0%} fit")
        controls = entry.get("controls") or {}
        for kind in ("random", "matched"):
            stats = controls.get(kind) or {}
            if "mean" in stats:
                half = stats.get("heldout") or stats
                floor = 1 / (1 + controls.get("n_sets", 0))
                at_floor = half["p"] <= floor * (1 + 1e-9)
                console.print(f"{'':>11}   {kind} sets of {entry['size']} outside it ({'held out' if 'heldout' in stats else 'fit'}): "
                              f"mean {half['mean']:.0%}, p95 {half['p95']:.0%}, the set's p "
                              + (f"<= {floor:.3g} (the floor of {controls.get('n_sets', 0)} controls)" if at_floor
                                 else f"= {half['p']:.3g}"))
    if result.excluded:
        console.print(f"[yellow]{len(result.excluded)} prompt(s) excluded[/] (answer tokenizes to nothing)")
    if result.directions_note:
        console.print(result.directions_note)
    console.print(f"cells: {result.run_dir / 'cells.parquet'}")
    stability = result.run_dir / "stability.csv"
    if stability.is_file():
        import pandas as pd

        table = pd.read_csv(stability)
        over = {"sft": "SFT models", "sft_vs_null": "SFT vs null models", "null_vs_null": "null models", "template": "templates"}
        for kind, rows in table.groupby("kind", sort=False):
            console.print(f"stability over {over.get(kind, kind)}: {len(rows)} pair(s), "
                          f"Spearman of coarse maps {rows['spearman_coarse'].min():.2f}-{rows['spearman_coarse'].max():.2f}, "
                          f"top-k overlap {rows['top_overlap'].min():.2f}-{rows['top_overlap'].max():.2f}")
        nulls = result.run_dir / "stability_null.csv"
        summary = pd.read_csv(nulls) if nulls.is_file() else pd.DataFrame(columns=["n_null_pairs"])
        for r in summary[summary["n_null_pairs"] > 0].itertuples():
            console.print(f"seeds vs null, {r.template} / {r.direction}: Spearman {r.sft_spearman_mean:.2f} vs "
                          f"{r.null_spearman_mean:.2f}, top-k overlap {r.sft_overlap_mean:.2f} vs "
                          f"{r.null_overlap_mean:.2f} (means of {r.n_sft_pairs} and {r.n_null_pairs} pairs): {r.verdict}")
        console.print(f"stability: {stability}")
    claims = result.run_dir / "claims.csv"
    if claims.is_file():
        import pandas as pd

        from weightgraft.localization.claims import VERDICTS

        table = pd.read_csv(claims, keep_default_na=False, na_values=[""])
        for (setting, claim), rows in table.groupby(["setting", "claim"], sort=False):
            counts = rows["verdict"].value_counts()
            console.print(f"claim {claim} ({setting}): " + ", ".join(
                f"{v} {int(counts.get(v, 0))}" for v in VERDICTS if v in ("holds", "fails", "undecided") or counts.get(v, 0))
                + f" of {len(rows)} map(s), exact share {rows['share_exact'].min():.2f} to "
                f"{rows['share_exact'].max():.2f} (its null: {rows['null_mean'].min():.2f} to {rows['null_mean'].max():.2f})")
        console.print(f"claims: {claims}")
    if result.report is not None:
        console.print(f"report: {result.report}")
    else:
        console.print(f"no report (report: false); draw it later with weightgraft.report.localize.write_localize_report('{result.run_dir}')")
